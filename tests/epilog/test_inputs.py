"""Which files of a job the Epilog analyzes, and how huge ones are bounded."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from oomlens.epilog.environment import parse_job_environment
from oomlens.epilog.inputs import InputPlan, plan_inputs, shorten_log
from oomlens.epilog.settings import EpilogSettings
from tests._corpus import case_dir

NOW = time.time()


def _job(work_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_EXIT_CODE": "256",
        "SLURM_JOB_WORK_DIR": str(work_dir),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURMD_NODENAME": "n1",
        "SLURM_NODELIST": "n1",
    }
    env.update(extra)
    return env


def _plan(
    env: dict[str, str], settings: EpilogSettings | None = None, scratch: Path | None = None
) -> InputPlan:
    return plan_inputs(
        parse_job_environment(env),
        settings or EpilogSettings(),
        now=time.time(),
        scratch_dir=None if scratch is None else str(scratch),
        hostname="n1",
    )


def test_stderr_stdout_and_workdir_snapshot(tmp_path: Path) -> None:
    # GIVEN a job that left the other_process crash: log, snapshot, an unrelated old pickle
    case = case_dir("other_process")
    shutil.copy(case / "train.log", tmp_path / "run.41.err")
    (tmp_path / "run.41.out").write_text("step 1\n")
    shutil.copy(case / "snapshot_rank0.pickle", tmp_path / "snapshot_rank0.pickle")
    old = tmp_path / "last_week.pickle"
    old.write_bytes(b"x")
    os.utime(old, (NOW - 8 * 86400, NOW - 8 * 86400))
    (tmp_path / "model.pt").write_bytes(b"not wanted")
    env = _job(
        tmp_path,
        SLURM_JOB_STDERR=str(tmp_path / "run.%j.err"),
        SLURM_JOB_STDOUT=str(tmp_path / "run.%j.out"),
    )
    # WHEN
    plan = _plan(env)
    # THEN
    assert [(Path(i.path).name, i.role) for i in plan.inputs] == [
        ("run.41.err", "stderr"),
        ("run.41.out", "stdout"),
        ("snapshot_rank0.pickle", "workdir"),
    ]
    assert plan.analysis_paths == [i.path for i in plan.inputs]
    assert plan.deferred == () and plan.notes == ()


def test_default_output_file_holds_both_streams(tmp_path: Path) -> None:
    (tmp_path / "slurm-41.out").write_text("CUDA out of memory\n")
    plan = _plan(_job(tmp_path))
    assert [(Path(i.path).name, i.role) for i in plan.inputs] == [("slurm-41.out", "stdout+stderr")]


def test_same_file_for_both_streams_is_analyzed_once(tmp_path: Path) -> None:
    (tmp_path / "all.41.log").write_text("x\n")
    pattern = str(tmp_path / "all.%j.log")
    plan = _plan(_job(tmp_path, SLURM_JOB_STDERR=pattern, SLURM_JOB_STDOUT=pattern))
    assert len(plan.inputs) == 1


def test_missing_output_is_a_note(tmp_path: Path) -> None:
    plan = _plan(_job(tmp_path, SLURM_JOB_STDOUT=str(tmp_path / "gone.%j")))
    assert plan.inputs == ()
    assert plan.notes[0].startswith("stdout+stderr: not found")
    assert "gone.41" in plan.notes[0]


def test_big_snapshot_is_deferred_and_old_or_unmatched_files_ignored(tmp_path: Path) -> None:
    (tmp_path / "slurm-41.out").write_text("x\n")
    (tmp_path / "snapshot_rank0.pickle").write_bytes(b"\x80\x04" + b"\x00" * 4096)
    (tmp_path / "ds_config.json").write_text("{}")
    settings = EpilogSettings(max_snapshot_bytes=1024)
    plan = _plan(_job(tmp_path), settings)
    assert [Path(i.path).name for i in plan.inputs] == ["slurm-41.out", "ds_config.json"]
    (deferred,) = plan.deferred
    assert deferred.path.endswith("snapshot_rank0.pickle") and deferred.size == 4098
    assert "max_snapshot_bytes" in deferred.reason


def test_workdir_files_are_capped_newest_first(tmp_path: Path) -> None:
    for index in range(6):
        path = tmp_path / f"snap{index}.pickle"
        path.write_bytes(b"x")
        os.utime(path, (NOW - 100 + index, NOW - 100 + index))
    plan = _plan(_job(tmp_path), EpilogSettings(workdir_max_files=2))
    assert sorted(Path(i.path).name for i in plan.inputs) == ["snap4.pickle", "snap5.pickle"]
    assert any("6 matching files" in note for note in plan.notes)


def test_workdir_listing_is_bounded(tmp_path: Path) -> None:
    for index in range(30):
        (tmp_path / f"f{index}.txt").write_text("x")
    plan = _plan(_job(tmp_path), EpilogSettings(workdir_max_entries=10))
    assert any("listed only its first 10 entries" in note for note in plan.notes)


def test_fifo_and_device_links_are_never_opened(tmp_path: Path) -> None:
    # A FIFO named like the job's output would block a reader forever.
    os.mkfifo(tmp_path / "slurm-41.out")
    os.symlink("/dev/zero", tmp_path / "snapshot.pickle")
    os.mkfifo(tmp_path / "ds_config.json")
    plan = _plan(_job(tmp_path))
    assert plan.inputs == ()
    assert "not a regular file" in plan.notes[0]


def test_unlistable_work_dir_is_a_note(tmp_path: Path) -> None:
    plan = _plan(_job(tmp_path / "nope"))
    assert any("cannot list the work directory" in note for note in plan.notes)


def test_huge_log_is_read_through_a_shortened_copy(tmp_path: Path) -> None:
    # GIVEN a 6 MiB log whose crash is at its very end (built from the corpus log)
    crash = (case_dir("other_process") / "train.log").read_bytes()
    filler = b"".join(b"step %d loss 2.0\n" % i for i in range(400_000))[: 6 * 1024**2]
    log = tmp_path / "slurm-41.out"
    log.write_bytes(crash[:200] + filler + crash)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # WHEN it is planned with max_log_bytes = 1 MiB
    plan = _plan(_job(tmp_path), EpilogSettings(max_log_bytes=1024**2), scratch)
    # THEN the analysis reads a copy: the head, a marker, the tail with the whole crash
    (item,) = plan.inputs
    assert item.path == str(log) and item.analyzed_path != item.path
    copy = Path(item.analyzed_path).read_bytes()
    assert len(copy) <= 1024**2 + 200
    assert copy.startswith(crash[:200])
    assert copy.endswith(crash)
    assert b"\n[oomlens epilog: " in copy
    assert "were not read" in item.note


def test_huge_log_without_scratch_space_is_deferred(tmp_path: Path) -> None:
    (tmp_path / "slurm-41.out").write_bytes(b"x\n" * 4096)
    plan = _plan(_job(tmp_path), EpilogSettings(max_log_bytes=1024))
    assert plan.inputs == () and len(plan.deferred) == 1


def test_shorten_cuts_at_line_breaks(tmp_path: Path) -> None:
    source = tmp_path / "log"
    source.write_bytes(b"".join(b"line %05d\n" % i for i in range(10_000)))
    copy, skipped = shorten_log(str(source), str(tmp_path / "out"), 8000)
    lines = Path(copy).read_bytes().split(b"\n")
    assert lines[0] == b"line 00000"
    assert lines[-2] == b"line 09999"
    marker = [line for line in lines if line.startswith(b"[oomlens epilog")]
    assert marker == [
        f"[oomlens epilog: {skipped} bytes of this 110000-byte file left out here]".encode()
    ]
    kept = [line for line in lines if line.startswith(b"line ")]
    assert all(len(line) == 10 for line in kept)  # no line was cut in the middle
    assert len(b"\n".join(kept)) + skipped == pytest.approx(110_000, abs=20)


def test_shorten_a_sparse_multi_gigabyte_file_quickly(tmp_path: Path) -> None:
    # A 3 GiB file (sparse: no disk used) is shortened by reading only its ends.
    source = tmp_path / "huge.err"
    with open(source, "wb") as handle:
        handle.write(b"head line\n")
        handle.truncate(3 * 1024**3)
        handle.seek(0, os.SEEK_END)
        handle.write(b"\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    started = time.monotonic()
    copy, skipped = shorten_log(str(source), str(tmp_path / "out"), 1024**2)
    assert time.monotonic() - started < 5
    data = Path(copy).read_bytes()
    assert data.startswith(b"head line\n")
    assert data.endswith(b"torch.OutOfMemoryError: CUDA out of memory.\n")
    assert skipped > 3 * 1024**3 - 1024**2 - 100
    # the zeros read at both ends are left out, so that the copy still reads as text
    assert b"\0" not in data
    assert len(data) < 1000


def test_zero_runs_are_left_out_short_ones_kept(tmp_path: Path) -> None:
    source = tmp_path / "holes.log"
    source.write_bytes(b"a\n" + b"\0" * 5000 + b"b\0c\n" + b"\0" * 511 + b"d\n" + b"\0" * 3000)
    copy, skipped = shorten_log(str(source), str(tmp_path / "out"), 1024**2)
    assert skipped == 0
    assert Path(copy).read_bytes() == (
        b"a\n\n[oomlens epilog: 5000 zero bytes left out here]\nb\0c\n"
        + b"\0" * 511
        + b"d\n\n[oomlens epilog: 3000 zero bytes left out here]\n"
    )


def test_the_jobs_capture_directory_is_analyzed(tmp_path: Path, real_capture: Path) -> None:
    # GIVEN a job whose ranks ran under oomlens capture (its default place: the work dir)
    shutil.copytree(real_capture, tmp_path / "oomlens-capture" / "slurm-41")
    (tmp_path / "oomlens-capture" / "slurm-41" / "rank0.snapshot.pickle").write_bytes(b"x" * 2048)
    shutil.copytree(real_capture, tmp_path / "oomlens-capture" / "slurm-40")  # another job's
    # WHEN the Epilog plans its inputs, snapshots over 1 KiB deferred
    plan = _plan(_job(tmp_path), EpilogSettings(max_snapshot_bytes=1024))
    # THEN this job's capture files are inputs, the big snapshot waits for the sweeper
    captured = sorted(Path(i.path).name for i in plan.inputs if i.role == "capture")
    assert captured == ["rank0.events.jsonl", "rank0.series.jsonl"]
    assert all("slurm-41" in i.path for i in plan.inputs if i.role == "capture")
    assert [Path(d.path).name for d in plan.deferred] == ["rank0.snapshot.pickle"]
