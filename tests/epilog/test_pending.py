"""The sweeper's work list: jobs whose Epilog timed out or deferred a big snapshot."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomlens.epilog.analysis import EpilogAnalysis
from oomlens.epilog.pending import SWEEP_MARKER, pending_jobs, unrecorded_jobs
from oomlens.epilog.runner import run_epilog


def _quick(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    return EpilogAnalysis(report={"verdict": "gpu_oom"}, html=None, verdict="gpu_oom")


def _stuck(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    time.sleep(3600)
    raise AssertionError("unreachable")


def _epilog(tmp_path: Path, job_id: str, analyzer: Any, settings: str = "") -> None:
    work = tmp_path / f"work{job_id}"
    work.mkdir()
    (work / f"slurm-{job_id}.out").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    if "max_snapshot_bytes" in settings:
        (work / "snapshot_rank0.pickle").write_bytes(b"\x80\x04" + b"\x00" * 8192)
    (tmp_path / "epilog.toml").write_text(settings)
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": str(os.geteuid()),
        "SLURM_JOB_GID": str(os.getegid()),
        "SLURM_JOB_EXIT_CODE": "256",
        "SLURM_JOB_WORK_DIR": str(work),
    }
    run_epilog(
        env,
        settings_path=tmp_path / "epilog.toml",
        spool_override=tmp_path / "spool",
        analyzer=analyzer,
    )


def test_unfinished_and_deferred_jobs_are_pending(tmp_path: Path) -> None:
    # GIVEN three handled jobs: one finished, one timed out, one with a deferred snapshot
    _epilog(tmp_path, "7", _quick)
    # (a budget that leaves the child time to report its inputs even on a loaded machine)
    _epilog(tmp_path, "8", _stuck, "budget_seconds = 8\n")
    _epilog(tmp_path, "10", _quick, 'max_snapshot_bytes = "4 KiB"\n')
    # WHEN
    pending = pending_jobs(tmp_path / "spool")
    # THEN the last two are the sweeper's work, in job order, with every input to analyze
    assert [(job.job_id, job.status) for job in pending] == [("8", "timed_out"), ("10", "analyzed")]
    assert pending[0].paths == (str(tmp_path / "work8" / "slurm-8.out"),)
    assert pending[0].uid == os.geteuid() and pending[0].gid == os.getegid()
    assert pending[1].deferred == (str(tmp_path / "work10" / "snapshot_rank0.pickle"),)
    assert pending[1].paths == (
        str(tmp_path / "work10" / "slurm-10.out"),
        str(tmp_path / "work10" / "snapshot_rank0.pickle"),
    )
    # AND a job a sweeper has marked leaves the list
    (pending[0].job_dir / SWEEP_MARKER).write_text("{}")
    assert [job.job_id for job in pending_jobs(tmp_path / "spool")] == ["10"]


def test_unreadable_records_are_skipped(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "3").mkdir(parents=True)
    (spool / "3" / "epilog.json").write_text("{not json")
    (spool / "4").mkdir()
    (spool / "4" / "epilog.json").write_text('["a list"]')
    (spool / "epilog.log").write_text("")
    assert pending_jobs(spool) == []
    assert pending_jobs(tmp_path / "absent") == []


def test_job_directories_without_a_usable_record_are_unrecorded(tmp_path: Path) -> None:
    # GIVEN job directories an Epilog left without a readable epilog.json long ago, one it
    # may still be writing, one that was swept, and one in order
    spool = tmp_path / "spool"
    for name, record in [("3", None), ("4", "{not json"), ("5", None), ("6", None), ("7", "{}")]:
        (spool / name).mkdir(parents=True)
        if record is not None:
            (spool / name / "epilog.json").write_text(record)
    (spool / "6" / SWEEP_MARKER).write_text("{}")
    (spool / "epilog.log").write_text("")
    for name in ("3", "4", "6", "7"):
        os.utime(spool / name, (time.time() - 3600, time.time() - 3600))
    # WHEN
    unrecorded = unrecorded_jobs(spool, settled_seconds=60)
    # THEN the first two are listed, with what is wrong
    assert [(job.job_dir.name, job.problem) for job in unrecorded] == [
        ("3", "epilog.json: missing"),
        ("4", "epilog.json: not valid JSON"),
    ]
    assert unrecorded_jobs(tmp_path / "absent", settled_seconds=60) == []
