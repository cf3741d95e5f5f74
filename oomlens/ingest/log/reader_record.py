"""How the log reader records the facts its matchers and state machines hand it: memory
samples, cache flushes, launcher and agent lines, the world size, kernel events, steps and
platform hints, each into its bounded collection.

``FactRecorder`` is a base of ``LogReader`` (``reader``): it holds no state of its own, only
the reader's collections declared below, which ``LogReader.__init__`` sets.  Each method adds
to them within their bounds (``MAX_STREAMS`` distinct ranks, pids and streams); none reads the
input, but ``agent`` looks behind for a time (``LineContext.time_before``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.kernel import FatalSignalLine, KernelOomKill, OomKillerInvoked, SlurmOomKill
from oomlens.facts.log import (
    CacheFlushWarning,
    ClosingSignal,
    KilledSubprocess,
    LauncherExit,
    MemorySample,
    PlatformHint,
    ProcessFailure,
    StepSample,
    WorldSize,
)
from oomlens.ingest.log import deepspeed, steps, torchrun
from oomlens.ingest.log.reader_context import LineContext
from oomlens.ingest.log.series import RunningStats, Thinned
from oomlens.ingest.log.state import BoundedList, MemoryKeeper, ReaderLimits, StreamState

MAX_STREAMS = 4096
_WORLD_PRIORITY = {
    "world_info": 0,
    "dist_world_size": 1,
    "config": 2,
    "config_dump": 3,
    "torchrun_summary": 4,
}


class FactRecorder(LineContext):
    """The fact-recording methods of ``LogReader``; see the module docstring."""

    limits: ReaderLimits
    memory: dict[tuple[int | None, str | None], MemoryKeeper]
    flushes: Thinned[CacheFlushWarning]
    flush_total: int
    flush_max: int
    flush_first: CacheFlushWarning | None
    flush_last: CacheFlushWarning | None
    pid_local_rank: dict[int, int]
    killed: BoundedList[KilledSubprocess]
    launcher_exits: BoundedList[LauncherExit]
    closing: BoundedList[ClosingSignal]
    failures: BoundedList[ProcessFailure]
    world: WorldSize | None
    kills: BoundedList[KernelOomKill]
    invocations: BoundedList[OomKillerInvoked]
    slurm: BoundedList[SlurmOomKill]
    fatal: BoundedList[FatalSignalLine]
    step_samples: Thinned[StepSample]
    last_step: int | None
    max_step: int | None
    loss: RunningStats
    last_step_sample: StepSample | None
    last_by_rank: dict[int | None, StepSample]
    progress_line: dict[int | None, int]
    """The line of each rank's last training progress (not a progress bar)."""
    platform: dict[str, PlatformHint]

    def flush_memory(self, stream: StreamState, cpu: tuple[int, float] | None) -> None:
        pending, stream.pending_memory = stream.pending_memory, None
        if pending is None:
            return
        ref, label, reading, when, step = pending
        sample = MemorySample(
            ref,
            label,
            reading.allocated,
            reading.max_allocated,
            reading.reserved,
            reading.max_reserved,
            cpu[0] if cpu else None,
            cpu[1] if cpu else None,
            step,
            when,
        )
        key = (ref.rank, ref.host)
        keeper = self.memory.get(key)
        if keeper is None:
            if len(self.memory) >= MAX_STREAMS:
                return
            keeper = self.memory[key] = MemoryKeeper(ref.rank, ref.host, self.limits)
        keeper.add(sample)

    def add_flush(self, warning: CacheFlushWarning) -> None:
        self.flushes.add(warning)
        self.flush_total += warning.flushes
        self.flush_max = max(self.flush_max, warning.flushes)
        if self.flush_first is None:
            self.flush_first = warning
        self.flush_last = warning

    def launcher(self, message: str, ref: SourceRef, when: datetime | None) -> None:
        line = deepspeed.parse_launcher_line(message)
        if line is None:
            return
        if line.kind == "spawned" and line.pid is not None and line.local_rank is not None:
            if len(self.pid_local_rank) < MAX_STREAMS:
                self.pid_local_rank[line.pid] = line.local_rank
        elif line.kind == "killing" and line.pid is not None:
            self.killed.add(
                KilledSubprocess(ref, line.pid, self.pid_local_rank.get(line.pid), when)
            )
        elif line.kind == "exit" and line.return_code is not None:
            self.launcher_exits.add(LauncherExit(ref, line.return_code, line.local_rank, when))

    def agent(
        self, message: str, ref: SourceRef, when: datetime | None, data: bytes, start: int
    ) -> bool:
        line = torchrun.parse_agent_line(message)
        if line is None:
            return False
        when = when or self.time_before(data, start)
        if line.kind == "closing" and line.pid is not None:
            self.closing.add(
                ClosingSignal(
                    ref, line.pid, line.signal or "", self.pid_local_rank.get(line.pid), when
                )
            )
            return True
        if (
            line.pid is not None
            and line.local_rank is not None
            and len(self.pid_local_rank) < MAX_STREAMS
        ):
            self.pid_local_rank[line.pid] = line.local_rank
        self.failures.add(
            ProcessFailure(
                source=ref,
                origin="torchrun_agent" if line.kind == "failed" else "mp_spawn",
                exitcode=line.exitcode,
                signal=line.signal,
                rank=None,
                local_rank=line.local_rank,
                pid=line.pid,
                host=ref.host,
                timestamp=when,
                root_cause=False,
                error_file=None,
                message=None,
                oom=None,
            )
        )
        return True

    def set_world(self, value: int | float, origin: str, ref: SourceRef) -> None:
        if self.world is None or _WORLD_PRIORITY[origin] < _WORLD_PRIORITY[self.world.origin]:
            self.world = WorldSize(value, origin, ref)

    def kernel_event(self, event: object) -> None:
        if isinstance(event, KernelOomKill):
            self.kills.add(event)
        elif isinstance(event, OomKillerInvoked):
            self.invocations.add(event)
        elif isinstance(event, SlurmOomKill):
            self.slurm.add(event)
        elif isinstance(event, FatalSignalLine):
            self.fatal.add(event)

    def add_step(self, reading: steps.StepReading, ref: SourceRef, when: datetime | None) -> None:
        if ref.rank is None and reading.rank is not None:
            ref = replace(ref, rank=reading.rank)
        sample = StepSample(
            ref,
            reading.kind,
            reading.step,
            reading.total,
            reading.loss,
            reading.epoch,
            reading.memory_allocated,
            reading.max_memory_allocated,
            reading.skipped,
            when,
        )
        self.step_samples.add(sample)
        if reading.step is not None:
            self.last_step = reading.step
            self.max_step = (
                reading.step if self.max_step is None else max(self.max_step, reading.step)
            )
        if reading.loss is not None and reading.loss == reading.loss:
            self.loss.add(reading.loss)
        self.last_step_sample = sample
        if ref.rank in self.last_by_rank or len(self.last_by_rank) < MAX_STREAMS:
            self.last_by_rank[ref.rank] = sample
            if reading.kind != "tqdm":  # a bar may be loading checkpoint shards
                self.progress_line[ref.rank] = ref.line or 0

    def add_platform(self, kind: str, ref: SourceRef, text: str) -> None:
        if kind not in self.platform:
            self.platform[kind] = PlatformHint(ref, kind, text[:300])
