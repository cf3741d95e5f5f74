"""Reading the job from the Epilog environment Slurm really hands over (measured on 22.05)."""

from __future__ import annotations

import pytest

from oomlens.epilog.environment import (
    ScriptContext,
    WaitStatus,
    first_host,
    parse_job_environment,
)
from tests.epilog._assets import measured_environment


@pytest.mark.parametrize(
    ("raw", "exit_code", "signal", "text"),
    [
        (0, 0, 0, "ok"),
        (256, 1, 0, "exit 1"),
        (512, 2, 0, "exit 2"),
        (1280, 5, 0, "exit 5"),
        (35072, 137, 0, "exit 137"),
        (9, 0, 9, "signal 9"),
        (768, 3, 0, "exit 3"),
        (0x80 | 11, 0, 11, "signal 11"),  # core dumped
    ],
)
def test_wait_status_decodes_raw_statuses(raw: int, exit_code: int, signal: int, text: str) -> None:
    status = WaitStatus(raw)
    assert (status.exit_code, status.signal, status.describe()) == (exit_code, signal, text)
    assert status.failed == (raw != 0)


def test_slurmd_epilog_of_a_failed_job() -> None:
    # GIVEN what slurmd gave the Epilog of `exit 2` with -o '...%J-%s...'
    env = measured_environment("slurm-22.05", 1, "slurmd")
    # WHEN
    job = parse_job_environment(env)
    # THEN
    assert job.job_id == "1"
    assert job.user == "root" and job.uid == 0 and job.gid == 0
    assert job.exit_status == WaitStatus(512) and str(job.exit_pair) == "2:0"
    assert job.failed
    assert job.context is ScriptContext.EPILOG_SLURMD
    assert job.node_name == "localhost" and job.nodelist == "localhost"
    assert job.stdout_pattern is not None and job.stdout_pattern.endswith("%a.out")
    assert job.stderr_pattern is None
    assert job.job_name is None and job.array_job_id is None
    assert job.work_dir == "/tmp/slx/b1/jobs"
    assert job.problems == ()


def test_slurmctld_epilog_knows_name_nodelist_and_array_ids() -> None:
    env = measured_environment("slurm-22.05", 6, "slurmctld")
    job = parse_job_environment(env)
    assert job.context is ScriptContext.EPILOG_SLURMCTLD
    assert job.job_name == "arr"
    assert (job.array_job_id, job.array_task_id) == ("4", "4")
    assert job.nodelist == "localhost" and job.node_name is None
    assert job.failed


def test_a_failed_step_fails_a_job_whose_script_exited_0() -> None:
    job = parse_job_environment(measured_environment("slurm-22.05", 5, "slurmd"))
    assert job.exit_status == WaitStatus(0)
    assert job.derived_status == WaitStatus(768)
    assert job.failed
    assert job.describe_exit() == "0:0 (a step: exit 3)"


@pytest.mark.parametrize(
    ("job", "failed", "exit_text"),
    [
        (1, True, "5:0"),  # exit 5, no -o
        (2, True, "0:9"),  # the script SIGKILLed
        (3, True, "137:0 (a step: signal 9)"),  # a step SIGKILLed, then exit 137
        (4, False, "0:0"),  # scancel: the Epilog sees 0:0
    ],
)
def test_measured_exit_statuses(job: int, failed: bool, exit_text: str) -> None:
    parsed = parse_job_environment(measured_environment("slurm-22.05-b", job, "slurmd"))
    assert parsed.failed is failed
    assert parsed.describe_exit() == exit_text


def test_exit_code2_alone_decides_when_raw_statuses_are_missing() -> None:
    job = parse_job_environment({"SLURM_JOB_ID": "3", "SLURM_JOB_EXIT_CODE2": "0:15"})
    assert job.failed and job.exit_status is None


def test_nothing_known_is_not_a_failure() -> None:
    job = parse_job_environment({"SLURM_JOB_ID": "3"})
    assert not job.failed


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLURM_JOB_ID", "../../etc"),
        ("SLURM_JOB_ID", "12 3"),
        # digits of other scripts: str.isdigit and a str pattern's \d take them, Slurm never
        # writes them, and a spool directory must not be named by them
        ("SLURM_JOB_ID", "\u0661\u0662\u0663"),
        ("SLURM_JOB_ID", "\uff14\uff12"),
        ("SLURM_JOB_UID", "\u0969"),
        ("SLURM_JOB_EXIT_CODE", "\u0661"),
        ("SLURM_JOB_UID", "-1"),
        ("SLURM_JOB_EXIT_CODE", "abc"),
        ("SLURM_JOB_EXIT_CODE2", "1"),
        ("SLURM_JOB_WORK_DIR", "x" * 5000),
        ("SLURM_JOB_USER", "a\x00b"),
    ],
)
def test_bad_values_become_none_and_a_problem(name: str, value: str) -> None:
    job = parse_job_environment({"SLURM_JOB_ID": "5", name: value})
    assert len(job.problems) == 1 and job.problems[0].startswith(name)
    field = {
        "SLURM_JOB_ID": job.job_id,
        "SLURM_JOB_UID": job.uid,
        "SLURM_JOB_EXIT_CODE": job.exit_status,
        "SLURM_JOB_EXIT_CODE2": job.exit_pair,
        "SLURM_JOB_WORK_DIR": job.work_dir,
        "SLURM_JOB_USER": job.user,
    }[name]
    assert field is None


def test_null_account_and_unknown_context() -> None:
    job = parse_job_environment(
        {"SLURM_JOB_ID": "1", "SLURM_JOB_ACCOUNT": "(null)", "SLURM_SCRIPT_CONTEXT": "prolog_x"}
    )
    assert job.context is ScriptContext.UNKNOWN and job.problems == ()


def test_requeued_job_has_its_own_spool_key() -> None:
    assert parse_job_environment({"SLURM_JOB_ID": "42"}).spool_key == "42"
    requeued = parse_job_environment({"SLURM_JOB_ID": "42", "SLURM_JOB_RESTART_COUNT": "2"})
    assert requeued.spool_key == "42.r2"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("localhost", "localhost"),
        ("node[07-09,12],gpu1", "node07"),
        ("gpu1,node[07-09]", "gpu1"),
        ("rack[1-2]-n[01-04]", "rack1-n01"),
        ("n[3,1]", "n3"),
        ("node[abc]", None),
        ("node[1-2", None),
        ("", None),
    ],
)
def test_first_host_of_a_hostlist(nodelist: str, first: str | None) -> None:
    assert first_host(nodelist) == first
