"""The line matchers of the log reader: which lines each one takes, and what it makes of them.

A matcher is a ``LineMatcher``: the kinds of line it wants (bits of ``reader``'s anchor table:
a line's bits are those of the anchors found in it) and a function given the line
(``Line``) and the reader; it returns True when it took the line, which ends the matching of
that line.  ``MATCHERS`` runs them in order: the order is part of the meaning (the memory line
before the CPU line that completes it, a launcher line before a step counter...).  Adding a kind
of line is adding its anchors to the table and its matcher here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from oomlens.facts import SourceRef
from oomlens.facts.log import (
    AllocatorSummary,
    BatchAssertion,
    CacheFlushWarning,
    CompletionLine,
    ConfigErrorLine,
    GpuProcess,
    GpuUsage,
    ParamCount,
    PeerFailureSignal,
    ProcessFailure,
)
from oomlens.ingest.log import deepspeed, kernel, params, paste, steps, torchrun
from oomlens.ingest.log.bits import (
    AGENT,
    ALLOC_SUMMARY,
    BATCH,
    COMPLETION,
    CONFIG_DUMP,
    CONFIG_ERROR,
    DS_CPU,
    DS_MEMORY,
    EXCEPTION,
    FLUSH,
    GPU_TABLE,
    KERNEL,
    LAUNCHER,
    OOM,
    PARAMS,
    PEER,
    PLATFORM,
    SIGNAL,
    STEP,
    SUMMARY,
    TERMINATE,
    WORLD,
)
from oomlens.ingest.log.prefixes import LinePrefix
from oomlens.ingest.log.state import StreamState

if TYPE_CHECKING:
    from oomlens.ingest.log.reader import LogReader
    from oomlens.ingest.log.traceback import FinishedException


@dataclass(slots=True)
class Line:
    """One line that holds an anchor, as the matchers see it (not frozen: made for every such
    line, and a frozen dataclass is several times slower to make)."""

    rest: str
    """The line without its launcher prefixes."""
    message: str
    """The logger record's message, else ``rest``."""
    record: deepspeed.LoggerRecord | None
    ref: SourceRef
    when: datetime | None
    prefix: LinePrefix
    stream: StreamState
    key: tuple[object, ...]
    data: bytes
    """The block the line is in, and where it starts (for looking around it)."""
    start: int
    mask: int


@dataclass(frozen=True, slots=True)
class LineMatcher:
    bits: int
    """The kinds of line it wants."""
    take: Callable[[LogReader, Line], bool]
    """True when it took the line (no later matcher sees it)."""


def _standalone_exception(reader: LogReader, line: Line) -> bool:
    if not line.stream.tb.open and not reader.in_traceback:
        reader.standalone_exception(
            line.rest, line.ref, line.stream, line.key, line.data, line.start, line.mask
        )
    return False


def _memory(reader: LogReader, line: Line) -> bool:
    reading = deepspeed.parse_memory_line(line.message)
    if reading is None:
        return False
    stream = line.stream
    if stream.pending_memory is not None:
        reader.flush_memory(stream, None)
    label = reader.label_before(line.data, line.start, line.prefix.key)
    stream.pending_memory = (
        line.ref,
        label,
        reading,
        line.when or reader.last_time,
        reader.last_step,
    )
    cpu = reader.cpu_line_after(line.data, line.start)
    if cpu is not None:
        reader.flush_memory(stream, cpu)
    return True


def _cpu(reader: LogReader, line: Line) -> bool:
    cpu = deepspeed.parse_cpu_line(line.message)
    if cpu is not None and line.stream.pending_memory is not None:
        reader.flush_memory(line.stream, cpu)
    return True


def _cache_flush(reader: LogReader, line: Line) -> bool:
    flushes = deepspeed.parse_cache_flush(line.message)
    if flushes is not None:
        when = line.when or reader.last_time
        reader.add_flush(CacheFlushWarning(line.ref, flushes, reader.last_step, when))
    return True


def _config_dump(reader: LogReader, line: Line) -> bool:
    if line.record is None or "DeepSpeedEngine configuration" not in line.message:
        return False
    reader.config_dumps_seen += 1
    stream = line.stream
    if reader.config_dump is None and stream.config_dump is None:
        stream.config_dump = deepspeed.ConfigDumpCollector()
        stream.config_ref = line.ref
        stream.config_lines = [(line.ref, line.rest)]
        reader.sync_open(line.key, stream)
    return True


def _batch_assertion(reader: LogReader, line: Line) -> bool:
    numbers = deepspeed.parse_batch_assertion(line.message)
    if numbers is not None:
        reader.batch.add(
            BatchAssertion(
                line.ref,
                numbers.train_batch_size,
                numbers.micro_batch_per_gpu,
                numbers.gradient_accumulation_steps,
                numbers.world_size,
                line.when or reader.last_time,
            )
        )
    return True


def _config_error(reader: LogReader, line: Line) -> bool:
    error = deepspeed.parse_config_error(line.message)
    if error is None:
        return False
    reader.config_errors.add(ConfigErrorLine(line.ref, error))
    return True


def _launcher(reader: LogReader, line: Line) -> bool:
    reader.launcher(line.message, line.ref, line.when)
    return True


def _param_count(reader: LogReader, line: Line) -> bool:
    if reader.param_count is not None:
        return False
    counted = params.parse_param_count(line.message)
    if counted is None:
        return False
    reader.param_count = ParamCount(counted.total, counted.trainable, counted.origin, line.ref)
    return True


def _world_size(reader: LogReader, line: Line) -> bool:
    world = deepspeed.parse_world_size(line.message)
    if world is None:
        return False
    reader.set_world(world[0], world[1], line.ref)
    return True


def _agent(reader: LogReader, line: Line) -> bool:
    return reader.agent(line.message, line.ref, line.when, line.data, line.start)


def _peer_failure(reader: LogReader, line: Line) -> bool:
    peer = torchrun.parse_peer_failure(line.message)
    if peer is not None:
        kind, text_rank = peer
        ref = line.ref
        source = ref if ref.rank is not None or text_rank is None else replace(ref, rank=text_rank)
        when = line.when or reader.time_before(line.data, line.start, 8)
        reader.peers.add(PeerFailureSignal(source, kind, line.message[:500], when))
    return False


def _kernel_line(reader: LogReader, line: Line) -> bool:
    event = kernel.parse_kernel_line(line.rest, line.ref, reader.year)
    if event is None:
        return False
    reader.kernel_event(event)
    return True


def _step(reader: LogReader, line: Line) -> bool:
    progress = steps.parse_step_line(line.message)
    if progress is not None:
        reader.add_step(progress, line.ref, line.when or reader.last_time)
    return False


_COMPLETION_WORDS = ("inished", "exits successfully", "train_runtime", "stopped", "ompleted")


def _completion(reader: LogReader, line: Line) -> bool:
    if not any(word in line.message for word in _COMPLETION_WORDS):
        return False
    kind = paste.parse_completion(line.message)
    if kind is not None:
        reader.completion = CompletionLine(line.ref, kind, line.message[:300])
    return False


def _platform(reader: LogReader, line: Line) -> bool:
    kind = paste.parse_platform(line.rest)
    if kind is not None:
        reader.add_platform(kind, line.ref, line.rest)
    return False


def _signal(reader: LogReader, line: Line) -> bool:
    if line.stream.tb.open or line.stream.failure_block is not None:
        return False  # an exception's own text: read when it ends (``after_exception``)
    found = paste.parse_signal_line(line.message)
    if found is not None and found.signal is not None:
        _add_signal_failure(reader, line.ref, found, line.message)
    return False


def _alloc_summary(reader: LogReader, line: Line) -> bool:
    device = paste.summary_device(line.rest)
    if device is not None:
        reader.alloc_device = device
        return True
    counts = paste.summary_ooms(line.rest)
    if counts is not None:
        reader.alloc_summaries.add(
            AllocatorSummary(line.ref, reader.alloc_device, counts[0], counts[1])
        )
        return True
    return False


def _summary_rows(reader: LogReader, line: Line) -> bool:
    """The ``Allocated memory`` and ``GPU reserved memory`` rows of the last summary table."""
    if not reader.alloc_summaries.items or not line.rest.startswith("|"):
        return False
    row = paste.summary_row(line.rest)
    if row is None:
        return False
    summary = reader.alloc_summaries.items[-1]
    name, current, peak = row
    if name == "Allocated memory" and summary.allocated_current is None:
        summary = replace(summary, allocated_current=current, allocated_peak=peak)
    elif name == "GPU reserved memory" and summary.reserved_current is None:
        summary = replace(summary, reserved_current=current, reserved_peak=peak)
    reader.alloc_summaries.items[-1] = summary
    return True


def _gpu_table(reader: LogReader, line: Line) -> bool:
    """``nvidia-smi``'s tables (and a script's ``X MiB free of Y MiB``)."""
    device = paste.smi_device(line.rest)
    if device is not None:
        reader.smi_device = device
        return False
    row = paste.parse_gpu_row(line.rest, reader.smi_device)
    if row is not None:
        origin = "nvidia_smi" if "/" in line.rest and "W" in line.rest else "script"
        reader.gpu_usage.add(GpuUsage(line.ref, row.device, row.used, row.total, origin))
        reader.smi_device = None
        return False
    process = paste.parse_gpu_process(line.rest)
    if process is not None:
        reader.gpu_processes.add(
            GpuProcess(
                line.ref, process.device, process.pid, process.kind, process.name, process.used
            )
        )
    return False


def _add_signal_failure(
    reader: LogReader, ref: SourceRef, found: paste.SignalLine, text: str
) -> None:
    reader.failures.add(
        ProcessFailure(
            source=ref,
            origin="signal_line",
            exitcode=found.exitcode,
            signal=found.signal,
            rank=ref.rank,
            local_rank=None,
            pid=found.pid,
            host=ref.host,
            timestamp=reader.last_time,
            root_cause=False,
            error_file=None,
            message=text[:500],
            oom=None,
        )
    )


_DEEPSPEED_VALIDATION = ("for DeepSpeed", "DeepSpeedConfig", "DeepSpeedZeroConfig")


def after_exception(reader: LogReader, finished: FinishedException) -> None:
    """What a finished non-OOM exception says besides itself: a rejected DeepSpeed config
    (pydantic's ``ValidationError ... for DeepSpeedZeroConfig``), a subprocess killed by a
    signal (``CalledProcessError: ... died with <Signals.SIGKILL: 9>``)."""
    text = finished.text
    cls = finished.exception_class
    if cls.endswith("ValidationError") and any(m in text[:600] for m in _DEEPSPEED_VALIDATION):
        reader.config_errors.add(ConfigErrorLine(finished.source, text[:500]))
    if cls.endswith(("CalledProcessError", "ChildProcessError", "ProcessExitedException")) or (
        "Signals.SIG" in text
    ):
        found = paste.parse_signal_line(text)
        if found is not None and found.signal is not None:
            _add_signal_failure(reader, finished.source, found, text)


MATCHERS: tuple[LineMatcher, ...] = (
    LineMatcher(OOM | TERMINATE | SUMMARY | EXCEPTION, _standalone_exception),
    LineMatcher(DS_MEMORY, _memory),
    LineMatcher(DS_CPU, _cpu),
    LineMatcher(FLUSH, _cache_flush),
    LineMatcher(CONFIG_DUMP, _config_dump),
    LineMatcher(BATCH, _batch_assertion),
    LineMatcher(CONFIG_ERROR, _config_error),
    LineMatcher(LAUNCHER | COMPLETION | STEP, _completion),
    LineMatcher(GPU_TABLE, _gpu_table),
    LineMatcher(LAUNCHER, _launcher),
    LineMatcher(PARAMS, _param_count),
    LineMatcher(WORLD, _world_size),
    LineMatcher(AGENT, _agent),
    LineMatcher(PEER, _peer_failure),
    LineMatcher(KERNEL, _kernel_line),
    LineMatcher(SIGNAL, _signal),
    LineMatcher(PLATFORM, _platform),
    LineMatcher(ALLOC_SUMMARY, _alloc_summary),
    LineMatcher(ALLOC_SUMMARY, _summary_rows),
    LineMatcher(STEP, _step),
)
"""Every matcher, in the order they see a line."""


def takers(mask: int) -> tuple[Callable[[LogReader, Line], bool], ...]:
    """The matchers that want a line of these kinds, in order."""
    return tuple(matcher.take for matcher in MATCHERS if matcher.bits & mask)
