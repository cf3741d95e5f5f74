"""The real files mutations start from, by input kind: what torch, DeepSpeed, the kernel and
torchelastic really wrote (the crash corpus, the field logs, the test assets)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fixtures" / "crash_logs"
FIELD = ROOT / "fixtures" / "field_logs"
ASSETS = ROOT / "tests" / "assets"

MAX_SEED_BYTES = 2 * 1024 * 1024


def _small(paths: list[Path]) -> tuple[Path, ...]:
    return tuple(sorted(p for p in paths if p.is_file() and p.stat().st_size <= MAX_SEED_BYTES))


@cache
def logs() -> tuple[Path, ...]:
    """Training logs: the corpus' (merged and per rank), the field logs, the lab log."""
    found = [p for p in CORPUS.rglob("*.log") if p.name not in ("kernel.log",)]
    found += list(FIELD.glob("*/paste.txt"))
    found.append(ASSETS / "logs" / "lab_log_torch2.11_h200.txt")
    return _small(found)


@cache
def configs() -> tuple[Path, ...]:
    """ds_config files: the corpus runs' and the public ones in the test assets."""
    found = list(CORPUS.glob("*/ds_config.json")) + list((ASSETS / "ds_configs").glob("*.json"))
    found += list(FIELD.glob("*/ds_config.json"))
    return _small(found)


@cache
def kernel_logs() -> tuple[Path, ...]:
    """Kernel logs the corpus runs left (dmesg of the host OOM kills)."""
    return _small(list(CORPUS.glob("*/kernel.log")))


@cache
def error_files() -> tuple[Path, ...]:
    """torchelastic error files (the lab run's, written by ``@record``)."""
    return _small([ASSETS / "logs" / "torchelastic_error_file_example.json"])


@cache
def snapshots() -> tuple[Path, ...]:
    """Snapshot pickles torch 2.11 wrote on the corpus runs and the lab."""
    found = list(CORPUS.glob("*/*.pickle")) + list((ASSETS / "snapshots").glob("*.pickle"))
    return _small(found)


@cache
def runs() -> tuple[Path, ...]:
    """Corpus run directories (a log, maybe configs, snapshots, kernel logs)."""
    return tuple(sorted(p.parent for p in CORPUS.glob("*/case.json")))


FAILURES = frozenset({"gpu_oom", "host_oom", "config_error", "other_failure"})
"""Verdicts that say the run failed."""


def _label(case: Path) -> str:
    import json

    doc = json.loads(case.read_text())
    return str((doc.get("expected") or doc.get("label") or {}).get("verdict", ""))


@cache
def labelled_logs() -> tuple[tuple[Path, str], ...]:
    """Whole logs with their known verdict: each corpus run's ``train.log`` (its
    ``expected`` verdict) and each field paste (its ``label``)."""
    found = [(c.parent / "train.log", _label(c)) for c in CORPUS.glob("*/case.json")]
    found += [(c.parent / "paste.txt", _label(c)) for c in FIELD.glob("*/case.json")]
    return tuple(
        sorted((p, v) for p, v in found if p.is_file() and p.stat().st_size <= MAX_SEED_BYTES)
    )


@cache
def failure_logs() -> tuple[Path, ...]:
    """Logs of runs that failed (by their label)."""
    return tuple(p for p, verdict in labelled_logs() if verdict in FAILURES)


@cache
def oom_logs() -> tuple[Path, ...]:
    """Logs of runs that ran out of GPU or host memory (by their label)."""
    return tuple(p for p, verdict in labelled_logs() if verdict in ("gpu_oom", "host_oom"))


@cache
def healthy_runs() -> tuple[Path, ...]:
    """Corpus runs that did not fail (``expected`` verdict ``no_failure``)."""
    return tuple(r for r in runs() if _label(r / "case.json") == "no_failure")


@cache
def captured_runs() -> tuple[Path, ...]:
    """Corpus runs that left a capture directory (``oomlens-capture/<run>/``)."""
    return tuple(r for r in runs() if (r / "oomlens-capture").is_dir())
