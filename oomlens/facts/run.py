"""Everything known about one run: the facts of every input plus the facts derived from them.

``RunFacts`` is what rules read.  It is derived once by ``oomlens.derive.run`` and never
changed.
Helper methods answer the questions several rules ask (the OOM events of every input, the
memory limit in force, the world size...), so that no rule re-derives them differently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from oomlens.facts import SourceRef
from oomlens.facts.account import MemoryAccount
from oomlens.facts.capture import RankCapture
from oomlens.facts.config import ConfigReading
from oomlens.facts.context import RunContext
from oomlens.facts.kernel import KernelLogFacts, KernelOomKill
from oomlens.facts.log import (
    AllocatorSummary,
    ErrorFileFacts,
    ExceptionEvent,
    LogFacts,
    MemorySeries,
    OomEvent,
    OomKind,
    StepSample,
)
from oomlens.facts.memory_model import MemoryModelFacts
from oomlens.facts.ranks import RankPicture
from oomlens.facts.signals import Signals
from oomlens.facts.snapshot import DeviceAnalysis, SnapshotAnalysis

_SIGKILL_CODES = frozenset({-9, 137, 247})


@dataclass(frozen=True, slots=True)
class InputReport:
    """One input file: what oomlens took it for and whether it could be read.

    ``problem`` is the one-line error (file, what is wrong, what to do) when it could not;
    ``notes`` are remarks about a file that was read (invalid UTF-8 replaced, cut mid-line...).
    """

    path: str
    kind: str
    detail: str
    problem: str | None = None
    notes: tuple[str, ...] = ()
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where the run's DeepSpeed config came from: a ds_config file, or the engine's own dump
    in the log (what DeepSpeed really ran with), or both (then ``dump`` is the log's)."""

    reading: ConfigReading
    origin: str
    """``file``, ``log_dump`` or ``file+log_dump``; ``capture`` / ``file+capture`` when the
    dump is the one an oomlens capture recorded."""
    dump: ConfigReading | None = None


@dataclass(frozen=True, slots=True)
class WorldSizeFact:
    """The data-parallel world size of the run and where it was learnt (``--gpus``, the
    launcher's world info, the ranks seen in the log...)."""

    value: int
    origin: str
    source: SourceRef | None = None
    lower_bound: bool = False
    """``value`` is only the least the run had: one more than the highest rank some line
    names (torchrun's failure table lists the failed workers of one node, a log the ranks that
    printed), not a count of the ranks."""


@dataclass(frozen=True, slots=True)
class ModelParams:
    """The model's parameter count and where it was read (``--params``, a log line)."""

    total: int
    origin: str
    source: SourceRef | None = None


@dataclass(frozen=True, slots=True)
class RunFacts:
    """All facts of one run.

    ``params``, ``gpu_memory`` and ``host_memory`` come from the inputs or the command line
    (``--params``, ``--gpu-memory``, ``--host-memory``) when the inputs do not say.
    """

    inputs: tuple[InputReport, ...]
    logs: tuple[LogFacts, ...]
    error_files: tuple[ErrorFileFacts, ...]
    kernel_logs: tuple[KernelLogFacts, ...]
    snapshots: tuple[SnapshotAnalysis, ...]
    config: ConfigSource | None
    ranks: RankPicture
    world_size: WorldSizeFact | None
    params: ModelParams | None = None
    gpu_memory: int | None = None
    host_memory: int | None = None
    host_memory_origin: str = ""
    """``--host-memory``, or the log's ``CPU Virtual Memory: used = .. GB, percent = ..%``
    (DeepSpeed's node-wide figure: used / percent)."""
    memory_model: MemoryModelFacts | None = None
    last_step: int | None = None
    """The highest training step any log printed."""
    other_inputs: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    """Facts of input kinds whose slot has no field of its own, by slot name."""
    captures: tuple[RankCapture, ...] = ()
    """What an oomlens capture recorded, per process (``oomlens.facts.capture``)."""
    context: RunContext = field(default_factory=RunContext)
    """What the inputs show of the run's shape (``oomlens.facts.context``)."""
    account: MemoryAccount | None = None
    """The memory account of the first GPU OOM (``oomlens.facts.account``)."""
    signals: Signals = field(default_factory=Signals)
    """The signals derived from all of the above, once (``oomlens.facts.signals``)."""

    # ----------------------------------------------------------------- questions rules ask

    def oom_events(self) -> tuple[OomEvent, ...]:
        """Every OOM event of every log and error file, earliest first when times are known."""
        events: list[OomEvent] = [e for log in self.logs for e in log.oom_events]
        known = {(e.source.path, e.source.line) for e in events}
        for error_file in self.error_files:
            event = error_file.oom_event
            if event is not None and (event.source.path, event.source.line) not in known:
                events.append(event)
        # The capture's copy of an OOM a log printed is the same OOM: the log's line is cited.
        printed = {(e.rank, _message_key(e.message.text)) for e in events}
        for capture in self.captures:
            events.extend(
                e
                for e in capture.oom_events
                if (e.rank, _message_key(e.message.text)) not in printed
                and (None, _message_key(e.message.text)) not in printed
            )
        return tuple(events)

    def gpu_oom_events(self) -> tuple[OomEvent, ...]:
        """OOM events about device memory (everything but host-RAM messages)."""
        return tuple(e for e in self.oom_events() if e.message.kind is not OomKind.HOST)

    def first_gpu_oom(self) -> OomEvent | None:
        """The OOM of the rank that failed first, else the first OOM in reading order."""
        events = self.gpu_oom_events()
        if not events:
            return None
        first = self.ranks.first_failed
        if first is not None and first.oom_events:
            return first.oom_events[0]
        dated = [e for e in events if e.timestamp is not None]
        if len(dated) == len(events):
            return min(dated, key=lambda e: e.timestamp)  # type: ignore[arg-type, return-value]
        return events[0]

    def exceptions(self) -> tuple[ExceptionEvent, ...]:
        found = [e for log in self.logs for e in log.exceptions]
        printed = {(e.exception_class, _message_key(e.text)) for e in found}
        for capture in self.captures:
            found.extend(
                e
                for e in capture.exceptions
                if (e.exception_class, _message_key(e.text)) not in printed
            )
        return tuple(found)

    def captured_kills(self) -> tuple[RankCapture, ...]:
        """Captured ranks that disappeared without a word while their cgroup counted an OOM
        kill (``memory.events``): what the kernel's OOM killer leaves."""
        return tuple(c for c in self.captures if c.killed_for_memory)

    def kernel_oom_kills(self) -> tuple[KernelOomKill, ...]:
        kills = [k for log in self.kernel_logs for k in log.oom_kills]
        kills += [k for log in self.logs for k in log.kernel_oom_kills]
        return tuple(kills)

    def memory_series(self) -> Iterator[MemorySeries]:
        for log in self.logs:
            yield from log.memory
        for capture in self.captures:
            if capture.memory is not None:
                yield capture.memory

    def snapshot_devices(self) -> Iterator[tuple[SnapshotAnalysis, DeviceAnalysis]]:
        for snapshot in self.snapshots:
            for device in snapshot.devices:
                yield snapshot, device

    def snapshot_for(self, event: OomEvent) -> tuple[SnapshotAnalysis, DeviceAnalysis] | None:
        """The snapshot device analysis that recorded ``event``'s OOM: same rank when the
        snapshot's file says it (``snapshot_rank<R>``), same device, with an ``oom`` entry."""
        candidates = []
        for snapshot, device in self.snapshot_devices():
            if device.oom is None:
                continue
            if event.message.device is not None and device.device != event.message.device:
                continue
            candidates.append((snapshot, device))
        if not candidates:
            return None
        if event.rank is not None:
            for snapshot, device in candidates:
                if snapshot.source.rank == event.rank:
                    return snapshot, device
        return candidates[0]

    def sigkilled_at(self) -> str | None:
        """Where a rank is reported killed by SIGKILL (``-9``, 137, 247), if anywhere."""
        for exit_line in self.ranks.launcher_exits:
            if exit_line.return_code in _SIGKILL_CODES:
                return exit_line.source.describe()
        for status in self.ranks.ranks:
            if status.signal == "SIGKILL" or status.exitcode in _SIGKILL_CODES:
                return (
                    status.first_source.describe() if status.first_source else f"rank {status.rank}"
                )
        for log in self.logs:
            for failure in log.process_failures:
                if failure.signal == "SIGKILL" or failure.exitcode in _SIGKILL_CODES:
                    return failure.source.describe()
            for line in log.fatal_signals:
                if line.kind.value == "SIGKILL":
                    return line.source.describe()
        return None

    def caught_oom_events(self) -> tuple[OomEvent, ...]:
        """OOM errors the program caught and went on from (not in ``oom_events``)."""
        return tuple(e for log in self.logs for e in log.caught_oom_events)

    def allocator_summary_ooms(self) -> tuple[AllocatorSummary, ...]:
        """``torch.cuda.memory_summary()`` tables that count at least one CUDA OOM."""
        return tuple(s for log in self.logs for s in log.allocator_summaries if s.ooms)

    def step_before(self, rank: int | None, ref: SourceRef | None) -> StepSample | None:
        """The last training step printed before a failure at ``ref`` (by ``rank``): that
        rank's last progress line, else the log's, not after the failure's line in the same
        file."""
        best: StepSample | None = None
        for log in self.logs:
            candidates = [
                s for s in log.steps.last_by_rank if rank is not None and s.source.rank == rank
            ]
            sample = candidates[0] if candidates else log.steps.last
            if sample is None or sample.step is None:
                continue
            if ref is not None and sample.source.path == ref.path and ref.line is not None:
                if sample.source.line is not None and sample.source.line > ref.line:
                    continue
            if best is None or sample.step > (best.step or 0):
                best = sample
        return best

    def has_failure_evidence(self) -> bool:
        """Anything that says the run did not finish cleanly: an error, a kill, a failed exit,
        a fatal signal a shell or the C runtime printed, a launcher tearing the other workers
        down, a ``memory_summary()`` that counts an OOM, a captured process that exited with an
        error."""
        if self.oom_events() or self.kernel_oom_kills() or self.captured_kills():
            return True
        if any(log.batch_assertions or log.config_errors for log in self.logs):
            return True
        if any(not e.peer_failure for e in self.exceptions()):
            return True
        if self.ranks.ranks or any(e.return_code != 0 for e in self.ranks.launcher_exits):
            return True
        if any(c.exit_code not in (0, None) for c in self.captures):
            return True
        if self.allocator_summary_ooms():
            return True
        return any(
            log.process_failures
            or log.failure_summaries
            or log.fatal_signals
            or log.closing_signals
            or log.killed_subprocesses
            for log in self.logs
        )


def _message_key(text: str) -> str:
    """An error message as two reports of it compare: whitespace-normalised, bounded."""
    return " ".join(text.split())[:300]
