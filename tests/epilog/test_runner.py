"""One Epilog run end to end (without Slurm): what it writes, and that nothing makes it fail.

The analysis is replaced by test doubles here (hanging, crashing, raising, huge); the real
analysis runs in tests/slurm.  Each run forks a real analysis process.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from oomlens.epilog import runner
from oomlens.epilog import spool as spool_module
from oomlens.epilog.analysis import EpilogAnalysis
from oomlens.epilog.environment import parse_job_environment
from oomlens.epilog.pending import pending_jobs
from oomlens.epilog.runner import effective_budget, run_epilog
from oomlens.epilog.worker import copy_to_workdir
from oomlens.errors import NoUsableInputError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to a job's user needs root")
NOBODY = 65534


def _analysis(paths: Sequence[str], **facts: Any) -> EpilogAnalysis:
    return EpilogAnalysis(
        report={"schema_version": 1, "verdict": "gpu_oom", "inputs": list(paths), **facts},
        html="<!doctype html><title>r</title>",
        verdict="gpu_oom",
        diagnosis="other_process",
        confidence=0.9,
        summary="another process holds the GPU",
    )


def recording_analyzer(paths: Sequence[str], **options: Any) -> EpilogAnalysis:
    return _analysis(
        paths,
        euid=os.geteuid(),
        egid=os.getegid(),
        options=options,
        preloaded="oomlens.session" in sys.modules,
        open_fds=sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    )


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A work directory any user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="oomlens-epilog-test-"))
    path.chmod(0o755)
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _env(work_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": str(os.geteuid()),
        "SLURM_JOB_GID": str(os.getegid()),
        "SLURM_JOB_EXIT_CODE": "256",
        "SLURM_JOB_EXIT_CODE2": "1:0",
        "SLURM_JOB_DERIVED_EC": "0",
        "SLURM_JOB_WORK_DIR": str(work_dir),
        "SLURM_JOB_STDOUT": str(work_dir / "train.%j.log"),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURMD_NODENAME": "n1",
        "SLURM_NODELIST": "n[1-2]",
    }
    env.update(extra)
    return env


def _settings(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "epilog.toml"
    path.write_text(text)
    return path


def _log_lines(spool: Path) -> list[dict[str, Any]]:
    log = spool / "epilog.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _run(tmp_path: Path, env: dict[str, str], analyzer: Any = recording_analyzer,
         settings: str = "", **kwargs: Any) -> runner.EpilogOutcome:  # fmt: skip
    return run_epilog(
        env,
        settings_path=_settings(tmp_path, settings),
        spool_override=tmp_path / "spool",
        analyzer=analyzer,
        **kwargs,
    )


def test_failed_job_is_analyzed_into_the_spool(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN a failed job that left its log
    (job_dir / "train.41.log").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    # WHEN the Epilog runs
    outcome = _run(tmp_path, _env(job_dir))
    # THEN the job's spool directory holds the reports and the Epilog's record
    spool = tmp_path / "spool"
    assert outcome.action == "analyzed"
    verdict = json.loads((spool / "41" / "verdict.json").read_text())
    assert verdict["inputs"] == [str(job_dir / "train.41.log")]
    assert (spool / "41" / "report.html").read_text().startswith("<!doctype html>")
    record = json.loads((spool / "41" / "epilog.json").read_text())
    assert record["status"] == "analyzed" and record["verdict"] == "gpu_oom"
    assert record["diagnosis"] == "other_process" and record["job"]["exit"] == "1:0"
    assert record["inputs"] == [
        {"path": str(job_dir / "train.41.log"), "role": "stdout+stderr", "bytes": 44}
    ]
    # AND the analysis ran prepared: imported, without DeepSpeed, with no descriptor of the
    # Epilog's but its pipe, and with the site's snapshot limit
    assert verdict["preloaded"]
    assert len(verdict["open_fds"]) == 5  # stdin, stdout, stderr (/dev/null), pipe, listdir's
    assert verdict["options"] == {"config": None, "max_snapshot_bytes": 256 * 1024**2}
    for name in ("verdict.json", "report.html", "epilog.json"):
        assert stat.S_IMODE((spool / "41" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((spool / "41").stat().st_mode) == 0o700
    # AND one log line says so
    (line,) = _log_lines(spool)
    assert line["job"] == "41" and line["action"] == "analyzed"
    assert line["verdict"] == "gpu_oom" and line["diagnosis"] == "other_process"
    assert line["report"] == str(spool / "41" / "verdict.json")
    assert line["elapsed_s"] < 5


def test_healthy_job_gets_a_log_line_and_nothing_else(tmp_path: Path, job_dir: Path) -> None:
    env = _env(job_dir, SLURM_JOB_EXIT_CODE="0", SLURM_JOB_EXIT_CODE2="0:0")
    outcome = _run(tmp_path, env)
    assert outcome.action == "skipped"
    assert [p.name for p in (tmp_path / "spool").iterdir()] == ["epilog.log"]
    (line,) = _log_lines(tmp_path / "spool")
    assert line["action"] == "skipped" and "did not fail" in line["reason"]


def test_healthy_jobs_can_stay_out_of_the_log(tmp_path: Path, job_dir: Path) -> None:
    env = _env(job_dir, SLURM_JOB_EXIT_CODE="0", SLURM_JOB_EXIT_CODE2="0:0")
    outcome = _run(tmp_path, env, settings="log_successful_jobs = false\n")
    assert outcome.action == "skipped" and not outcome.logged
    assert not (tmp_path / "spool").exists()


def test_only_the_first_node_of_a_multi_node_job_acts(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    outcome = _run(tmp_path, _env(job_dir, SLURMD_NODENAME="n2"))
    assert outcome.action == "not_first_node"
    assert not (tmp_path / "spool").exists()


def test_a_job_is_handled_once(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN a job already handled (by the slurmd Epilog, say)
    (job_dir / "train.41.log").write_text("x\n")
    first = _run(tmp_path, _env(job_dir))
    before = (tmp_path / "spool" / "41" / "epilog.json").read_bytes()
    # WHEN the slurmctld Epilog sees it too
    env = _env(job_dir, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_NODELIST="n[1-2]")
    second = _run(tmp_path, env)
    # THEN it does nothing, not even a log line
    assert (first.action, second.action) == ("analyzed", "duplicate")
    assert (tmp_path / "spool" / "41" / "epilog.json").read_bytes() == before
    assert len(_log_lines(tmp_path / "spool")) == 1


def _age_claim(spool: Path, key: str, seconds: float) -> None:
    claim_path = spool / key / "claim.json"
    claim = json.loads(claim_path.read_text())
    claim["claimed_at"] -= seconds
    claim_path.write_text(json.dumps(claim))


@pytest.mark.parametrize(
    ("later_env", "claim_age_s"),
    [
        # the controller lost its state: a few minutes later, another job with the same id
        ({"SLURM_JOB_EXIT_CODE": "512", "SLURM_JOB_EXIT_CODE2": "2:0"}, 60.0),
        # MaxJobId wrapped: the same script, same directory, same exit, weeks later
        ({}, 30 * 86400.0),
    ],
    ids=["lost-controller-state", "wrapped-ids"],
)
def test_a_reused_job_id_gets_its_own_report_and_log_line(
    tmp_path: Path, job_dir: Path, later_env: dict[str, str], claim_age_s: float
) -> None:
    # GIVEN job 41, analyzed
    spool = tmp_path / "spool"
    (job_dir / "train.41.log").write_text("x\n")
    first = _run(tmp_path, _env(job_dir))
    _age_claim(spool, "41", claim_age_s)
    earlier = (spool / "41" / "epilog.json").read_bytes()
    # WHEN a later job gets the same id and fails
    later = _run(tmp_path, _env(job_dir, **later_env))
    # THEN it is analyzed into a directory of its own, the earlier job's stays as it was
    assert (first.action, later.action) == ("analyzed", "analyzed")
    assert later.job_key is not None and later.job_key.startswith("41.t")
    assert (spool / "41" / "epilog.json").read_bytes() == earlier
    assert (spool / later.job_key / "verdict.json").exists()
    # AND its log line says what happened
    lines = _log_lines(spool)
    assert [line["action"] for line in lines] == ["analyzed", "analyzed"]
    assert lines[1]["report"] == str(spool / later.job_key / "verdict.json")
    assert "used by an earlier job" in lines[1]["problems"][0]


def test_the_other_epilog_of_the_same_job_still_does_nothing_hours_later(
    tmp_path: Path, job_dir: Path
) -> None:
    # A slurmctld Epilog delayed (a busy controller) by an hour is still the same job.
    (job_dir / "train.41.log").write_text("x\n")
    _run(tmp_path, _env(job_dir))
    _age_claim(tmp_path / "spool", "41", 3600.0)
    env = _env(job_dir, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_NODELIST="n[1-2]")
    assert _run(tmp_path, env).action == "duplicate"
    assert sorted(path.name for path in (tmp_path / "spool").iterdir()) == ["41", "epilog.log"]


@pytest.mark.parametrize("job_mode", [0o600, 0o640, 0o644])
def test_workdir_copies_are_no_more_readable_than_the_jobs_output(
    tmp_path: Path, job_dir: Path, job_mode: int
) -> None:
    # GIVEN a job whose output file shows its umask (077 gives 0600)
    log = job_dir / "train.41.log"
    log.write_text("x\n")
    log.chmod(job_mode)
    # WHEN the Epilog copies its reports into the work directory (as the job's user: here the
    # job belongs to this user), from a process whose own umask is the usual 022
    previous = os.umask(0o022)
    try:
        outcome = _run(tmp_path, _env(job_dir), settings="copy_to_workdir = true\n")
    finally:
        os.umask(previous)
    # THEN the copies have the job's mode, not 0644
    assert outcome.action == "analyzed"
    for name in ("oomlens-41.json", "oomlens-41.html"):
        assert stat.S_IMODE((job_dir / name).stat().st_mode) == job_mode


def test_workdir_copies_are_private_when_the_job_left_no_file_of_its_own(job_dir: Path) -> None:
    from oomlens.epilog.worker import workdir_copy_mode

    foreign = job_dir / "train.41.log"
    foreign.write_text("x\n")
    foreign.chmod(0o644)
    assert workdir_copy_mode([str(foreign)], os.geteuid() + 1) == 0o600
    assert workdir_copy_mode([str(job_dir / "missing")], os.geteuid()) == 0o600
    assert workdir_copy_mode([str(foreign)], os.geteuid()) == 0o644


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_an_output_that_is_not_a_regular_file_is_named_so(
    tmp_path: Path, job_dir: Path, kind: str
) -> None:
    if kind == "fifo":
        output = job_dir / "train.41.log"
        os.mkfifo(output)
    else:
        output = Path("/dev/zero")
    outcome = _run(tmp_path, _env(job_dir, SLURM_JOB_STDOUT=str(output)))
    assert outcome.action == "no_input"
    notes = " ".join(outcome.record["notes"])
    assert f"not a regular file: {output}" in notes and "not found" not in notes


def test_no_job_id_is_logged_and_skipped(tmp_path: Path, job_dir: Path) -> None:
    env = _env(job_dir)
    del env["SLURM_JOB_ID"]
    outcome = _run(tmp_path, env)
    assert outcome.action == "skipped"
    assert "no SLURM_JOB_ID" in _log_lines(tmp_path / "spool")[0]["reason"]


@pytest.mark.parametrize(
    "job_id",
    # Devanagari, fullwidth and Bengali digits: str.isdigit and \d take them; Slurm never does
    ["../../x", "12a", "1" * 300, "1" * 5000, "\u096a\u0968", "\uff11\uff12\uff13", "7\u09e8"],
)
def test_an_invalid_job_id_is_logged_as_invalid(tmp_path: Path, job_dir: Path, job_id: str) -> None:
    outcome = _run(tmp_path, _env(job_dir, SLURM_JOB_ID=job_id))
    assert outcome.action == "skipped"
    (line,) = _log_lines(tmp_path / "spool")
    assert line["reason"] == f"invalid SLURM_JOB_ID {job_id[:40]!r}: not a job id; nothing done"
    assert os.listdir(tmp_path / "spool") == ["epilog.log"]


def hanging_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    Path(paths[0] + ".pid").write_text(str(os.getpid()))
    time.sleep(3600)
    raise AssertionError("unreachable")


def test_a_hanging_analysis_is_killed_at_the_budget(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN an analysis that never ends, and a 2 s budget
    (job_dir / "train.41.log").write_text("x\n")
    started = time.monotonic()
    # WHEN
    outcome = _run(tmp_path, _env(job_dir), hanging_analyzer, "budget_seconds = 2\n",
                   started=started)  # fmt: skip
    elapsed = time.monotonic() - started
    # THEN the Epilog returns within its budget and records the time-out and the inputs
    assert outcome.action == "timed_out"
    assert 1.5 < elapsed < 2.3
    record = json.loads((tmp_path / "spool" / "41" / "epilog.json").read_text())
    assert record["status"] == "timed_out" and "SIGKILL" in record["reason"]
    assert record["inputs"][0]["path"] == str(job_dir / "train.41.log")
    assert not (tmp_path / "spool" / "41" / "verdict.json").exists()
    # AND the analysis process is gone
    pid = int((job_dir / "train.41.log.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_hard_limit_shortens_the_budget() -> None:
    assert effective_budget(20.0, None) == 20.0
    assert effective_budget(20.0, 10.0) == 8.0
    assert effective_budget(5.0, 30.0) == 5.0
    assert effective_budget(20.0, 2.0) == 1.0


def test_hard_limit_applies_to_a_run(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    started = time.monotonic()
    outcome = _run(tmp_path, _env(job_dir), hanging_analyzer, hard_limit=3.5, started=started)
    assert outcome.action == "timed_out"
    assert time.monotonic() - started < 1.9


@pytest.mark.parametrize("hard_limit", ["abc", "nan", "inf", "0", 0.0, -5.0])
def test_a_hard_limit_that_is_not_a_positive_number_is_logged_and_ignored(
    tmp_path: Path, job_dir: Path, hard_limit: float | str
) -> None:
    # GIVEN --hard-limit that is not a number of seconds, or one the job could never meet
    (job_dir / "train.41.log").write_text("x\n")
    # WHEN
    outcome = _run(tmp_path, _env(job_dir), hard_limit=hard_limit)
    # THEN the job gets the settings' budget, and its log line says why
    assert outcome.action == "analyzed"
    assert outcome.record["timing"]["budget_s"] == 20.0
    (line,) = _log_lines(tmp_path / "spool")
    assert line["problems"] == [
        f"--hard-limit {str(hard_limit)!r} is not a positive number of seconds; ignored: the "
        "budget is budget_seconds (20 s)"
    ]


def test_a_relative_spool_option_is_logged_and_ignored(
    tmp_path: Path, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN --spool as a relative path, which the settings file would refuse for spool_dir
    (job_dir / "train.41.log").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    configured = tmp_path / "configured"
    # WHEN
    outcome = run_epilog(
        _env(job_dir),
        settings_path=_settings(tmp_path, f'spool_dir = "{configured}"\n'),
        spool_override="relspool",
        analyzer=recording_analyzer,
    )
    # THEN the job goes to the settings' spool, whose log line says why
    assert outcome.action == "analyzed"
    assert not (tmp_path / "relspool").exists()
    assert (configured / "41" / "verdict.json").exists()
    (line,) = _log_lines(configured)
    assert line["problems"] == [
        f"--spool 'relspool': give an absolute path, as for spool_dir; used {configured}"
    ]


def raising_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    raise RuntimeError("a bug in a rule")


def segfaulting_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def empty_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    raise NoUsableInputError("none of 1 input could be read")


def greedy_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    hoard = bytearray(2 * 1024**3)
    return _analysis(paths, size=len(hoard))


def flooding_analyzer(paths: Sequence[str], **_: Any) -> EpilogAnalysis:
    analysis = _analysis(paths)
    return EpilogAnalysis(analysis.report, "x" * (65 * 1024**2), "gpu_oom")


@pytest.mark.parametrize(
    ("analyzer", "settings", "action", "words"),
    [
        (raising_analyzer, "", "analysis_failed", "RuntimeError: a bug in a rule"),
        (segfaulting_analyzer, "", "crashed", "killed by SIGSEGV"),
        (empty_analyzer, "", "no_input", "none of 1 input could be read"),
        (greedy_analyzer, 'max_memory_bytes = "1 GiB"\n', "analysis_failed", "MemoryError"),
        (flooding_analyzer, "", "analysis_failed", "more than"),
    ],
)
def test_analysis_failures_are_recorded(
    tmp_path: Path, job_dir: Path, analyzer: Any, settings: str, action: str, words: str
) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    outcome = _run(tmp_path, _env(job_dir), analyzer, settings)
    assert outcome.action == action
    record = json.loads((tmp_path / "spool" / "41" / "epilog.json").read_text())
    assert record["status"] == action and words in record["reason"]
    assert _log_lines(tmp_path / "spool")[0]["action"] == action


def test_no_files_at_all(tmp_path: Path, job_dir: Path) -> None:
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "no_input"
    record = json.loads((tmp_path / "spool" / "41" / "epilog.json").read_text())
    assert "not found" in record["notes"][0]


def test_broken_settings_fall_back_to_defaults(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    outcome = _run(tmp_path, _env(job_dir), settings="copy_to_workdir = true\nbogus = 1\n")
    assert outcome.action == "analyzed"
    assert any("unknown setting 'bogus'" in problem for problem in outcome.problems)
    line = _log_lines(tmp_path / "spool")[0]
    assert "unknown setting 'bogus'" in line["problems"][0]
    assert not list(job_dir.glob("oomlens-*"))  # the broken file's copy_to_workdir is not used


def test_spool_that_is_a_symlink_is_refused(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "spool").symlink_to(target)
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "error"
    assert "symbolic link" in outcome.problems[-1]
    assert list(target.iterdir()) == []


def test_spool_writable_by_others_is_refused(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool").chmod(0o777)
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "error" and "writable by group or others" in outcome.problems[-1]
    assert not (tmp_path / "spool" / "41").exists()


def test_log_planted_as_a_symlink_is_not_followed(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    (tmp_path / "spool").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "spool" / "epilog.log").symlink_to(victim)
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "analyzed" and not outcome.logged
    assert victim.read_text() == "precious\n"
    assert any(problem.startswith("log ") for problem in outcome.problems)


def test_full_disk_is_recorded_not_raised(
    tmp_path: Path, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job_dir / "train.41.log").write_text("x\n")

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runner, "write_new_file", disk_full)
    monkeypatch.setattr(runner, "append_line", disk_full)
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "error" and not outcome.logged
    assert any("No space left on device" in problem for problem in outcome.problems)


def test_a_disk_that_fills_up_leaves_no_part_of_a_file_and_an_error_line(
    tmp_path: Path, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a spool whose disk fills up halfway through each file the Epilog writes there
    (job_dir / "train.41.log").write_text("x\n")
    real_write = os.write

    def disk_fills(fd: int, data: bytes) -> None:
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spool_module, "write_all", disk_fills)
    # WHEN
    outcome = _run(tmp_path, _env(job_dir))
    # THEN no truncated report or record is left in the job's directory
    assert os.listdir(tmp_path / "spool" / "41") == []
    # AND the job's log line is an error that says how the analysis ended and what was lost
    assert outcome.action == "error"
    (line,) = _log_lines(tmp_path / "spool")
    assert line["action"] == "error" and line["verdict"] == "gpu_oom"
    assert line["reason"] == (
        "the analysis ended analyzed, but the spool did not take verdict.json and epilog.json"
    )
    assert line["problems"][0] == "spool: verdict.json: No space left on device"
    assert "report" not in line


def test_a_report_the_spool_did_not_take_is_left_to_the_sweeper(
    tmp_path: Path, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a spool with room for the Epilog's record, not for its reports
    (job_dir / "train.41.log").write_text("x\n")
    real_write_new_file = runner.write_new_file

    def reports_do_not_fit(dir_fd: int, name: str, data: bytes) -> None:
        if name in ("verdict.json", "report.html"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_new_file(dir_fd, name, data)

    monkeypatch.setattr(runner, "write_new_file", reports_do_not_fit)
    # WHEN
    outcome = _run(tmp_path, _env(job_dir))
    # THEN the record says error, and the job is on the sweeper's list
    assert outcome.action == "error"
    record = json.loads((tmp_path / "spool" / "41" / "epilog.json").read_text())
    assert record["status"] == "error" and record["verdict"] == "gpu_oom"
    assert (
        record["reason"] == "the analysis ended analyzed, but the spool did not take verdict.json"
    )
    assert record["inputs"] and "verdict" not in record["files"]
    assert [job.job_id for job in pending_jobs(tmp_path / "spool")] == ["41"]


def test_a_bug_in_oomlens_is_an_error_outcome(
    tmp_path: Path, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(runner, "claim_job_directory", broken)
    outcome = _run(tmp_path, _env(job_dir))
    assert outcome.action == "error"
    assert outcome.problems == ("internal error: KeyError: 'surprise'",)
    (line,) = _log_lines(tmp_path / "spool")
    assert line["action"] == "error" and line["reason"] == "internal error: KeyError: 'surprise'"


@needs_root
def test_analysis_runs_as_the_jobs_user(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN a job of user nobody, whose log nobody can read
    log = job_dir / "train.41.log"
    log.write_text("x\n")
    os.chown(log, NOBODY, NOBODY)
    env = _env(job_dir, SLURM_JOB_USER="nobody", SLURM_JOB_UID=str(NOBODY),
               SLURM_JOB_GID=str(NOBODY))  # fmt: skip
    # WHEN
    outcome = _run(tmp_path, env)
    # THEN the analysis process was nobody, with nobody's group
    assert outcome.action == "analyzed"
    verdict = json.loads((tmp_path / "spool" / "41" / "verdict.json").read_text())
    assert (verdict["euid"], verdict["egid"]) == (NOBODY, NOBODY)
    assert outcome.record["identity"] == {"uid": NOBODY, "gid": NOBODY, "dropped": True}


@needs_root
def test_a_symlink_to_a_root_only_file_is_not_read(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN a job whose output was replaced by a link to a file only root may read
    secret = job_dir / "secret"
    secret.write_text("torch.OutOfMemoryError: CUDA out of memory. SECRET-7731\n")
    secret.chmod(0o600)
    (job_dir / "train.41.log").symlink_to(secret)
    env = _env(job_dir, SLURM_JOB_USER="nobody", SLURM_JOB_UID=str(NOBODY),
               SLURM_JOB_GID=str(NOBODY))  # fmt: skip
    # WHEN
    outcome = _run(tmp_path, env)
    # THEN the analysis (as nobody) could not read it, and nothing of it reached the spool
    assert outcome.action == "no_input"
    for path in (tmp_path / "spool").rglob("*"):
        if path.is_file():
            assert "SECRET-7731" not in path.read_text()


@needs_root
def test_root_does_not_read_files_of_an_unknown_user(tmp_path: Path, job_dir: Path) -> None:
    (job_dir / "train.41.log").write_text("x\n")
    env = _env(job_dir)
    for name in ("SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_JOB_GID"):
        del env[name]
    outcome = _run(tmp_path, env)
    assert outcome.action == "refused"
    assert "not reading its files as root" in outcome.record["reason"]


@needs_root
def test_reports_are_copied_into_the_work_dir_as_the_user(tmp_path: Path, job_dir: Path) -> None:
    # GIVEN a job of nobody in a work directory nobody owns, with a planted symlink
    (job_dir / "train.41.log").write_text("x\n")
    os.chown(job_dir, NOBODY, NOBODY)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (job_dir / "oomlens-41.html").symlink_to(victim)
    env = _env(job_dir, SLURM_JOB_USER="nobody", SLURM_JOB_UID=str(NOBODY),
               SLURM_JOB_GID=str(NOBODY))  # fmt: skip
    # WHEN
    outcome = _run(tmp_path, env, settings="copy_to_workdir = true\n")
    # THEN both reports are there, owned by nobody; the link was replaced, not followed
    assert outcome.action == "analyzed"
    for name in ("oomlens-41.json", "oomlens-41.html"):
        info = (job_dir / name).lstat()
        assert stat.S_ISREG(info.st_mode) and info.st_uid == NOBODY
    assert victim.read_text() == "precious\n"
    assert json.loads((job_dir / "oomlens-41.json").read_text())["verdict"] == "gpu_oom"
    assert outcome.record["workdir_copies"] == [
        str(job_dir / "oomlens-41.json"),
        str(job_dir / "oomlens-41.html"),
    ]


def test_no_copy_when_not_running_as_the_jobs_user(job_dir: Path) -> None:
    # An Epilog that is neither root nor the job's user (EpilogSlurmctld as SlurmUser) does not
    # write into the work directory.
    job = parse_job_environment(_env(job_dir, SLURM_JOB_UID=str(os.geteuid() + 1)))
    notes: list[str] = []
    written = copy_to_workdir(job, _analysis([]), notes)
    assert written == [] and "not as the job's user" in notes[0]
    assert not list(job_dir.glob("oomlens-*"))


def test_the_epilog_analysis_never_validates_with_deepspeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing DeepSpeed (and torch) costs the Epilog seconds and gigabytes: its analysis
    uses oomlens' own config checks."""
    from oomlens.analysis import ds_validation
    from oomlens.epilog.analysis import analyze_for_epilog
    from tests._corpus import case_dir

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the epilog validated a config with DeepSpeed")

    monkeypatch.setattr(ds_validation, "validate_with_deepspeed", refuse)
    result = analyze_for_epilog([str(case_dir("prefetch_overshoot"))])
    assert result.diagnosis == "prefetch_overshoot"
