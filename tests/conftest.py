"""Suite-wide test settings and fixtures shared by several test packages."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis' default 200 ms deadline per example measures the machine, not the code: the suite
# runs on machines shared with other work, where one example took 263 ms once and 0.5 ms again.
settings.register_profile("shared_machine", deadline=None)
settings.load_profile("shared_machine")


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
