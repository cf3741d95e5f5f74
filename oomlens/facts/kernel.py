"""Facts from the kernel and the scheduler: OOM kills, cgroup limits, fatal signals.

They come from separate kernel-log inputs (``dmesg``, ``dmesg -T``, ``journalctl -k``) and
from lines inside training logs (slurmstepd and srun print into the job's output).  Sizes are
bytes; times are naive datetimes as printed (``None`` when the line has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from oomlens.facts import SourceRef


@dataclass(frozen=True, slots=True)
class KernelOomKill:
    """``Out of memory: Killed process N (name) total-vm:..kB, anon-rss:..kB, ...``.

    ``cgroup`` is True for ``Memory cgroup out of memory: Killed process``: a container or job
    limit was hit, not the whole machine's memory.
    """

    source: SourceRef
    pid: int
    process_name: str
    cgroup: bool
    total_vm: int | None
    anon_rss: int | None
    file_rss: int | None
    shmem_rss: int | None
    timestamp: datetime | None
    uptime_seconds: float | None
    """The ``[  123.456789]`` dmesg stamp (seconds since boot), when the line has one."""


@dataclass(frozen=True, slots=True)
class OomKillerInvoked:
    """``<name> invoked oom-killer: gfp_mask=..., order=N`` or the ``oom-kill:constraint=`` line."""

    source: SourceRef
    process_name: str | None
    constraint: str | None
    """``CONSTRAINT_NONE`` (whole machine), ``CONSTRAINT_MEMCG`` (a cgroup limit), ..."""
    memcg: str | None
    """The cgroup whose limit was hit (``oom_memcg=``)."""
    task: str | None
    pid: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class SlurmOomKill:
    """slurmstepd ``Detected N oom-kill event(s) in step X`` or srun ``task N: Out Of Memory``."""

    source: SourceRef
    count: int | None
    step_id: str | None
    node: str | None
    task: int | None
    timestamp: datetime | None


class FatalSignalKind(StrEnum):
    """What a shell, the C runtime or torch printed when a process died of a signal."""

    SIGKILL = "SIGKILL"
    """``Killed`` from a shell: usually the OOM killer."""
    SIGBUS = "SIGBUS"
    """``Bus error``: typically a /dev/shm too small for DataLoader workers or NCCL."""
    SIGABRT = "SIGABRT"
    """``Aborted (core dumped)`` / ``terminate called after throwing``."""
    SIGSEGV = "SIGSEGV"
    SHM_EXHAUSTED = "shm_exhausted"
    """DataLoader's ``insufficient shared memory (shm)`` message."""
    SCHEDULER_CANCELLED = "scheduler_cancelled"
    """Slurm's ``*** JOB N ON NODE CANCELLED AT T DUE TO TIME LIMIT ***`` (or ``STEP N.M``;
    ``DUE TO PREEMPTION``, ``NODE FAILURE``..., or no reason: a user's ``scancel``)."""
    TASK_EXITED = "task_exited"
    """srun's ``srun: error: NODE: task N: Exited with exit code C``."""


@dataclass(frozen=True, slots=True)
class FatalSignalLine:
    """A line saying a process died of a signal, or that shared memory ran out."""

    source: SourceRef
    kind: FatalSignalKind
    text: str
    timestamp: datetime | None


KernelEvent = KernelOomKill | OomKillerInvoked | SlurmOomKill | FatalSignalLine


@dataclass(frozen=True, slots=True)
class KernelLogFacts:
    """What a kernel-log input says; built by ``oomlens.ingest.log.kernel.read_kernel_log``."""

    path: str
    lines: int
    oom_kills: tuple[KernelOomKill, ...]
    oom_invocations: tuple[OomKillerInvoked, ...]
    slurm_oom_kills: tuple[SlurmOomKill, ...]
    fatal_signals: tuple[FatalSignalLine, ...]
    events_dropped: int
    """Events beyond the kept maximum (counted, not kept)."""
