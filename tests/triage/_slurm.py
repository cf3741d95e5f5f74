"""A real one-node SLURM cluster on localhost for the job-array test.

Follows ``shared/docs/slurm-one-node-recipe.md`` (Debian's slurm-wlm and munge), with all its
state in one temporary directory: a private munged socket (``AuthInfo=socket=``), free TCP
ports, its own state and spool directories, and daemons started with ``Popen`` and stopped by
pid (SIGTERM, then SIGKILL).  Jobs run as root, with the test's environment.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"


def why_not_available() -> str | None:
    """Why a cluster cannot be brought up here, or None when it can."""
    if os.geteuid() != 0:
        return "a real SLURM cluster needs root"
    for program in (SLURMCTLD, SLURMD, MUNGED):
        if not os.access(program, os.X_OK):
            return f"{program} is not installed (apt-get install slurm-wlm munge)"
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no munge user"
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class OneNodeSlurm:
    """slurmctld + slurmd + munged under ``base``; ``env`` is what clients need."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "slurm.conf"
        self.munge_socket = base / "munge" / "munge.socket"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> None:
        for sub in ("state", "spool", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(mode=0o755)
        munge = pwd.getpwnam("munge")
        os.chown(munge_dir, munge.pw_uid, munge.pw_gid)
        self._spawn(
            [MUNGED, "-F", f"--socket={self.munge_socket}",
             f"--pid-file={munge_dir / 'munged.pid'}", f"--seed-file={munge_dir / 'seed'}",
             f"--log-file={munge_dir / 'munged.log'}"],
            "munged",
            user=munge.pw_uid, group=munge.pw_gid, extra_groups=[],
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise RuntimeError("munged did not start: " + self._log("munged"))
            time.sleep(0.05)
        node = subprocess.run(
            [SLURMD, "-C"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.splitlines()[0]
        node = "NodeName=localhost " + node.split(" ", 1)[1]
        self.conf.write_text(
            f"""ClusterName=oomlens
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={self.base / "state"}
SlurmdSpoolDir={self.base / "spool"}
SlurmctldPidFile={self.base / "slurmctld.pid"}
SlurmdPidFile={self.base / "slurmd.pid"}
SlurmctldLogFile={self.base / "log" / "slurmctld.log"}
SlurmdLogFile={self.base / "log" / "slurmd.log"}
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
MinJobAge=300
{node} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        )
        self._spawn([SLURMCTLD, "-D", "-c", "-f", str(self.conf)], "slurmctld")
        self._spawn([SLURMD, "-D", "-N", "localhost", "-f", str(self.conf)], "slurmd")
        while self.node_state() != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the node is {self.node_state()!r}: " + self._log("slurmctld.log")
                )
            time.sleep(0.1)

    def node_state(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env
        )
        return done.stdout.strip()

    def run(self, argv: list[str], cwd: Path, extra_env: dict[str, str]) -> str:
        """Run a client command (``bash -c ...``, ``sbatch ...``); its stdout."""
        done = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            env={**self.env, **extra_env},
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def wait_until_gone(self, job_ids: list[str], timeout: float) -> None:
        """Wait until no job (or array task) of ``job_ids`` is queued or running."""
        deadline = time.monotonic() + timeout
        while True:
            queued = subprocess.run(
                ["squeue", "-h", "-j", ",".join(job_ids)],
                capture_output=True,
                text=True,
                env=self.env,
            ).stdout.strip()
            if not queued:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still queued: {queued}")
            time.sleep(0.25)

    def job_states(self, job_id: str) -> list[str]:
        """``State ExitCode`` of a job (every task of an array) as scontrol reports them."""
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id],
            capture_output=True,
            text=True,
            env=self.env,
        ).stdout
        states = []
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            states.append(f"{fields.get('JobState')} {fields.get('ExitCode')}")
        return states

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        self.processes.clear()

    def _spawn(self, argv: list[str], name: str, **kwargs: object) -> None:
        with open(self.base / "log" / f"{name}.out", "wb") as sink:
            process = subprocess.Popen(  # type: ignore[call-overload]
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.base,
                **kwargs,
            )
        self.processes.append(process)

    def _log(self, name: str) -> str:
        for path in (self.base / "log" / name, self.base / "log" / f"{name}.out"):
            if path.exists():
                return path.read_text(errors="replace")[-3000:]
        return "(no log)"
