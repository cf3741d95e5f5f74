"""Access to the real crash corpus in ``fixtures/crash_logs`` for tests.

Each case folder holds what a real run left behind plus ``case.json`` (see the corpus README).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "crash_logs"

VERDICTS = {"gpu_oom", "host_oom", "config_error", "other_failure", "no_failure", "unknown"}
DIAGNOSES = {
    "fragmentation",
    "prefetch_overshoot",
    "pinned_memory_exhaustion",
    "accumulation_mismatch",
    "activation_memory",
    "model_states_too_large",
    "memory_leak",
    "other_process",
    "eval_or_generation",
    "checkpoint_save_gather",
    "host_oom_killed",
    "not_oom",
}


def case_names() -> list[str]:
    """Every case in the corpus, sorted (folders starting with ``_`` hold the generators)."""
    return sorted(p.name for p in CORPUS_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))


def case_dir(name: str) -> Path:
    return CORPUS_DIR / name


def manifest(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((CORPUS_DIR / name / "case.json").read_text())
    return result
