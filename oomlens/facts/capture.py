"""Facts from a capture directory (``python -m oomlens.capture``): one ``RankCapture`` per
process, built by ``oomlens.ingest.capture`` from the process' events file and joined with its
series file (``CaptureSeries``) by ``join_captures``.

What a capture adds to what the log happened to print: the GPU memory series of every rank
(as a ``MemorySeries``, so the leak rule and the memory chart read it like DeepSpeed's
``see_memory_usage``), the host side (RSS, pinned and shared memory, the cgroup's usage, limit
and ``memory.events``), every out-of-memory the allocator reported with what NVML saw on the
device, the exception each rank died of, how each rank ended (an exit, an exception, or killed
without a word, and whether the cgroup counted an OOM kill then), the DeepSpeed config as
DeepSpeed resolved it, and the versions and settings in force.

Every fact cites the capture file and line it came from.  Times are naive local datetimes,
like the times printed in logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from oomlens.facts import SourceRef
from oomlens.facts.config import DumpedConfig
from oomlens.facts.log import ExceptionEvent, MemorySeries, OomEvent, SeriesStats


class CaptureEnd(StrEnum):
    """How a captured process ended."""

    EXITED = "exited"
    """It wrote its exit record (``exit_code`` says how)."""
    EXCEPTION = "exception"
    """An exception ended it (recorded with its traceback)."""
    KILLED = "killed"
    """No exit record: it disappeared (its watcher saw it go), as SIGKILL leaves a process."""
    VANISHED = "vanished"
    """No exit record and no watcher record: killed with its watcher, still running when
    the files were read, or the node went down."""


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host side of one capture sample (bytes)."""

    source: SourceRef
    timestamp: datetime | None
    rss: int | None
    rss_anon: int | None
    rss_shmem: int | None
    """Shared resident memory: where the kernel counts CUDA's pinned (page-locked) buffers."""
    pinned: int | None
    """Bytes torch's pinned host allocator holds."""
    cgroup_current: int | None
    cgroup_max: int | None
    oom_kill: int | None
    """The cgroup's ``memory.events`` ``oom_kill`` counter."""
    mem_available: int | None
    """The node's MemAvailable."""


@dataclass(frozen=True, slots=True)
class HostSeries:
    rank: int | None
    samples: tuple[HostSample, ...]
    """The first and last samples and a thinned middle."""
    total_samples: int
    rss: SeriesStats | None
    rss_shmem: SeriesStats | None
    cgroup_current: SeriesStats | None
    cgroup_max: int | None
    """The cgroup's limit (the last one read), None when unlimited or unknown."""
    last: HostSample | None

    @property
    def peak_cgroup_fraction(self) -> float | None:
        """The highest cgroup usage as a fraction of its limit."""
        if self.cgroup_current is None or not self.cgroup_max:
            return None
        return self.cgroup_current.maximum / self.cgroup_max


@dataclass(frozen=True, slots=True)
class NvmlProcess:
    pid: int
    bytes: int | None
    this_process: bool


@dataclass(frozen=True, slots=True)
class CapturedOom:
    """What the out-of-memory observer recorded when the allocator gave up (before the
    exception unwound): the request, the limit, the device's free memory, the allocator's
    counters, NVML's view of the device, and the snapshot it wrote."""

    source: SourceRef
    timestamp: datetime | None
    device: int | None
    requested: int | None
    limit: int | None
    """The allowed maximum when a per-process memory fraction is set, else the capacity."""
    device_free: int | None
    total: int | None
    allowed: int | None
    allocated: int | None
    reserved: int | None
    step: int | None
    snapshot: str | None
    """The snapshot file's name, when one was written."""
    snapshot_bytes: int | None
    dump_seconds: float | None
    snapshot_error: str | None
    stacks: bool
    """Python stacks were being recorded (the snapshot's blocks carry their call sites)."""
    processes: tuple[NvmlProcess, ...]
    """Every compute process NVML listed on the device (empty when NVML was unavailable)."""
    nvml_used: int | None
    nvml_total: int | None
    trace_kept: tuple[int, ...] | None = None
    """How many trace entries each device's history kept when the capture dropped the oldest
    to fit the snapshot within its disk budget; None when nothing was dropped."""

    @property
    def other_processes(self) -> tuple[NvmlProcess, ...]:
        return tuple(p for p in self.processes if not p.this_process)


@dataclass(frozen=True, slots=True)
class RankGone:
    """The watcher's record of the process disappearing."""

    source: SourceRef
    timestamp: datetime | None
    oom_kill_before: int | None
    oom_kill_after: int | None
    kernel_lines: int | None
    """Kernel log lines about the pid (written to ``rank<R>.kernel.log``); None when the kernel
    log was not readable."""

    @property
    def oom_kills(self) -> int | None:
        """How many OOM kills the cgroup counted while the process lived."""
        if self.oom_kill_before is None or self.oom_kill_after is None:
            return None
        return self.oom_kill_after - self.oom_kill_before


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """What the allocator recorded from here on, and why."""

    source: SourceRef
    timestamp: datetime | None
    stacks: bool
    reason: str
    step: int | None


@dataclass(frozen=True, slots=True)
class RankCapture:
    """Everything the capture recorded about one process (one rank)."""

    path: str
    """The events file (``rank<R>.events.jsonl``): what evidence cites."""
    process: str
    """Its files' directory and name prefix (``.../rank0``): what joins them."""
    series_path: str | None
    run: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    world_size_origin: str | None
    host: str | None
    pid: int | None
    started: datetime | None
    versions: tuple[tuple[str, str], ...]
    environment: tuple[tuple[str, str], ...]
    """The allocator, CUDA, NCCL and launcher variables in force."""
    cgroup_limit: int | None
    node_memory: int | None
    policies: tuple[PolicyChange, ...]
    notes: tuple[str, ...]
    """The capture's own remarks (no CUDA, an allocator backend without history...)."""
    memory: MemorySeries | None
    """GPU memory: after every step (label ``engine step`` / ``optimizer step``) and every
    second (``timer``)."""
    host_memory: HostSeries | None
    ooms: tuple[CapturedOom, ...]
    oom_count: int
    oom_events: tuple[OomEvent, ...]
    """The OOM exception the process died of, parsed like a log's (``origin="capture"``)."""
    exceptions: tuple[ExceptionEvent, ...]
    """Any other exception it died of."""
    end: CaptureEnd
    exit_code: int | None
    ended: datetime | None
    last_record: datetime | None
    last_step: int | None
    gone: RankGone | None
    ds_config: DumpedConfig | None
    """The DeepSpeed config as DeepSpeed resolved it (the engine's attributes and the JSON)."""
    params: int | None
    params_origin: str | None
    gpu_total: int | None
    gpu_allowed: int | None
    problems: tuple[str, ...]
    """What could not be read (lines cut by a kill, unknown records), bounded."""

    @property
    def source(self) -> SourceRef:
        return SourceRef(self.path, None, self.rank, self.host)

    @property
    def killed_for_memory(self) -> bool:
        """It disappeared without a word while its cgroup counted an OOM kill."""
        return (
            self.end is CaptureEnd.KILLED
            and self.gone is not None
            and (self.gone.oom_kills or 0) > 0
        )

    @property
    def stacks_recorded(self) -> bool:
        return any(p.stacks for p in self.policies)

    def with_series(self, series: CaptureSeries) -> RankCapture:
        """This process' capture with what its series file recorded."""
        memory = series.memory
        if memory is not None and (memory.rank, memory.host) != (self.rank, self.host):
            memory = replace(memory, rank=self.rank, host=self.host)
        host_memory = series.host_memory
        if host_memory is not None and host_memory.rank != self.rank:
            host_memory = replace(host_memory, rank=self.rank)
        times = [t for t in (self.last_record, series.last_record) if t is not None]
        return replace(
            self,
            series_path=series.path,
            memory=memory,
            host_memory=host_memory,
            last_record=max(times, default=None),
            problems=(self.problems + series.problems)[:MAX_PROBLEMS],
        )


MAX_PROBLEMS = 20


@dataclass(frozen=True, slots=True)
class CaptureSeries:
    """What one process' series file (``rank<R>.series.jsonl``) recorded, until it is joined
    with the process' events file (``join_captures``)."""

    path: str
    process: str
    """As ``RankCapture.process``: the events file it belongs with."""
    memory: MemorySeries | None
    host_memory: HostSeries | None
    last_record: datetime | None
    problems: tuple[str, ...]
    alone: RankCapture
    """The process as this file alone tells it (its header), for a series whose events file
    is not among the inputs."""


def join_captures(parts: Iterable[RankCapture | CaptureSeries]) -> tuple[RankCapture, ...]:
    """One ``RankCapture`` per process: each events file's joined with its series file, and
    series files without an events file on their own; by rank (unranked last), then path."""
    processes: list[RankCapture] = []
    series: dict[str, CaptureSeries] = {}
    for part in parts:
        if isinstance(part, RankCapture):
            processes.append(part)
        else:
            series.setdefault(part.process, part)
    joined = [p.with_series(series.pop(p.process)) if p.process in series else p for p in processes]
    joined.extend(s.alone for s in series.values())
    joined.sort(key=lambda r: (r.rank is None, r.rank or 0, r.path))
    return tuple(joined)
