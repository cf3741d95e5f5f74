"""The ``LogFacts`` a finished pass of the log reader hands back, and the folding of failure
summaries' quotes into the OOMs they quote."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.log import (
    CacheFlushSummary,
    LogFacts,
    OomEvent,
    Phase,
    ProcessFailure,
    StepSeries,
)
from oomlens.ingest.log.state import BoundedList

if TYPE_CHECKING:
    from oomlens.ingest.log.reader import LogReader


def log_facts(reader: LogReader) -> LogFacts:
    """The facts of a finished pass: what the reader kept, with the notes on what it repaired
    and the counts of what it dropped."""
    stats = reader.source.stats
    notes: list[str] = []
    envelope = reader.source.describe_envelope()
    if envelope:
        notes.append(envelope)
    if stats.problem:
        notes.append(stats.problem)
    if stats.invalid_utf8_lines:
        notes.append(f"{stats.invalid_utf8_lines} line(s) held invalid UTF-8 (replaced by U+FFFD)")
    if stats.nul_bytes:
        notes.append(
            f"{stats.nul_bytes} NUL byte(s) removed (holes in the file, left by a crash or a "
            "truncation)"
        )
    if stats.nul_lines:
        notes.append(f"{stats.nul_lines} line(s) held NUL bytes (removed)")
    if stats.long_lines:
        notes.append(
            f"{stats.long_lines} line(s) longer than {reader.source.max_line_bytes} bytes were cut"
        )
    if stats.ended_mid_line:
        notes.append(
            "the last line has no end of line: the log was cut or its writer died mid-line"
        )
    if reader.ended_in_traceback:
        notes.append("the log ends inside a traceback or an exception message")
    if reader.cut_tracebacks:
        notes.append(f"{reader.cut_tracebacks} traceback(s) stopped before their exception line")
    lists = (
        reader.oom,
        reader.exceptions,
        reader.batch,
        reader.config_errors,
        reader.launcher_exits,
        reader.killed,
        reader.closing,
        reader.failures,
        reader.summaries,
        reader.peers,
        reader.kills,
        reader.invocations,
        reader.slurm,
        reader.fatal,
    )
    dropped = tuple((b.name, b.dropped) for b in lists if b.dropped)
    uncaught, caught = _split_caught(reader)
    return LogFacts(
        path=reader.path,
        compression=str(reader.source.compression),
        bytes_read=stats.bytes_read,
        lines=stats.lines,
        long_lines=stats.long_lines,
        invalid_utf8_lines=stats.invalid_utf8_lines,
        ended_mid_line=stats.ended_mid_line,
        ended_in_traceback=reader.ended_in_traceback,
        layout_rank=reader.layout_rank,
        oom_events=uncaught,
        exceptions=tuple(reader.exceptions.items),
        memory=tuple(k.freeze() for k in reader.memory.values()),
        cache_flushes=CacheFlushSummary(
            reader.flushes.count,
            reader.flush_total,
            reader.flush_max,
            reader.flush_first,
            reader.flush_last,
            reader.flushes.items(),
        ),
        steps=StepSeries(
            reader.step_samples.count,
            reader.step_samples.items(),
            reader.last_step_sample,
            reader.max_step,
            reader.loss.freeze() if reader.loss.count else None,
            tuple(reader.last_by_rank.values()),
        ),
        config_dump=reader.config_dump,
        config_dumps_seen=reader.config_dumps_seen,
        ds_config_dump=reader.parsed_config_dump,
        batch_assertions=tuple(reader.batch.items),
        config_errors=tuple(reader.config_errors.items),
        world_size=reader.world,
        param_count=reader.param_count,
        launcher_exits=tuple(reader.launcher_exits.items),
        killed_subprocesses=tuple(reader.killed.items),
        closing_signals=tuple(reader.closing.items),
        process_failures=tuple(reader.failures.items),
        failure_summaries=tuple(reader.summaries.items),
        peer_failures=tuple(reader.peers.items),
        kernel_oom_kills=tuple(reader.kills.items),
        oom_invocations=tuple(reader.invocations.items),
        slurm_oom_kills=tuple(reader.slurm.items),
        fatal_signals=tuple(reader.fatal.items),
        ranks_seen=tuple(sorted(reader.ranks_seen)),
        hosts_seen=tuple(sorted(reader.hosts_seen)),
        dropped=dropped,
        notes=tuple(notes),
        tail=reader.tail,
        completion=reader.completion,
        caught_oom_events=caught,
        platform_hints=tuple(reader.platform.values()),
        allocator_summaries=tuple(reader.alloc_summaries.items),
        tracebacks_cut=reader.cut_tracebacks,
        partial_tracebacks=tuple(reader.partial),
        gpu_usage=tuple(reader.gpu_usage.items),
        gpu_processes=tuple(reader.gpu_processes.items),
        line_by_line=reader.line_by_line,
        stream_cut=stats.problem,
    )


_DEATHS_OF_THEIR_OWN = frozenset(
    {
        FatalSignalKind.SIGKILL,
        FatalSignalKind.SIGBUS,
        FatalSignalKind.SIGSEGV,
        FatalSignalKind.SHM_EXHAUSTED,
    }
)
"""Lines saying a process died of a cause other than an OOM it raised.  Not ``SIGABRT`` (a C++
OOM rethrown aborts), nor srun's exit line or Slurm's cancel (they follow any failure)."""


def _split_caught(reader: LogReader) -> tuple[tuple[OomEvent, ...], tuple[OomEvent, ...]]:
    """``(uncaught, caught)`` OOM events.  An OOM raised to the top is never caught: a run
    restarted in the same file, or another run's lines in it, do not make its crash a retry.
    Raised is what Python's traceback printer writes: a ``Traceback (most recent call last)``
    header, or the exception's own line (``torch.OutOfMemoryError: CUDA out of memory...``,
    its class then the message, nothing else on the line), which ``sys.excepthook`` prints
    and a program that catches the error and logs it does not (a log record wraps it, or
    ``str(e)`` drops the class); its header may be lost to a paste's window or broken off by
    another process's lines.  Another OOM is caught (a batch-size finder, a retry loop that
    logged it) when the run ended normally after it and nothing says a process failed, or
    when it was logged rather than raised (no exception class) and the same rank printed
    training progress after it, or failed of something else after it (another error, a
    signal of its own, shared memory): a program that logs an OOM (``retrying smaller: CUDA
    out of memory...``) went on, and what ended it is that failure."""
    events = reader.oom.items
    if not events:
        return (), ()
    completion = reader.completion
    failed = bool(reader.failures.items) or any(
        e.return_code != 0 for e in reader.launcher_exits.items
    )
    ended_normally = completion is not None and not failed
    end_line = completion.source.line or 0 if completion is not None else 0
    last_error: dict[int | None, int] = {}
    ended = [e.source for e in reader.exceptions.items] + [
        f.source for f in reader.fatal.items if f.kind in _DEATHS_OF_THEIR_OWN
    ]
    for source in ended:
        last_error[source.rank] = max(last_error.get(source.rank, 0), source.line or 0)
    uncaught: list[OomEvent] = []
    caught: list[OomEvent] = []
    for event in events:
        line = event.source.line or 0
        raised = (event.traceback is not None and not event.traceback.headless) or (
            bool(event.message.exception_class) and event.preamble is None
        )
        logged = event.traceback is None and not event.message.exception_class
        progressed = reader.progress_line.get(event.source.rank, 0) > line
        went_on = progressed or (
            event.preamble is not None and last_error.get(event.source.rank, 0) > line
        )
        if (
            not raised
            and event.origin == "log"
            and ((ended_normally and end_line > line) or (logged and went_on))
        ):
            caught.append(event)
        else:
            uncaught.append(event)
    return tuple(uncaught), tuple(caught)


def _oom_key(event: OomEvent) -> tuple[object, ...]:
    m = event.message
    return (m.kind, m.tried_to_allocate, m.total_capacity, m.free, m.process_in_use, m.text[:400])


def fold_summary_ooms(oom: BoundedList[OomEvent], summary_ooms: list[ProcessFailure]) -> None:
    """A failure summary quotes the OOM its worker printed before: fold each quote into the
    latest earlier event with the same message (giving it the summary's rank when it had
    none); a quote with no such event becomes an event of its own."""
    events: list[OomEvent] = oom.items
    by_key: dict[tuple[object, ...], list[int]] = {}
    for index, event in enumerate(events):
        by_key.setdefault(_oom_key(event), []).append(index)
    for failure in summary_ooms:
        assert failure.oom is not None
        quote = OomEvent(
            failure.source,
            failure.oom,
            Phase.UNKNOWN,
            None,
            None,
            "failure_summary",
            failure.timestamp,
            False,
            failure.local_rank,
        )
        line = failure.source.line or 0
        candidates = [
            i
            for i in by_key.get(_oom_key(quote), [])
            if (events[i].source.line or 0) < line
            and events[i].origin == "log"
            and events[i].source.rank in (None, failure.rank, failure.local_rank)
        ]
        if not candidates:
            oom.add(quote)
            continue
        index = max(candidates, key=lambda i: events[i].source.line or 0)
        earlier = events[index]
        source, placed = earlier.source, earlier.phase_source
        if source.rank is None and failure.rank is not None:
            source = replace(source, rank=failure.rank)
            if placed is not None and placed.rank is None:
                placed = replace(placed, rank=failure.rank)
        events[index] = replace(
            earlier,
            source=source,
            phase_source=placed,
            reported_elsewhere=earlier.reported_elsewhere + 1,
            local_rank=earlier.local_rank if earlier.local_rank is not None else failure.local_rank,
        )
