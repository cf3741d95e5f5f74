"""torchrun's failure table (``ChildFailedError``) whose ``traceback :`` field holds a Python
traceback cut before its exception line: the worker's error is not in the text, so no line of
the cut traceback stands for it (it would read as a failure "with no memory error")."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.ingest.log import read_log
from oomlens.session import analyze

CRASHES = Path(__file__).resolve().parents[3] / "fixtures" / "crash_logs"


def _table_with_traceback(cut_after: int) -> list[str]:
    """device_side_assert's real failure table, its root cause's ``traceback :`` field holding
    the first ``cut_after`` lines of activation_memory's real rank-0 traceback, and its exit
    code the plain 1 a Python exception gives (not the SIGABRT of the assert)."""
    table = (CRASHES / "device_side_assert" / "train.log").read_text().splitlines()
    start = next(i for i, ln in enumerate(table) if ln.rstrip().endswith("FAILED"))
    table = table[start - 1 :]
    root = next(i for i, ln in enumerate(table) if ln.startswith("Root Cause"))
    field = next(i for i in range(root, len(table)) if "traceback :" in table[i])
    frames = [
        ln.split("]: ", 1)[1]
        for ln in (CRASHES / "activation_memory" / "train.log").read_text().splitlines()
        if ln.startswith("[rank0]: ")
    ]
    quoted = ["  traceback : " + frames[0], *("    " + ln for ln in frames[1:cut_after])]
    table = [
        ln.replace("exitcode  : -6 ", "exitcode  : 1 ") if i > root else ln
        for i, ln in enumerate(table)
    ]
    return table[:field] + quoted + table[field + 1 :]


@pytest.mark.parametrize("cut_after", [2, 3, 6])
def test_a_traceback_field_cut_inside_a_frame_holds_no_error(
    tmp_path: Path, cut_after: int
) -> None:
    log = tmp_path / "console.log"
    log.write_text("\n".join(_table_with_traceback(cut_after)) + "\n")
    failures = [f for f in read_log(log).process_failures if f.origin == "torchrun_summary"]
    root = next(f for f in failures if f.root_cause)
    assert root.exitcode == 1
    assert root.message is None
    report = analyze([log])
    assert report.verdict.value == "unknown", report.verdict_reason


def test_a_complete_traceback_field_keeps_its_exception_line(tmp_path: Path) -> None:
    whole = _table_with_traceback(10_000)
    log = tmp_path / "console.log"
    log.write_text("\n".join(whole) + "\n")
    root = next(f for f in read_log(log).process_failures if f.root_cause)
    assert root.message is not None and "OutOfMemoryError" in root.message
