"""oomlens as the Epilog of a real one-node SLURM cluster (slurmctld + slurmd on localhost).

Each test submits real jobs (as an unprivileged user, most of them) that replay a crash of the
real corpus, then checks what the Epilog left in its spools and that the node stayed IDLE:
slurmd drains a node whose Epilog fails or runs late.  ``Epilog=`` and ``EpilogSlurmctld=`` both
run ``contrib/slurm/oomlens-epilog.sh`` (each with its own spool), so both contexts are tested
on every job.  The fault tests break one thing each and check the Epilog still exits 0 within
its budget.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._corpus import case_dir, manifest
from tests.slurm.cluster import HARD_LIMIT, JobRun, SlurmCluster

pytestmark = pytest.mark.slow

BUDGET = 6.0
SETTINGS = f"budget_seconds = {BUDGET}\ncopy_to_workdir = true\n"
EPILOG_SLACK = 1.5
"""What an Epilog may take beyond its budget: bash, the wrapper, process start-up."""
HAS_HTML = importlib.util.find_spec("oomlens.render.html") is not None


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster with the default test settings and no fault injected."""
    slurm_cluster.settings.write_text(SETTINGS)
    slurm_cluster.fault_env.unlink(missing_ok=True)
    yield slurm_cluster
    slurm_cluster.fault_env.unlink(missing_ok=True)


def _run_job(
    cluster: SlurmCluster,
    name: str,
    script: str,
    *,
    files: dict[str, Path | bytes] | None = None,
    sbatch: tuple[str, ...] = (),
    as_root: bool = False,
) -> tuple[JobRun, Path]:
    """Submit ``script`` (bash) in a fresh work directory holding ``files``; wait for the end."""
    uid = 0 if as_root else cluster.test_uid
    job_dir = cluster.base / "jobs" / name
    job_dir.mkdir(parents=True)
    for file_name, content in (files or {}).items():
        if isinstance(content, Path):
            shutil.copy(content, job_dir / file_name)
        else:
            (job_dir / file_name).write_bytes(content)
    (job_dir / "job.sh").write_text("#!/bin/bash\n" + script + "\n")
    gid = 0 if as_root else pwd.getpwuid(uid).pw_gid
    for path in [job_dir, *job_dir.iterdir()]:
        os.chown(path, uid, gid)
    job_id = cluster.submit(
        "-J", name, "-D", str(job_dir), *sbatch, str(job_dir / "job.sh"),
        user=None if as_root else uid,
    )  # fmt: skip
    return cluster.wait(job_id), job_dir


def _assert_node_healthy(cluster: SlurmCluster, run: JobRun, budget: float = BUDGET) -> None:
    """Both Epilogs exited 0 within the budget, and the node is idle, not drained."""
    assert set(run.epilog_runs) == {"epilog_slurmd", "epilog_slurmctld"}
    for context, (status, seconds) in run.epilog_runs.items():
        assert status == 0, f"{context} exited {status}"
        assert seconds < budget + EPILOG_SLACK, f"{context} took {seconds:.2f} s"
    assert cluster.node_state() == "idle", cluster.node_reason()
    assert "epilog failed" not in cluster.slurmd_log()


def _record(spool: Path, run: JobRun) -> dict[str, Any]:
    return json.loads((spool / str(run.job_id) / "epilog.json").read_text())


def _verdict(spool: Path, run: JobRun) -> dict[str, Any]:
    return json.loads((spool / str(run.job_id) / "verdict.json").read_text())


def _log_line(spool: Path, run: JobRun) -> dict[str, Any]:
    lines = [json.loads(line) for line in (spool / "epilog.log").read_text().splitlines()]
    (line,) = [line for line in lines if line["job"] == str(run.job_id)]
    return line


def _expected(case: str, *, log_only: bool) -> tuple[str, str]:
    expected = manifest(case)["expected"]
    if log_only:
        expected = expected.get("log_only", expected)
    return expected["verdict"], expected["diagnosis"]


def _replay(case: str) -> dict[str, Path | bytes]:
    return {"train.log": case_dir(case) / "train.log"}


# ------------------------------------------------------------------------------ diagnoses


def test_failed_job_is_diagnosed_on_its_node(cluster: SlurmCluster) -> None:
    # GIVEN a job that replays the other_process crash to stderr, leaves the rank's snapshot
    # in its work directory, and exits 1
    files = {
        **_replay("other_process"),
        "snapshot_rank0.pickle": case_dir("other_process") / "snapshot_rank0.pickle",
    }
    # WHEN it runs on the cluster
    run, job_dir = _run_job(
        cluster, "other_process", "echo starting; cat train.log >&2; exit 1",
        files=files, sbatch=("-o", "out.%j", "-e", "err.%j"),
    )  # fmt: skip
    # THEN the job failed, and the slurmd Epilog wrote the right diagnosis
    assert (run.state, run.exit_code) == ("FAILED", "1:0")
    verdict = _verdict(cluster.spool, run)
    assert (verdict["verdict"], verdict["diagnoses"][0]["id"]) == _expected(
        "other_process", log_only=False
    )
    record = _record(cluster.spool, run)
    assert record["status"] == "analyzed" and record["diagnosis"] == "other_process"
    assert {Path(item["path"]).name for item in record["inputs"]} == {
        f"err.{run.job_id}",
        f"out.{run.job_id}",
        "snapshot_rank0.pickle",
    }
    assert (cluster.spool / str(run.job_id) / "report.html").exists() == HAS_HTML
    line = _log_line(cluster.spool, run)
    assert (line["action"], line["verdict"], line["diagnosis"]) == (
        "analyzed", "gpu_oom", "other_process",
    )  # fmt: skip
    # AND a copy for the user, owned by the user, in the work directory
    copy = job_dir / f"oomlens-{run.job_id}.json"
    assert copy.stat().st_uid == cluster.test_uid
    assert json.loads(copy.read_text())["diagnoses"][0]["id"] == "other_process"
    # AND the slurmctld Epilog came to the same diagnosis
    assert _verdict(cluster.ctld_spool, run)["diagnoses"][0]["id"] == "other_process"
    assert _record(cluster.ctld_spool, run)["job"]["context"] == "epilog_slurmctld"
    _assert_node_healthy(cluster, run)


def test_healthy_job_gets_no_report(cluster: SlurmCluster) -> None:
    run, job_dir = _run_job(cluster, "healthy", "echo all good; exit 0")
    assert (run.state, run.exit_code) == ("COMPLETED", "0:0")
    for spool in (cluster.spool, cluster.ctld_spool):
        assert not (spool / str(run.job_id)).exists()
        assert _log_line(spool, run)["action"] == "skipped"
    assert not list(job_dir.glob("oomlens-*"))
    _assert_node_healthy(cluster, run)


def test_default_output_file_and_the_work_dirs_config(cluster: SlurmCluster) -> None:
    # GIVEN a DeepSpeed job with neither -o nor -e (output in slurm-<id>.out) that leaves its
    # ds_config and per-rank snapshots in its work directory
    case = case_dir("memory_leak")
    files = {
        **_replay("memory_leak"),
        "ds_config.json": case / "ds_config.json",
        "snapshot_rank0.pickle": case / "snapshot_rank0.pickle",
        "snapshot_rank1.pickle": case / "snapshot_rank1.pickle",
    }
    run, _ = _run_job(cluster, "memory_leak", "cat train.log; exit 1", files=files)
    record = _record(cluster.spool, run)
    assert {Path(item["path"]).name for item in record["inputs"]} == {
        f"slurm-{run.job_id}.out",
        "ds_config.json",
        "snapshot_rank0.pickle",
        "snapshot_rank1.pickle",
    }
    verdict = _verdict(cluster.spool, run)
    assert (verdict["verdict"], verdict["diagnoses"][0]["id"]) == _expected(
        "memory_leak", log_only=False
    )
    _assert_node_healthy(cluster, run)


def test_job_name_in_the_output_pattern(cluster: SlurmCluster) -> None:
    # The slurmd Epilog does not know the job name: %x is found by listing the directory.
    run, _ = _run_job(
        cluster, "activation", "cat train.log >&2; exit 1",
        files=_replay("activation_memory"), sbatch=("-o", "%x-%j.log"),
    )  # fmt: skip
    for spool in (cluster.spool, cluster.ctld_spool):
        record = _record(spool, run)
        assert [Path(i["path"]).name for i in record["inputs"]] == [f"activation-{run.job_id}.log"]
        verdict = _verdict(spool, run)
        assert (verdict["verdict"], verdict["diagnoses"][0]["id"]) == _expected(
            "activation_memory", log_only=True
        )
    _assert_node_healthy(cluster, run)


def test_failed_step_of_a_script_that_exits_0(cluster: SlurmCluster) -> None:
    # The batch script hides the failure (exit 0); SLURM_JOB_DERIVED_EC still shows the step's.
    run, _ = _run_job(
        cluster, "step", "srun bash -c 'cat train.log >&2; exit 1'; exit 0",
        files=_replay("fragmentation"), sbatch=("-o", "step.%j.log"),
    )  # fmt: skip
    assert run.exit_code == "0:0"
    record = _record(cluster.spool, run)
    assert record["job"]["derived_status"] == {"raw": 256, "exit_code": 1, "signal": 0}
    verdict = _verdict(cluster.spool, run)
    assert (verdict["verdict"], verdict["diagnoses"][0]["id"]) == _expected(
        "fragmentation", log_only=True
    )
    _assert_node_healthy(cluster, run)


# --------------------------------------------------------------------------------- faults


def _inject(cluster: SlurmCluster, name: str, sitecustomize: str = "", **env: str) -> None:
    """Make the next Epilogs start Python with ``sitecustomize`` and/or extra variables."""
    lines = [f"export {key}={value}" for key, value in env.items()]
    if sitecustomize:
        directory = cluster.base / "inject" / name
        directory.mkdir(parents=True)
        (directory / "sitecustomize.py").write_text(sitecustomize)
        lines.append(f"export PYTHONPATH={directory}")
    cluster.fault_env.write_text("\n".join(lines) + "\n")


def test_unreadable_output(cluster: SlurmCluster) -> None:
    run, _ = _run_job(
        cluster, "unreadable", "cat train.log >&2; chmod 000 fault.$SLURM_JOB_ID.out; exit 1",
        files=_replay("other_process"), sbatch=("-o", "fault.%j.out"),
    )  # fmt: skip
    record = _record(cluster.spool, run)
    assert record["status"] == "no_input"
    assert any("Permission denied" in note for note in record["notes"])
    _assert_node_healthy(cluster, run)


def test_missing_output(cluster: SlurmCluster) -> None:
    run, _ = _run_job(
        cluster, "missing", "cat train.log >&2; rm -f gone.$SLURM_JOB_ID.out; exit 1",
        files=_replay("other_process"), sbatch=("-o", "gone.%j.out"),
    )  # fmt: skip
    record = _record(cluster.spool, run)
    assert record["status"] == "no_input"
    assert any("not found" in note for note in record["notes"])
    _assert_node_healthy(cluster, run)


def test_multi_gigabyte_log(cluster: SlurmCluster) -> None:
    # GIVEN a 3 GiB log (sparse: the job extends its own output file) with the crash at its end
    script = (
        "head -n 20 train.log; truncate -s +3G big.$SLURM_JOB_ID.out; tail -n +21 train.log; exit 1"
    )
    run, job_dir = _run_job(
        cluster, "huge", script, files=_replay("other_process"),
        sbatch=("-o", "big.%j.out", "--open-mode=append"),
    )  # fmt: skip
    assert (job_dir / f"big.{run.job_id}.out").stat().st_size > 3 * 1024**3
    # THEN it is analyzed from its head and tail, within the budget
    record = _record(cluster.spool, run)
    assert record["status"] == "analyzed"
    assert any("were not read" in note for note in record["notes"])
    assert _verdict(cluster.spool, run)["diagnoses"][0]["id"] == "other_process"
    _assert_node_healthy(cluster, run)


def test_broken_settings_file(cluster: SlurmCluster) -> None:
    cluster.settings.write_text("budget_seconds = [oops\n")
    run, job_dir = _run_job(
        cluster, "badsettings", "cat train.log >&2; exit 1", files=_replay("other_process")
    )
    line = _log_line(cluster.spool, run)
    assert line["action"] == "analyzed" and "not valid TOML" in line["problems"][0]
    assert not list(job_dir.glob("oomlens-*"))  # copies need a valid settings file
    _assert_node_healthy(cluster, run, budget=HARD_LIMIT - 2)


def test_analysis_that_hangs_past_the_budget(cluster: SlurmCluster) -> None:
    _inject(
        cluster, "hang",
        "import time\nimport oomlens.session\n\n"
        "def _hang(*args, **kwargs):\n    time.sleep(3600)\n\n"
        "oomlens.session.analyze = _hang\n",
    )  # fmt: skip
    run, _ = _run_job(cluster, "hang", "cat train.log >&2; exit 1", files=_replay("other_process"))
    record = _record(cluster.spool, run)
    assert record["status"] == "timed_out"
    assert record["inputs"][0]["path"].endswith(f"slurm-{run.job_id}.out")
    assert _log_line(cluster.spool, run)["action"] == "timed_out"
    seconds = run.epilog_runs["epilog_slurmd"][1]
    assert BUDGET - 1.5 < seconds, "the Epilog should have used its budget"
    _assert_node_healthy(cluster, run)


def test_a_bug_in_oomlens(cluster: SlurmCluster) -> None:
    _inject(
        cluster, "bug",
        "import oomlens.epilog.runner as runner\n\n"
        "def _broken(*args, **kwargs):\n    raise ZeroDivisionError('a bug')\n\n"
        "runner.claim_job_directory = _broken\n",
    )  # fmt: skip
    run, _ = _run_job(cluster, "bug", "cat train.log >&2; exit 1", files=_replay("other_process"))
    line = _log_line(cluster.spool, run)
    assert line["action"] == "error" and "ZeroDivisionError" in line["reason"]
    _assert_node_healthy(cluster, run)


def test_python_killed_at_start(cluster: SlurmCluster) -> None:
    _inject(cluster, "sigkill", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run, _ = _run_job(cluster, "sigkill", "exit 1")
    assert not (cluster.spool / str(run.job_id)).exists()
    _assert_node_healthy(cluster, run)


def test_oomlens_not_installed(cluster: SlurmCluster) -> None:
    _inject(cluster, "missing-bin", OOMLENS_EPILOG_BIN="/nonexistent/bin/oomlens")
    run, _ = _run_job(cluster, "nobin", "exit 1")
    assert not (cluster.spool / str(run.job_id)).exists()
    _assert_node_healthy(cluster, run)


class _RunsCommand:
    """Pickles as ``os.system(command)``: a snapshot that would run code if unpickled."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (self.command,))


def test_hostile_pickle_in_the_work_dir(cluster: SlurmCluster) -> None:
    marker = cluster.base / "pwned"
    hostile = pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=4)
    run, _ = _run_job(
        cluster, "hostile", "cat train.log >&2; exit 1",
        files={**_replay("other_process"), "snapshot_rank0.pickle": hostile},
    )  # fmt: skip
    assert not marker.exists()
    record = _record(cluster.spool, run)
    assert record["status"] == "analyzed"
    assert _verdict(cluster.spool, run)["diagnoses"][0]["id"] == "other_process"
    _assert_node_healthy(cluster, run)


def test_output_swapped_for_a_link_to_a_root_only_file(cluster: SlurmCluster) -> None:
    # GIVEN a file only root may read, that looks like a crash log
    secret = cluster.base / "secret.log"
    secret.write_text("torch.OutOfMemoryError: CUDA out of memory. SECRET-7731\n")
    secret.chmod(0o600)
    # WHEN a job replaces its own output with a link to it
    script = f"cat train.log; rm -f link.$SLURM_JOB_ID.out; ln -s {secret} link.$SLURM_JOB_ID.out"
    run, job_dir = _run_job(
        cluster, "symlink", script + "; exit 1",
        files=_replay("other_process"), sbatch=("-o", "link.%j.out"),
    )  # fmt: skip
    # THEN the Epilog read it as the job's user: not at all
    assert _record(cluster.spool, run)["status"] == "no_input"
    for path in [*cluster.spool.rglob("*"), *cluster.ctld_spool.rglob("*"), *job_dir.iterdir()]:
        if path.is_file() and not path.is_symlink():
            assert "SECRET-7731" not in path.read_text(errors="replace"), path
    _assert_node_healthy(cluster, run)


# ------------------------------------------------------------------------------ the sweeper


def test_the_sweeper_finishes_a_deferred_snapshot(cluster: SlurmCluster) -> None:
    # GIVEN a job that replays the fragmentation crash with its snapshot in the work directory,
    # and an Epilog whose max_snapshot_bytes is below that snapshot's size
    cluster.settings.write_text(SETTINGS + 'max_snapshot_bytes = "100 KiB"\n')
    snapshot = case_dir("fragmentation") / "snapshot_rank0.pickle"
    run, job_dir = _run_job(
        cluster, "deferred", "cat train.log >&2; exit 1",
        files={**_replay("fragmentation"), "snapshot_rank0.pickle": snapshot},
    )  # fmt: skip
    _assert_node_healthy(cluster, run)
    record = _record(cluster.spool, run)
    assert [Path(item["path"]).name for item in record["deferred"]] == ["snapshot_rank0.pickle"]
    # WHEN root's cron runs the sweeper (on a spool holding only this job: the session's
    # spool keeps one log line per job for the other tests)
    spool = cluster.base / f"sweep-spool-{run.job_id}"
    spool.mkdir(mode=0o700)
    shutil.copytree(cluster.spool / str(run.job_id), spool / str(run.job_id))
    done = subprocess.run(
        [str(cluster.oomlens_bin), "epilog", "--sweep", "--spool", str(spool),
         "--settings", str(cluster.settings), "--budget-per-job", "60"],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    # THEN it analyzed the snapshot as the job's user, and the verdict cites it
    assert done.returncode == 0, done.stderr
    sweep = json.loads((spool / str(run.job_id) / "sweep.json").read_text())
    assert sweep["status"] == "analyzed" and sweep["identity"]["uid"] == cluster.test_uid
    verdict = json.loads((spool / str(run.job_id) / "verdict.json").read_text())
    diagnosis = verdict["diagnoses"][0]
    assert diagnosis["id"] == "fragmentation"
    assert "snapshot" in {item["kind"] for item in diagnosis["evidence"]}
    assert (spool / str(run.job_id) / "report.html").exists() == HAS_HTML
    # AND the copy in the work directory (copy_to_workdir) is the new report, the user's file
    copy = job_dir / f"oomlens-{run.job_id}.json"
    assert json.loads(copy.read_text()) == verdict
    assert copy.stat().st_uid == cluster.test_uid
