"""The sweeper (``oomlens epilog --sweep``) on spools the real Epilog left behind.

The spool is built by :func:`run_epilog` itself: a fragmentation crash from the corpus whose
snapshot is larger than ``max_snapshot_bytes`` (deferred), and a crash whose Epilog analysis
hung until the budget (timed out).  As root, those jobs belong to a throwaway unprivileged user,
so that every sweep below drops privileges for real.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from oomlens.epilog import sweep as sweep_module
from oomlens.epilog.analysis import EpilogAnalysis, analyze_for_epilog, prepare_analysis
from oomlens.epilog.pending import pending_jobs
from oomlens.epilog.runner import run_epilog
from oomlens.epilog.settings import EpilogSettings
from oomlens.epilog.sweep import LOCK_NAME, SweepRun, sweep_spool
from tests._corpus import case_dir, manifest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to a job's user needs root")
REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_LIMIT = '"100 KiB"'
"""Below the fragmentation snapshot's 191987 bytes: the Epilog defers it."""
DEFERRED_JOB, TIMED_OUT_JOB = "21", "22"
SWEEP_TEST_USER = "oomlens-sweeptest"


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class BuiltSpool:
    """The spool the real Epilog wrote, and what it wrote, to copy for each test."""

    spool: Path
    settings: Path
    work: dict[str, Path]
    user: JobUser


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def job_user() -> Iterator[JobUser]:
    """As root, an unprivileged throwaway user (made as the real-SLURM tests make theirs, under
    another name: those may run meanwhile); else this user."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        yield JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
        return
    from tests.slurm.cluster import ensure_test_user, remove_test_user

    uid, gid, created = ensure_test_user(SWEEP_TEST_USER)
    try:
        yield JobUser(SWEEP_TEST_USER, uid, gid)
    finally:
        if created:
            remove_test_user(SWEEP_TEST_USER)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory the job's user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="oomlens-sweep-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _work_dir(base: Path, name: str, user: JobUser, files: dict[str, Path | bytes]) -> Path:
    """A job's work directory holding ``files`` (copies of corpus files, or bytes), owned by
    the job's user."""
    work = base / name
    work.mkdir(mode=0o755)
    for file_name, source in files.items():
        target = work / file_name
        if isinstance(source, Path):
            shutil.copyfile(source, target)
        else:
            target.write_bytes(source)
        target.chmod(0o644)
    if os.geteuid() == 0:
        for path in (work, *work.iterdir()):
            os.chown(path, user.uid, user.gid)
    return work


def _epilog(
    job_id: str,
    work: Path,
    user: JobUser,
    spool: Path,
    settings: Path,
    analyzer: Callable[..., EpilogAnalysis] = analyze_for_epilog,
) -> dict[str, Any]:
    """Run the real Epilog for a failed job whose output is ``work/train.log``."""
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": user.name,
        "SLURM_JOB_UID": str(user.uid),
        "SLURM_JOB_GID": str(user.gid),
        "SLURM_JOB_EXIT_CODE": "256",
        "SLURM_JOB_EXIT_CODE2": "1:0",
        "SLURM_JOB_WORK_DIR": str(work),
        "SLURM_JOB_STDOUT": str(work / "train.log"),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_NODELIST": "gpu07",
    }
    outcome = run_epilog(env, settings_path=settings, spool_override=spool, analyzer=analyzer)
    return outcome.record


def with_html(paths: Sequence[str], **options: Any) -> EpilogAnalysis:
    """The real analysis, plus an HTML page (this oomlens may not render HTML yet)."""
    analysis = analyze_for_epilog(paths, **options)
    return replace(analysis, html=f"<!doctype html><p>{analysis.diagnosis} from {len(paths)}")


def stuck(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    time.sleep(3600)
    raise AssertionError("unreachable")


def quick(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    return EpilogAnalysis(report={"verdict": "gpu_oom"}, html=None, verdict="gpu_oom")


@pytest.fixture(scope="module")
def built_spool(job_user: JobUser, shared_dir: Path) -> BuiltSpool:
    prepare_analysis()  # the Epilog's analysis process starts at once, even on a loaded machine
    fragmentation = case_dir("fragmentation")
    work = {
        DEFERRED_JOB: _work_dir(shared_dir, "work21", job_user, {
            "train.log": fragmentation / "train.log",
            "snapshot_rank0.pickle": fragmentation / "snapshot_rank0.pickle",
        }),
        TIMED_OUT_JOB: _work_dir(shared_dir, "work22", job_user, {
            "train.log": case_dir("other_process") / "train.log",
        }),
    }  # fmt: skip
    spool = shared_dir / "spool"
    settings = shared_dir / "epilog.toml"
    settings.write_text(f"max_snapshot_bytes = {SNAPSHOT_LIMIT}\n")
    deferred = _epilog(DEFERRED_JOB, work[DEFERRED_JOB], job_user, spool, settings, with_html)
    assert deferred["status"] == "analyzed" and len(deferred["deferred"]) == 1
    slow = shared_dir / "slow.toml"
    slow.write_text(f"max_snapshot_bytes = {SNAPSHOT_LIMIT}\nbudget_seconds = 3\n")
    timed_out = _epilog(TIMED_OUT_JOB, work[TIMED_OUT_JOB], job_user, spool, slow, stuck)
    assert timed_out["status"] == "timed_out" and timed_out["inputs"]
    return BuiltSpool(spool, settings, work, job_user)


@pytest.fixture
def spool(built_spool: BuiltSpool, tmp_path: Path) -> Path:
    """A fresh copy of the Epilog's spool (modes kept) for one test."""
    copy = tmp_path / "spool"
    shutil.copytree(built_spool.spool, copy, symlinks=True)
    return copy


def _settings(spool: Path, **changes: Any) -> EpilogSettings:
    return replace(EpilogSettings(), spool_dir=spool, **changes)


def _sweep(spool: Path, **kwargs: Any) -> SweepRun:
    kwargs.setdefault("budget_per_job", 60.0)
    return sweep_spool(_settings(spool), **kwargs)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _log(spool: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (spool / "epilog.log").read_text().splitlines()]


def _swept_lines(spool: Path) -> list[dict[str, Any]]:
    return [line for line in _log(spool) if line["action"] == "swept"]


def _tree(spool: Path) -> dict[str, bytes]:
    files = sorted(path for path in spool.rglob("*") if path.is_file())
    return {str(path.relative_to(spool)): path.read_bytes() for path in files}


# ------------------------------------------------------------------------------ the sweep


def test_sweep_finishes_what_the_epilog_deferred(spool: Path, built_spool: BuiltSpool) -> None:
    # GIVEN the Epilog's spool: job 21 without its snapshot, job 22 without any verdict
    epilog_verdict = (spool / DEFERRED_JOB / "verdict.json").read_bytes()
    epilog_html = (spool / DEFERRED_JOB / "report.html").read_bytes()
    frag_before = _json(spool / DEFERRED_JOB / "verdict.json")["diagnoses"][0]
    assert {item["kind"] for item in frag_before["evidence"]} == {"log", "derived"}
    assert not (spool / TIMED_OUT_JOB / "verdict.json").exists()
    # WHEN the sweeper runs
    run = _sweep(spool)
    # THEN both jobs were analyzed, oldest first
    assert [(o.job_key, o.status) for o in run.outcomes] == [
        (DEFERRED_JOB, "analyzed"),
        (TIMED_OUT_JOB, "analyzed"),
    ]
    # AND job 21's verdict now rests on the snapshot too: the fragmentation diagnosis cites it
    # and is more confident than the Epilog's, which the sweep kept aside
    snapshot = str(built_spool.work[DEFERRED_JOB] / "snapshot_rank0.pickle")
    fragmentation = _json(spool / DEFERRED_JOB / "verdict.json")["diagnoses"][0]
    assert fragmentation["id"] == manifest("fragmentation")["expected"]["diagnosis"]
    cited = [item for item in fragmentation["evidence"] if item["kind"] == "snapshot"]
    assert cited and cited[0]["source"]["path"] == snapshot
    assert fragmentation["confidence"] > frag_before["confidence"]
    assert (spool / DEFERRED_JOB / "verdict.epilog.json").read_bytes() == epilog_verdict
    assert (spool / DEFERRED_JOB / "report.epilog.html").read_bytes() == epilog_html
    # AND the HTML report is the new one, rendered from the new verdict
    html = (spool / DEFERRED_JOB / "report.html").read_text()
    assert html.lower().startswith("<!doctype html>") and "snapshot_rank0.pickle" in html
    assert html.encode() != epilog_html
    # AND job 22, which the Epilog never finished, has its verdict: the corpus case's diagnosis
    expected = manifest("other_process")["expected"]["diagnosis"]
    assert _json(spool / TIMED_OUT_JOB / "verdict.json")["diagnoses"][0]["id"] == expected
    assert not (spool / TIMED_OUT_JOB / "verdict.epilog.json").exists()
    # AND sweep.json says what was analyzed, as whom, and where the reports are
    record = _json(spool / DEFERRED_JOB / "sweep.json")
    assert record["schema"] == "oomlens.sweep/1" and record["status"] == "analyzed"
    assert record["epilog_status"] == "analyzed" and record["diagnosis"] == "fragmentation"
    assert [(i["path"], i["deferred_by_epilog"]) for i in record["inputs"]] == [
        (str(built_spool.work[DEFERRED_JOB] / "train.log"), False),
        (snapshot, True),
    ]
    assert record["identity"]["uid"] == built_spool.user.uid
    assert record["files"]["verdict"] == str(spool / DEFERRED_JOB / "verdict.json")
    assert record["files"]["verdict_epilog"] == str(spool / DEFERRED_JOB / "verdict.epilog.json")
    assert record["files"]["html"] == str(spool / DEFERRED_JOB / "report.html")
    assert record["limits"] == {"budget_s": 60.0, "max_memory_bytes": 8 * 1024**3}
    assert _json(spool / TIMED_OUT_JOB / "sweep.json")["epilog_status"] == "timed_out"
    # AND one "swept" line per job in the spool's log
    lines = _swept_lines(spool)
    assert [(line["job"], line["status"]) for line in lines] == [
        (DEFERRED_JOB, "analyzed"),
        (TIMED_OUT_JOB, "analyzed"),
    ]
    assert lines[0]["diagnosis"] == "fragmentation" and lines[0]["node"] == "gpu07"
    assert lines[0]["report"] == str(spool / DEFERRED_JOB / "verdict.json")
    # AND nothing is pending, locked, half-written or readable by others
    assert pending_jobs(spool) == []
    for job in (DEFERRED_JOB, TIMED_OUT_JOB):
        for path in (spool / job).iterdir():
            assert not path.name.startswith(".") and path.name != LOCK_NAME
            assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_job_the_epilog_never_finished_gets_its_work_directory_copy(
    spool: Path, built_spool: BuiltSpool
) -> None:
    # GIVEN job 22, whose Epilog ran out of time (so it wrote no copy), on a site that copies
    # reports into work directories, and a user whose umask made the job's log 0640
    work = built_spool.work[TIMED_OUT_JOB]
    log = work / "train.log"
    assert "workdir_copies" not in _json(spool / TIMED_OUT_JOB / "epilog.json")
    log.chmod(0o640)
    try:
        # WHEN the sweeper finishes it
        run = sweep_spool(_settings(spool, copy_to_workdir=True), budget_per_job=60.0)
        # THEN the user finds the finished reports beside the job's files, as their own, no
        # more readable than the log they quote
        assert ("22", "analyzed") in [(o.job_key, o.status) for o in run.outcomes]
        for name in ("oomlens-22.json", "oomlens-22.html"):
            info = (work / name).stat()
            assert info.st_uid == built_spool.user.uid
            assert stat.S_IMODE(info.st_mode) == 0o640
        expected = manifest("other_process")["expected"]["diagnosis"]
        assert _json(work / "oomlens-22.json")["diagnoses"][0]["id"] == expected
        assert _json(spool / TIMED_OUT_JOB / "sweep.json")["workdir_copies"] == [
            str(work / "oomlens-22.json"),
            str(work / "oomlens-22.html"),
        ]
    finally:
        log.chmod(0o644)
        for name in ("oomlens-22.json", "oomlens-22.html"):
            (work / name).unlink(missing_ok=True)


def test_a_second_sweep_does_nothing(spool: Path) -> None:
    _sweep(spool)
    before = _tree(spool)
    again = _sweep(spool)
    assert again.outcomes == () and again.busy == ()
    assert _tree(spool) == before


def test_new_html_replaces_the_epilogs_which_is_kept(spool: Path) -> None:
    run = _sweep(spool, analyzer=with_html)
    assert run.outcomes[0].status == "analyzed"
    job = spool / DEFERRED_JOB
    assert (job / "report.html").read_text() == "<!doctype html><p>fragmentation from 2"
    assert (job / "report.epilog.html").read_text() == "<!doctype html><p>fragmentation from 1"
    assert _json(job / "sweep.json")["files"]["html_epilog"] == str(job / "report.epilog.html")


def _sweep_in_child(spool: Path, results: Any) -> None:
    def slow(paths: Sequence[str], **options: Any) -> EpilogAnalysis:
        time.sleep(0.5)  # both sweepers are surely running at once
        return analyze_for_epilog(paths, **options)

    run = _sweep(spool, analyzer=slow)
    results.put([outcome.job_key for outcome in run.outcomes])


def test_two_concurrent_sweeps_take_each_job_once(spool: Path) -> None:
    # GIVEN two sweepers started at the same moment on the same spool
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    sweepers = [context.Process(target=_sweep_in_child, args=(spool, results)) for _ in range(2)]
    for process in sweepers:
        process.start()
    for process in sweepers:
        process.join(60)
        assert process.exitcode == 0
    taken = [results.get(timeout=5) for _ in sweepers]
    # THEN each job was analyzed by exactly one of them
    assert sorted(job for jobs in taken for job in jobs) == [DEFERRED_JOB, TIMED_OUT_JOB]
    assert sorted(line["job"] for line in _swept_lines(spool)) == [DEFERRED_JOB, TIMED_OUT_JOB]
    assert pending_jobs(spool) == []


def test_a_live_lock_is_respected_and_a_stale_one_taken_over(spool: Path) -> None:
    # GIVEN job 21 claimed by another sweeper a moment ago
    lock = spool / DEFERRED_JOB / LOCK_NAME
    lock.write_text(json.dumps({"token": "x", "pid": 4242, "host": "n1", "budget_s": 60}))
    # WHEN a sweep runs, THEN it leaves job 21 alone
    run = _sweep(spool)
    assert [o.job_key for o in run.outcomes] == [TIMED_OUT_JOB]
    assert run.busy == (DEFERRED_JOB,)
    assert lock.exists() and not (spool / DEFERRED_JOB / "sweep.json").exists()
    # GIVEN that sweeper died long ago (its lock is older than its budget and ours)
    old = time.time() - 3600
    os.utime(lock, (old, old))
    # WHEN the next sweep runs, THEN it takes the job over and says so
    run = _sweep(spool)
    assert [(o.job_key, o.status) for o in run.outcomes] == [(DEFERRED_JOB, "analyzed")]
    problems = _json(spool / DEFERRED_JOB / "sweep.json")["problems"]
    assert problems[0].startswith(f"took over a stale {LOCK_NAME} (pid 4242 on n1,")
    assert not lock.exists()


def test_max_jobs_takes_the_oldest(spool: Path) -> None:
    run = _sweep(spool, max_jobs=1)
    assert [o.job_key for o in run.outcomes] == [DEFERRED_JOB] and run.left == 1
    assert [job.job_id for job in pending_jobs(spool)] == [TIMED_OUT_JOB]


# ------------------------------------------------------------------------------ bad jobs


def hanging(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    Path(tempfile.gettempdir(), f"oomlens-sweep-hang.{os.getppid()}").write_text(str(os.getpid()))
    time.sleep(3600)
    raise AssertionError("unreachable")


def raising(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    raise RuntimeError("a bug in a rule")


def segfaulting(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def greedy(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    hoard = bytearray(2 * 1024**3)
    raise AssertionError(f"got {len(hoard)} bytes past the cap")


@pytest.mark.parametrize(
    ("analyzer", "options", "status", "words"),
    [
        (hanging, {"budget_per_job": 1.0}, "timed_out", "SIGKILL"),
        (raising, {}, "analysis_failed", "RuntimeError: a bug in a rule"),
        (segfaulting, {}, "crashed", "killed by SIGSEGV"),
        (greedy, {"max_memory_bytes": 1024**3}, "analysis_failed", "MemoryError"),
    ],
)
def test_a_failed_analysis_is_recorded_and_the_job_leaves_the_list(
    spool: Path, analyzer: Any, options: dict[str, Any], status: str, words: str
) -> None:
    run = _sweep(spool, analyzer=analyzer, max_jobs=1, **options)
    (outcome,) = run.outcomes
    assert outcome.status == status
    record = _json(spool / DEFERRED_JOB / "sweep.json")
    assert record["status"] == status and words in record["reason"]
    # the Epilog's verdict stays where it was: there is nothing better
    assert not (spool / DEFERRED_JOB / "verdict.epilog.json").exists()
    assert (spool / DEFERRED_JOB / "verdict.json").exists()
    assert _swept_lines(spool)[0]["status"] == status
    assert [job.job_id for job in pending_jobs(spool)] == [TIMED_OUT_JOB]
    if analyzer is hanging:
        marker = Path(tempfile.gettempdir(), f"oomlens-sweep-hang.{os.getpid()}")
        pid = int(marker.read_text())
        marker.unlink()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_bug_in_one_job_does_not_stop_the_sweep(
    spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a sweeper that fails on its first job
    real = sweep_module.run_in_child
    calls: list[int] = []

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("surprise")
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "run_in_child", fails_once)
    # WHEN it runs, THEN the first job is an error, logged, and the second one is done
    run = _sweep(spool)
    assert [(o.job_key, o.status) for o in run.outcomes] == [
        (DEFERRED_JOB, "error"),
        (TIMED_OUT_JOB, "analyzed"),
    ]
    error = _swept_lines(spool)[0]
    assert error["status"] == "error" and error["reason"] == "internal error: KeyError: 'surprise'"
    # AND the failed job stays pending, unlocked, for the next sweep
    assert not (spool / DEFERRED_JOB / LOCK_NAME).exists()
    assert [job.job_id for job in pending_jobs(spool)] == [DEFERRED_JOB]
    monkeypatch.setattr(sweep_module, "run_in_child", real)
    assert [o.status for o in _sweep(spool).outcomes] == ["analyzed"]


def test_a_full_disk_leaves_the_job_pending(spool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a spool whose disk is full
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sweep_module, "replace_file", disk_full)
    epilog_verdict = (spool / DEFERRED_JOB / "verdict.json").read_bytes()
    # WHEN
    run = _sweep(spool, max_jobs=1)
    # THEN the analysis is not marked done: the Epilog's report stands, the job stays pending
    (outcome,) = run.outcomes
    assert outcome.status == "error"
    assert "spool: verdict.json: No space left on device" in outcome.problems
    assert outcome.record["reason"].startswith("the analysis ended analyzed, but its results")
    assert not (spool / DEFERRED_JOB / "sweep.json").exists()
    assert not (spool / DEFERRED_JOB / LOCK_NAME).exists()
    assert (spool / DEFERRED_JOB / "verdict.json").read_bytes() == epilog_verdict
    assert DEFERRED_JOB in [job.job_id for job in pending_jobs(spool)]
    line = _swept_lines(spool)[0]
    assert line["status"] == "error" and "No space left on device" in line["problems"][0]


def test_a_job_the_epilog_could_not_record_is_reported(tmp_path: Path) -> None:
    # GIVEN a job directory whose Epilog ended long ago without an epilog.json (a full disk)
    spool = tmp_path / "spool"
    (spool / "12").mkdir(parents=True, mode=0o700)
    spool.chmod(0o700)
    (spool / "12" / "claim.json").write_text("{}")
    os.utime(spool / "12", (time.time() - 3600, time.time() - 3600))
    reported: list[str] = []
    # WHEN a sweep runs
    run = sweep_spool(
        _settings(spool), report=lambda outcome: reported.append(outcome.summary_line())
    )
    # THEN it reports the job in one line and logs it, and writes nothing into its directory
    assert run.outcomes == () and [o.status for o in run.unrecorded] == ["error"]
    (line,) = reported
    assert line.startswith("oomlens sweep: job 12: error, ") and "\n" not in line
    assert "epilog.json: missing: the Epilog left no record of this job" in line
    (logged,) = _log(spool)
    assert logged["action"] == "swept" and logged["status"] == "error" and logged["job"] == "12"
    assert sorted(os.listdir(spool / "12")) == ["claim.json"]


def test_what_a_killed_sweeper_left_is_cleaned_up(spool: Path) -> None:
    # GIVEN the temporary report of a sweeper killed while writing it, and its stale lock
    leftover = spool / DEFERRED_JOB / ".verdict.json.4242.0bad.tmp"
    leftover.write_text('{"half": ')
    lock = spool / DEFERRED_JOB / LOCK_NAME
    lock.write_text("")
    os.utime(lock, (0, 0))
    # WHEN the next sweep takes the job
    assert [o.status for o in _sweep(spool, max_jobs=1).outcomes] == ["analyzed"]
    # THEN nothing of the dead sweeper remains
    assert not leftover.exists() and not lock.exists()


@needs_root
def test_a_job_whose_user_is_unknown_is_refused(spool: Path) -> None:
    # GIVEN a record without the job's user (an Epilog environment that lacked it)
    path = spool / DEFERRED_JOB / "epilog.json"
    record = _json(path)
    for key in ("user", "uid", "gid"):
        record["job"][key] = None
    path.write_text(json.dumps(record))
    # WHEN
    run = _sweep(spool)
    # THEN root read nothing of it, recorded why, and went on with the next job
    assert [(o.job_key, o.status) for o in run.outcomes] == [
        (DEFERRED_JOB, "refused"),
        (TIMED_OUT_JOB, "analyzed"),
    ]
    sweep_record = _json(spool / DEFERRED_JOB / "sweep.json")
    assert "not reading its files as root" in sweep_record["reason"]
    assert "inputs" not in sweep_record
    assert pending_jobs(spool) == []


# ------------------------------------------------------------------------------ hostile input


class _RunsCommand:
    """Pickles as ``os.system(command)``: a snapshot that would run code if unpickled."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (self.command,))


def test_a_hostile_pickle_in_a_deferred_input_runs_nothing(
    built_spool: BuiltSpool, shared_dir: Path, tmp_path: Path
) -> None:
    # GIVEN a job whose big "snapshot" would run a command if it were unpickled (one that the
    # job's user could run: it writes into the user's own work directory)
    marker = shared_dir / "work31" / "pwned"
    command = f"touch {marker}" + " " * 4096  # past max_snapshot_bytes: deferred by the Epilog
    hostile = pickle.dumps(_RunsCommand(command), protocol=4)
    work = _work_dir(shared_dir, "work31", built_spool.user, {
        "train.log": case_dir("fragmentation") / "train.log",
        "snapshot_rank0.pickle": hostile,
    })  # fmt: skip
    spool = tmp_path / "spool"
    settings = tmp_path / "epilog.toml"
    settings.write_text('max_snapshot_bytes = "1 KiB"\n')
    assert _epilog("31", work, built_spool.user, spool, settings, quick)["deferred"]
    # WHEN the sweeper loads it without a size cap
    run = _sweep(spool)
    # THEN nothing ran, the pickle was refused, and the log still gave its verdict
    assert not marker.exists()
    assert [o.status for o in run.outcomes] == ["analyzed"]
    record = _json(spool / "31" / "sweep.json")
    assert any("refused to load" in n and "nothing in it was run" in n for n in record["notes"])
    assert _json(spool / "31" / "verdict.json")["diagnoses"][0]["id"] == "fragmentation"


# ------------------------------------------------------------------------------ as the user


def recording(paths: Sequence[str], **options: Any) -> EpilogAnalysis:
    report = {
        "verdict": "gpu_oom",
        "euid": os.geteuid(),
        "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
        "options": options,
    }
    return EpilogAnalysis(report=report, html=None, verdict="gpu_oom")


@needs_root
def test_the_analysis_runs_as_the_jobs_user(spool: Path, built_spool: BuiltSpool) -> None:
    run = _sweep(spool, analyzer=recording, max_jobs=1)
    assert run.outcomes[0].status == "analyzed"
    user = built_spool.user
    seen = _json(spool / DEFERRED_JOB / "verdict.json")
    assert (seen["euid"], seen["egid"]) == (user.uid, user.gid)
    assert seen["groups"] == sorted(os.getgrouplist(user.name, user.gid))
    assert seen["options"] == {"config": None, "max_snapshot_bytes": None}
    identity = _json(spool / DEFERRED_JOB / "sweep.json")["identity"]
    assert identity == {"uid": user.uid, "gid": user.gid, "dropped": True}


@needs_root
def test_a_log_swapped_for_a_link_to_a_root_only_file_is_not_read(
    built_spool: BuiltSpool, shared_dir: Path, tmp_path: Path
) -> None:
    # GIVEN a job the Epilog deferred, whose user then swaps its log for a link to a file only
    # root may read
    fragmentation = case_dir("fragmentation")
    work = _work_dir(shared_dir, "work32", built_spool.user, {
        "train.log": fragmentation / "train.log",
        "snapshot_rank0.pickle": fragmentation / "snapshot_rank0.pickle",
    })  # fmt: skip
    spool = tmp_path / "spool"
    settings = tmp_path / "epilog.toml"
    settings.write_text(f"max_snapshot_bytes = {SNAPSHOT_LIMIT}\n")
    assert _epilog("32", work, built_spool.user, spool, settings, quick)["deferred"]
    secret = tmp_path / "secret.log"
    secret.write_text("torch.OutOfMemoryError: CUDA out of memory. SECRET-7731\n")
    secret.chmod(0o600)
    (work / "train.log").unlink()
    (work / "train.log").symlink_to(secret)
    # WHEN the sweeper (root) runs
    run = _sweep(spool)
    # THEN the job's user could not read the link, and nothing of the secret reached the spool
    assert [o.status for o in run.outcomes] == ["analyzed"]
    inputs = _json(spool / "32" / "sweep.json")["inputs"]
    assert "Permission denied" in inputs[0]["problem"]
    assert "problem" not in inputs[1]
    for path in spool.rglob("*"):
        assert path.is_dir() or "SECRET-7731" not in path.read_text(errors="replace")


# ------------------------------------------------------------------------------ the command


def _oomlens(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", "epilog", *args],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_sweeps_and_exits_0(spool: Path, built_spool: BuiltSpool) -> None:
    settings = str(built_spool.settings)
    done = _oomlens("--sweep", "--spool", str(spool), "--settings", settings, "--max-jobs", "1")
    assert done.returncode == 0, done.stderr
    assert f"oomlens sweep: job {DEFERRED_JOB}: analyzed, verdict gpu_oom (fragmentation)" in (
        done.stderr
    )
    assert "1 pending job(s) left for the next sweep" in done.stderr
    rest = _oomlens("--sweep", "--spool", str(spool), "--budget-per-job", "30")
    assert rest.returncode == 0, rest.stderr
    assert f"job {TIMED_OUT_JOB}: analyzed" in rest.stderr
    assert _oomlens("--sweep", "--spool", str(spool)).stderr == ""  # nothing left: silent


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--spool", "/nonexistent/spool"), "the spool does not exist"),
        (("--spool", "relspool"), "--spool 'relspool': give an absolute path"),
        (("--settings", "/etc/passwd"), "not valid TOML"),
        (("--budget-per-job", "soon"), "--budget-per-job 'soon'"),
        (("--budget-per-job", "0"), "--budget-per-job '0'"),
        (("--max-jobs", "-1"), "--max-jobs '-1'"),
        (("--max-memory", "lots"), "--max-memory 'lots'"),
        (("--check",), "neither --check nor --hard-limit"),
    ],
)
def test_usage_errors_exit_2(spool: Path, args: tuple[str, ...], words: str) -> None:
    base = ("--sweep", "--spool", str(spool), "--settings", "/nonexistent.toml")
    done = _oomlens(*base, *args)
    assert done.returncode == 2
    assert done.stderr.startswith("oomlens: ") and words in done.stderr
    assert "Traceback" not in done.stderr
    assert pending_jobs(spool) != []  # nothing was swept


def test_an_unsafe_spool_is_a_usage_error(spool: Path) -> None:
    spool.chmod(0o777)
    done = _oomlens("--sweep", "--spool", str(spool), "--settings", "/nonexistent.toml")
    assert done.returncode == 2 and "writable by group or others" in done.stderr
