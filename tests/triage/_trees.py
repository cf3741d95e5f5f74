"""Trees of runs for the triage tests, made of copies of the real corpus' case folders."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests._corpus import case_dir, case_names, manifest

BASE_TIME = 1_795_000_000
"""File times of the copies: one run a minute after the other, so newest-first is defined."""

COPIED_TWICE = ("prefetch_overshoot", "fragmentation", "nccl_timeout")
"""Cases that appear more than once in ``corpus_tree`` (the same failure in several runs)."""


def copy_case(name: str, dest: Path, *, moment: int) -> Path:
    """``dest``: a copy of case ``name`` whose files all carry the time ``moment``."""
    shutil.copytree(case_dir(name), dest, copy_function=shutil.copyfile)
    for path in [dest, *dest.rglob("*")]:
        os.utime(path, (moment, moment))
    return dest


def corpus_tree(root: Path) -> dict[str, str]:
    """Every corpus case under ``root/cases/``, plus copies of a few under
    ``root/2026-12-01/<case>-copy/``.  Returns run name -> case name."""
    runs: dict[str, str] = {}
    for n, case in enumerate(case_names()):
        copy_case(case, root / "cases" / case, moment=BASE_TIME + 60 * n)
        runs[f"cases/{case}"] = case
    for n, case in enumerate(COPIED_TWICE):
        copy_case(case, root / "2026-12-01" / f"{case}-copy", moment=BASE_TIME + 86400 + 60 * n)
        runs[f"2026-12-01/{case}-copy"] = case
    return runs


def expected(case: str) -> dict[str, object]:
    result: dict[str, object] = manifest(case)["expected"]
    return result
