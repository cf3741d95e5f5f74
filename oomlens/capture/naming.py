"""Who this process is (rank, local rank, world size, restart) and where its files go, from
the environment launchers set, so that the ranks of one run write into one directory.

The run's directory name, first found wins:

1. ``OOMLENS_CAPTURE_RUN`` (also exported by the capture for child processes);
2. ``slurm-<SLURM_JOB_ID>`` (``slurm-<array job>_<task>`` for array tasks): every rank of a job;
3. ``torchrun-<TORCHELASTIC_RUN_ID>`` when torchrun has a real run id (``--rdzv-id``,
   ``--standalone``);
4. for a process a launcher started (``LOCAL_RANK`` set: torchrun, ``deepspeed``, accelerate),
   the launcher's start time and pid, ``YYYYmmdd-HHMMSS-<ppid>``: the same for its ranks;
5. otherwise the process' own start time and pid.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int | None
    """Global rank from ``RANK`` (torchrun, deepspeed, accelerate), ``SLURM_PROCID``,
    ``OMPI_COMM_WORLD_RANK`` or ``PMI_RANK``; None when nothing says (one process)."""
    local_rank: int | None
    world_size: int | None
    restart: int
    """``TORCHELASTIC_RESTART_COUNT``: torchrun's restart of the same run."""
    launched: bool
    """A launcher started this process (it set ``LOCAL_RANK`` or a global rank)."""
    host: str
    pid: int


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def identity(env: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if env is None else env
    rank = _int(env.get("RANK"))
    world = _int(env.get("WORLD_SIZE"))
    if rank is None and (_int(env.get("SLURM_NTASKS")) or 0) > 1:
        rank, world = _int(env.get("SLURM_PROCID")), _int(env.get("SLURM_NTASKS"))
    if rank is None:
        for rank_var, size_var in (
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
        ):
            if env.get(rank_var) is not None:
                rank, world = _int(env.get(rank_var)), _int(env.get(size_var))
                break
    local = _int(env.get("LOCAL_RANK"))
    if local is None:
        local = _int(env.get("SLURM_LOCALID")) if rank is not None else None
    try:
        host = socket.gethostname().split(".", 1)[0] or "localhost"
    except OSError:
        host = "localhost"
    return Identity(
        rank=rank,
        local_rank=local,
        world_size=world,
        restart=_int(env.get("TORCHELASTIC_RESTART_COUNT")) or 0,
        launched=env.get("LOCAL_RANK") is not None or rank is not None,
        host=host,
        pid=os.getpid(),
    )


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        with open("/proc/stat", "rb") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def safe_name(text: str) -> str:
    """``text`` usable as one path component."""
    cleaned = _SAFE.sub("_", text).strip("._") or "run"
    return cleaned[:120]


def run_name(ident: Identity, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The run's directory name and what it was taken from (see the module docstring)."""
    env = os.environ if env is None else env
    given = env.get("OOMLENS_CAPTURE_RUN")
    if given:
        return safe_name(given), "OOMLENS_CAPTURE_RUN"
    job = env.get("SLURM_JOB_ID")
    if job:
        array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        if array_job and task:
            return safe_name(f"slurm-{array_job}_{task}"), "SLURM_ARRAY_JOB_ID/TASK_ID"
        return safe_name(f"slurm-{job}"), "SLURM_JOB_ID"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id.lower() != "none":
        return safe_name(f"torchrun-{run_id}"), "TORCHELASTIC_RUN_ID"
    pid = os.getppid() if ident.launched else ident.pid
    started = _start_time(pid)
    if started is None:
        started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    origin = "the launcher's start time and pid" if ident.launched else "the process' start"
    return f"{stamp}-{pid}", origin


def file_prefix(ident: Identity, directory: str) -> str:
    """``rank<R>`` (``-restart<N>`` after a torchrun restart); ``-pid<P>`` appended when another
    process of the same rank already wrote there."""
    prefix = f"rank{ident.rank if ident.rank is not None else 0}"
    if ident.restart:
        prefix += f"-restart{ident.restart}"
    if os.path.exists(os.path.join(directory, f"{prefix}.events.jsonl")):
        prefix += f"-pid{ident.pid}"
    return prefix
