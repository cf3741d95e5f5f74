"""Every crash-corpus case gives the same report as its golden files, in every format.

The golden files are what oomlens printed when they were last written (``python -m
tests.golden --update``); a refactoring must leave them unchanged, and a deliberate change of a
report rewrites them in the same commit, where the diff shows it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os

import pytest

from tests.golden._outputs import GOLDEN_DIR, cases, golden_outputs, stored_files


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_validates_as_when_written() -> None:
    # The golden reports were written with DeepSpeed installed: configs are validated by its
    # own models, whose messages are part of the reports.
    if importlib.util.find_spec("deepspeed") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must run the golden reports with the deepspeed extra")
        pytest.skip("the golden reports need the deepspeed extra (scripts/test.sh installs it)")


def _diff(old: str, new: str, limit: int = 60) -> str:
    lines = list(
        difflib.unified_diff(old.splitlines(), new.splitlines(), "golden", "now", lineterm="")
    )
    more = f"\n... {len(lines) - limit} more diff lines" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


@pytest.mark.parametrize("case", cases())
def test_the_case_reports_as_its_golden_files(case: str) -> None:
    failures = []
    for relative, produce in golden_outputs(case):
        path = GOLDEN_DIR / relative
        assert path.exists(), f"{relative} has no golden file: python -m tests.golden --update"
        expected = path.read_text(encoding="utf-8")
        actual = produce()
        if actual != expected:
            failures.append(f"{relative}:\n{_diff(expected, actual)}")
    assert not failures, (
        "reports differ from the golden files (python -m tests.golden --update rewrites them "
        "when the change is deliberate):\n\n" + "\n\n".join(failures)
    )


def test_no_golden_file_is_left_without_its_case() -> None:
    produced = {relative for case in cases() for relative, _ in golden_outputs(case)}
    assert stored_files() <= produced, sorted(stored_files() - produced)
