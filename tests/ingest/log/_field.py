"""Real pastes of the field corpus (``fixtures/field_logs``) for the reading tests: only cases
of the development split or unlabelled ones (the held-back test split is never read here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIELD = Path(__file__).resolve().parents[3] / "fixtures" / "field_logs"
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def paste(case: str) -> str:
    assert case not in held_back(), f"{case} is in the held-back test split"
    return (FIELD / case / "paste.txt").read_text(encoding="utf-8", errors="replace")


def paste_path(case: str) -> Path:
    assert case not in held_back(), f"{case} is in the held-back test split"
    return FIELD / case / "paste.txt"


def manifest(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIELD / case / "case.json").read_text())
    return data


def held_back() -> set[str]:
    return set(json.loads((FIELD / "split.json").read_text())["test"])


def printed(size: str) -> int:
    """``"978.00 MiB"`` -> bytes, as the message means it (independent of oomlens' units)."""
    number, unit = size.replace("\u00a0", " ").split()
    return round(float(number) * _UNITS[unit])


def expected_numbers(case: str) -> dict[str, int]:
    """The case's ``oom_numbers`` in bytes (``device`` as printed)."""
    numbers = manifest(case)["oom_numbers"]
    return {k: (v if k == "device" else printed(v)) for k, v in numbers.items()}


def line_with(case: str, needle: str) -> str:
    return next(line for line in paste(case).splitlines() if needle in line)
