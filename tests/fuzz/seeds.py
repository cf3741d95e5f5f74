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
