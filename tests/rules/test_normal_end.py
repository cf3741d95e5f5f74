"""'No failure' needs positive evidence that the run ended; the scheduler's end is a failure.

A log that stops mid-run without an error or an end, a text of any size with nothing in it,
and a log whose last lines are Slurm's own (a cancellation for the time limit, a preemption,
a node failure; srun's "Exited with exit code") never read as a healthy run.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from oomlens.diagnosis import Verdict
from oomlens.session import analyze
from tests._corpus import case_dir


def _healthy_run() -> list[str]:
    # memory_leak_fixed: a real DeepSpeed run that trains 30 steps and exits successfully
    return (case_dir("memory_leak_fixed") / "train.log").read_text().splitlines()


def _cut_mid_run() -> list[str]:
    lines = _healthy_run()
    steps = [i for i, ln in enumerate(lines) if "loss" in ln.lower() and "step" in ln.lower()]
    return lines[: steps[len(steps) // 3] + 1]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_whole_healthy_run_is_no_failure(tmp_path: Path) -> None:
    report = analyze([_write(tmp_path, _healthy_run())])
    assert report.verdict is Verdict.NO_FAILURE
    assert "exits successfully" in report.verdict_reason


def test_a_log_that_stops_mid_run_is_unknown_and_says_where(tmp_path: Path) -> None:
    report = analyze([_write(tmp_path, _cut_mid_run())])
    assert report.verdict is Verdict.UNKNOWN
    assert report.verdict_reason.startswith("the log stops at step ")


def test_a_long_log_that_stops_mid_run_is_unknown(tmp_path: Path) -> None:
    # over 1 MiB (read in bulk, not line by line): its size says nothing of how it ended
    head = _cut_mid_run()
    steps = [ln for ln in head if "loss" in ln.lower()]
    body = head + steps * (1_200_000 // len("\n".join(steps)) + 1)
    path = _write(tmp_path, body)
    assert path.stat().st_size > 1 << 20
    assert analyze([path]).verdict is Verdict.UNKNOWN


@pytest.mark.parametrize("size", [200_000, 2_000_000])
def test_text_without_a_run_is_unknown_at_any_size(tmp_path: Path, size: int) -> None:
    rng = random.Random(size)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)
    ]
    lines, total = [], 0
    while total < size:
        lines.append(" ".join(rng.choices(words, k=11)))
        total += len(lines[-1]) + 1
    assert analyze([_write(tmp_path, lines)]).verdict is Verdict.UNKNOWN


_NODE = "gpu-h100-042"
_SLURM_ENDS = {
    "time limit": (
        f"slurmstepd: error: *** JOB 93811 ON {_NODE} CANCELLED AT 2025-03-14T07:00:12 "
        "DUE TO TIME LIMIT ***",
        "its time limit",
    ),
    "preemption": (
        f"slurmstepd: error: *** STEP 93811.0 ON {_NODE} CANCELLED AT 2025-03-14T07:00:12 "
        "DUE TO PREEMPTION ***",
        "preemption",
    ),
    "node failure": (
        f"slurmstepd: error: *** JOB 93811 ON {_NODE} CANCELLED AT 2025-03-14T07:00:12 "
        "DUE TO NODE FAILURE ***",
        "a node failure",
    ),
}


@pytest.mark.parametrize("name", sorted(_SLURM_ENDS))
def test_the_schedulers_cancellation_is_a_failure_with_its_reason(
    tmp_path: Path, name: str
) -> None:
    line, reason = _SLURM_ENDS[name]
    report = analyze([_write(tmp_path, [*_cut_mid_run(), line])])
    assert report.verdict is Verdict.OTHER_FAILURE
    assert f"because of {reason}" in report.verdict_reason


def test_an_srun_task_exit_is_never_no_failure(tmp_path: Path) -> None:
    lines = [
        *_cut_mid_run(),
        f"srun: error: {_NODE}: task 5: Exited with exit code 1",
        f"srun: error: {_NODE}: tasks 0-4,6-7: Terminated",
    ]
    report = analyze([_write(tmp_path, lines)])
    assert report.verdict is Verdict.UNKNOWN  # exit 1: an error printed elsewhere
    assert "exited with code 1" in report.verdict_reason
