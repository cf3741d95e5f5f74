"""A real one-node SLURM cluster on localhost for tests (Debian's slurm-wlm and munge).

Follows ``shared/docs/slurm-one-node-recipe.md``, with everything private to one temporary
directory so that it collides with nothing else on the machine: its own munged socket
(``AuthInfo=socket=``), free TCP ports, state and spool directories, and pid-tracked daemons
(started with ``subprocess.Popen``, stopped by pid, SIGTERM then SIGKILL).

The Epilog is ``<base>/epilog.sh``: it sources ``<base>/epilog.env`` when present (tests put
fault injections there), runs ``contrib/slurm/oomlens-epilog.sh``, and appends
``job, context, exit status, start, end`` to ``<base>/epilog-runs.tsv`` before exiting with the
script's status, so that a test sees what slurmd saw.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EPILOG_SCRIPT = REPO_ROOT / "contrib" / "slurm" / "oomlens-epilog.sh"
TEST_USER = "oomlens-slurmtest"
PACKAGES = ("slurm-wlm", "munge")
PROLOG_EPILOG_TIMEOUT = 20
HARD_LIMIT = 10


def why_not_runnable() -> str | None:
    """Why a real cluster cannot be brought up here, or None when it can."""
    if sys.platform != "linux":
        return "real-SLURM tests need Linux"
    if os.geteuid() != 0:
        return "real-SLURM tests need root (slurmd runs jobs as their users)"
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None and not shutil.which("apt-get"):
        return "slurm-wlm is not installed and apt-get is not available to install it"
    return None


def install_packages() -> float:
    """Install slurm-wlm and munge with apt when slurmctld is missing; returns the seconds."""
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") and shutil.which(
        "munged", path="/usr/sbin"
    ):
        return 0.0
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        check=True,
        env=env,
        timeout=600,
    )
    return time.monotonic() - started


def ensure_test_user(name: str = TEST_USER) -> tuple[int, int, bool]:
    """The unprivileged user test jobs run as: (uid, gid, created by this call)."""
    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid, False
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--home-dir", "/nonexistent", "--shell", "/bin/sh", name],
        check=True,
        timeout=60,
    )  # fmt: skip
    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid, True


def remove_test_user(name: str = TEST_USER) -> None:
    subprocess.run(["userdel", name], check=False, timeout=60)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class JobRun:
    """A finished job as the test sees it."""

    job_id: int
    state: str
    exit_code: str
    epilog_runs: dict[str, tuple[int, float]]
    """context -> (exit status, seconds) of each Epilog run for this job."""


class SlurmCluster:
    """slurmctld + slurmd (+ a private munged) on localhost, under ``base``.

    With ``oomlens_bin``, ``Epilog=`` and ``EpilogSlurmctld=`` run oomlens' Epilog script;
    without, the cluster has no Epilog (for tests that only submit jobs).
    """

    def __init__(
        self, base: Path, oomlens_bin: Path | None = None, test_uid: int | None = None
    ) -> None:
        self.base = base
        self.oomlens_bin = oomlens_bin
        self.test_uid = test_uid
        """The unprivileged user that most test jobs run as."""
        self.conf = base / "slurm.conf"
        self.spool = base / "spool-slurmd"
        self.ctld_spool = base / "spool-slurmctld"
        self.settings = base / "epilog.toml"
        self.runs_file = base / "epilog-runs.tsv"
        self.fault_env = base / "epilog.env"
        self.munge_socket = base / "munge" / "munge.socket"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "SLURM_CONF": str(self.conf),
            "LANG": "C.UTF-8",
        }

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> float:
        """Bring the cluster up; returns the seconds until the node is idle."""
        started = time.monotonic()
        for sub in ("state", "slurmd-spool", "log", "jobs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._start_munged()
        if self.oomlens_bin is not None:
            self._write_epilogs()
        self._write_conf()
        logs = self.base / "log"
        self._spawn(
            ["/usr/sbin/slurmctld", "-D", "-c", "-f", str(self.conf)], logs / "slurmctld.stdout"
        )
        self._spawn(
            ["/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", str(self.conf)],
            logs / "slurmd.stdout",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.node_state() == "idle":
                return time.monotonic() - started
            time.sleep(0.1)
        raise RuntimeError(f"the node did not become idle: {self.node_state()!r}\n{self.logs()}")

    def stop(self) -> None:
        """Stop the daemons by pid, newest first: SIGTERM, then SIGKILL after 5 s."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        self.processes.clear()

    def _spawn(
        self, argv: Sequence[str], output: Path, **kwargs: object
    ) -> subprocess.Popen[bytes]:
        with open(output, "wb") as sink:
            process = subprocess.Popen(  # type: ignore[call-overload]
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
                cwd=self.base,
                **kwargs,
            )
        self.processes.append(process)
        return process

    def _start_munged(self) -> None:
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(mode=0o755)
        entry = pwd.getpwnam("munge")
        os.chown(munge_dir, entry.pw_uid, entry.pw_gid)
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            subprocess.run(
                ["runuser", "-u", "munge", "--", "mungekey", "--create", f"--keyfile={key}"],
                check=True,
                timeout=60,
            )
        self._spawn(
            ["/usr/sbin/munged", "-F", f"--socket={self.munge_socket}",
             f"--pid-file={munge_dir / 'munged.pid'}", f"--seed-file={munge_dir / 'munged.seed'}",
             f"--log-file={munge_dir / 'munged.log'}"],
            self.base / "log" / "munged.stdout",
            user=entry.pw_uid,
            group=entry.pw_gid,
            extra_groups=[],
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not create its socket")
            time.sleep(0.05)

    def _write_epilogs(self) -> None:
        for context, spool in (("slurmd", self.spool), ("slurmctld", self.ctld_spool)):
            wrapper = self.base / f"epilog-{context}.sh"
            wrapper.write_text(
                f"""#!/bin/bash
started=$(/bin/date +%s.%N)
export OOMLENS_EPILOG_BIN={self.oomlens_bin}
export OOMLENS_EPILOG_SETTINGS={self.settings}
export OOMLENS_EPILOG_SPOOL={spool}
export OOMLENS_EPILOG_HARD_LIMIT={HARD_LIMIT}
[ -f {self.fault_env} ] && . {self.fault_env}
{EPILOG_SCRIPT}
rc=$?
ended=$(/bin/date +%s.%N)
/bin/echo "$SLURM_JOB_ID	$SLURM_SCRIPT_CONTEXT	$rc	$started	$ended" >> {self.runs_file}
exit $rc
"""
            )
            wrapper.chmod(0o755)

    def _write_conf(self) -> None:
        node_line = subprocess.run(
            ["/usr/sbin/slurmd", "-C"], check=True, capture_output=True, text=True, timeout=60
        ).stdout.splitlines()[0]
        node_line = "NodeName=localhost " + node_line.split(" ", 1)[1]
        base = self.base
        epilogs = (
            f"Epilog={base}/epilog-slurmd.sh\nEpilogSlurmctld={base}/epilog-slurmctld.sh\n"
            f"PrologEpilogTimeout={PROLOG_EPILOG_TIMEOUT}\n"
            if self.oomlens_bin is not None
            else ""
        )
        self.conf.write_text(
            f"""ClusterName=oomtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/slurmd-spool
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
MinJobAge=300
{epilogs}{node_line} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        )

    # ------------------------------------------------------------------------------- queries

    def command(self, *argv: str, user: int | None = None) -> str:
        result = subprocess.run(
            list(argv),
            check=True,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            cwd=self.base,
            user=user,
            extra_groups=None if user is None else [],
            group=None if user is None else pwd.getpwuid(user).pw_gid,
        )
        return result.stdout

    def node_state(self) -> str:
        try:
            return self.command("/usr/bin/sinfo", "-h", "-N", "-o", "%T").strip()
        except subprocess.CalledProcessError:
            return ""

    def node_reason(self) -> str:
        return self.command("/usr/bin/sinfo", "-h", "-N", "-o", "%T %E").strip()

    def submit(self, *sbatch_args: str, user: int | None = None) -> int:
        """``sbatch --parsable ARGS`` as ``user`` (uid); returns the job id."""
        out = self.command("/usr/bin/sbatch", "--parsable", *sbatch_args, user=user)
        return int(out.strip().split(";")[0])

    def run(self, argv: Sequence[str], cwd: Path, extra_env: dict[str, str]) -> str:
        """Run a client command (``bash -c ...``, ``sbatch ...``) as root; its stdout."""
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            capture_output=True,
            text=True,
            env={**self.env, **extra_env},
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def wait_until_gone(self, job_ids: Sequence[str], timeout: float) -> None:
        """Wait until no job (or array task) of ``job_ids`` is queued or running."""
        deadline = time.monotonic() + timeout
        while True:
            queued = self.command("/usr/bin/squeue", "-h", "-j", ",".join(job_ids)).strip()
            if not queued:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still queued: {queued}\n{self.logs()}")
            time.sleep(0.25)

    def job_states(self, job_id: str) -> list[str]:
        """``State ExitCode`` of a job (every task of an array) as scontrol reports them."""
        out = self.command("/usr/bin/scontrol", "-o", "show", "job", job_id)
        states = []
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            states.append(f"{fields.get('JobState')} {fields.get('ExitCode')}")
        return states

    def epilog_runs(self, job_id: int) -> dict[str, tuple[int, float]]:
        runs: dict[str, tuple[int, float]] = {}
        if not self.runs_file.exists():
            return runs
        for line in self.runs_file.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 5 and fields[0] == str(job_id):
                runs[fields[1]] = (int(fields[2]), float(fields[4]) - float(fields[3]))
        return runs

    def wait(self, job_id: int, timeout: float = 90.0) -> JobRun:
        """Wait until the job has left the queue and both Epilogs have finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queued = self.command("/usr/bin/squeue", "-h", "-j", str(job_id)).strip()
            runs = self.epilog_runs(job_id)
            if not queued and len(runs) == 2:
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"job {job_id} did not finish\n{self.logs()}")
        info = self.command("/usr/bin/scontrol", "show", "job", "-o", str(job_id))
        fields = dict(item.split("=", 1) for item in info.split() if "=" in item)
        return JobRun(job_id, fields.get("JobState", "?"), fields.get("ExitCode", "?"), runs)

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.base / "log" / name
            if path.exists():
                parts.append(f"--- {name} (tail)\n" + "\n".join(
                    path.read_text(errors="replace").splitlines()[-40:]))  # fmt: skip
        return "\n".join(parts)

    def slurmd_log(self) -> str:
        path = self.base / "log" / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""
