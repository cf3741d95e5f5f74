"""Fixtures shared by several test packages."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def real_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A capture directory written by a real ``python -m oomlens.capture`` run of a CPU training
    loop that dies of an exception (named as a SLURM job's: ``slurm-41``)."""
    pytest.importorskip("torch")
    from tests.capture._run import captured

    work = tmp_path_factory.mktemp("real-capture")
    result = captured(
        work,
        "--steps",
        "6",
        "--fail",
        OOMLENS_CAPTURE_DIR=str(work / "oomlens-capture"),
        SLURM_JOB_ID="41",
    )
    assert result.returncode == 1, result.stderr
    run = work / "oomlens-capture" / "slurm-41"
    assert (run / "rank0.events.jsonl").exists()
    return run
