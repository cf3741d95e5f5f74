"""One streaming pass over a training log: every matcher, bounded memory, ``LogFacts`` out.

``read_log(path, rank=None, host=None)`` reads a plain or compressed log and returns
``LogFacts``.  ``rank``/``host`` are what the file's location says (per-rank log files of
``torchrun --log-dir`` or ``deepspeed --enable_each_rank_log``); they apply to lines that carry
no rank prefix of their own.  Raises ``InputError`` only when the file cannot be opened or is
empty; anything inside it (binary garbage, invalid UTF-8, cut lines) is tolerated and noted.

How it stays fast: the raw bytes are scanned block by block with one multi-pattern search for
the anchors of every matcher (``ANCHORS``; Aho-Corasick through ``ahocorasick_rs`` when
installed, else one compiled alternation, several times slower; keep the anchors at most 64
and none starting with a common byte such as a space, or the SIMD prefilter of Aho-Corasick is
lost).  A per-block newline index (numpy) gives line numbers.  Only lines holding an anchor
are decoded and
matched, except while some stream (rank) has a traceback, an exception message, a failure
summary or the config dump open: then every line is read until it closes (or goes stale).

Inputs of paste size (``LINE_BY_LINE_BYTES`` on disk) are read line by line instead, with a
wider anchor table (``bits.PASTE_ANCHORS``): what people paste is cut and wrapped anywhere,
decorated (quote markers, fences), starts inside a traceback or mid-message, and a cheap
anchor on the first line of every fact cannot be counted on.  Only the lines the fast pass
would see move the clock, so the times facts carry do not depend on how an input was read.

How it stays bounded: a fixed number of facts per kind (the rest counted in
``LogFacts.dropped``), thinned time series with running statistics, bounded tracebacks and
messages, at most ``MAX_STREAMS`` tracked streams, and lines cut at 64 KiB.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import numpy as np

from oomlens.errors import InputError
from oomlens.facts import SourceRef
from oomlens.facts.config import DumpedConfig
from oomlens.facts.kernel import FatalSignalLine, KernelOomKill, OomKillerInvoked, SlurmOomKill
from oomlens.facts.log import (
    AllocatorSummary,
    BatchAssertion,
    CacheFlushWarning,
    ClosingSignal,
    CompletionLine,
    ConfigErrorLine,
    DsConfigDump,
    ExceptionEvent,
    FailureSummary,
    GpuProcess,
    GpuUsage,
    KilledSubprocess,
    LauncherExit,
    LogFacts,
    OomEvent,
    ParamCount,
    PeerFailureSignal,
    Phase,
    PlatformHint,
    ProcessFailure,
    StepSample,
    WorldSize,
)
from oomlens.gcpause import gc_paused
from oomlens.ingest.log import batches, bulk, deepspeed, paste, steps, torch_oom, torchrun
from oomlens.ingest.log.bits import (
    ALLOC_SUMMARY,
    COMPLETION,
    DS_CPU,
    EXCEPTION,
    MAIN,
    OOM,
    OOM_START,
    SUMMARY,
    TB,
    TERMINATE,
)
from oomlens.ingest.log.collect import fold_summary_ooms, log_facts
from oomlens.ingest.log.library_lines import announced_phase
from oomlens.ingest.log.matchers import Line, after_exception, takers
from oomlens.ingest.log.prefixes import LinePrefix, strip_prefixes
from oomlens.ingest.log.reader_record import MAX_STREAMS, FactRecorder
from oomlens.ingest.log.series import RunningStats, Thinned
from oomlens.ingest.log.source_line import source_line_phase
from oomlens.ingest.log.state import (
    BoundedList,
    MemoryKeeper,
    ReaderLimits,
    StreamState,
)
from oomlens.ingest.log.timestamps import leading_timestamp
from oomlens.ingest.log.traceback import (
    FinishedException,
    classify_traceback,
)
from oomlens.ingest.textstream import (
    Compression,
    LineCleaner,
    StreamStats,
    TextSource,
    open_text,
)
from oomlens.lazyregex import lazy_regex

MAX_PARTIAL_TRACEBACKS = 16
MAX_CONFIG_DUMP_LINES = 2000


_GLUED = lazy_regex(r"\[(?:rank|default)\d{1,6}\]:")
_TERMINATE = lazy_regex(r"terminate called after throwing an instance of '(?P<cls>[^'\n]{1,200})'")
_EXCEPTION_CLASS = lazy_regex(r"(?P<cls>[A-Za-z_][\w.]{0,200}(?:Error|Exception))\s{0,4}:")


LINE_BY_LINE_BYTES = 1 << 20
"""An input this small on disk is read line by line with the wider anchor table (a paste, a
window of a log): every line is looked at, so cut, wrapped and decorated text is read."""
LINE_BY_LINE_MAX_TEXT = 16 << 20
"""...up to this much decompressed text (a small compressed file can inflate a lot)."""
END_OF_RUN = ALLOC_SUMMARY | COMPLETION
"""What a run prints as it ends that only the wider table finds: ``torch.cuda.memory_summary()``'s
table (its OOM count decides a verdict) and a trainer's closing line.  The last lines of an input
read in bulk (``LogReader.tail``) are read for these too, so that what they decide does not
depend on the input's size."""


class LogReader(FactRecorder):
    """The state of one pass; use ``read_log``."""

    def __init__(
        self,
        source: TextSource,
        *,
        rank: int | None,
        host: str | None,
        limits: ReaderLimits,
        jobs: int = 1,
    ) -> None:
        self.source = source
        self.jobs = jobs
        self.progress: Callable[[int], None] | None = None
        self.path = source.display
        self.layout_rank = rank
        self.layout_host = host
        self.limits = limits
        self.cleaner = LineCleaner(source.stats, source.max_line_bytes)
        self.quiet_cleaner = LineCleaner(StreamStats(), source.max_line_bytes)
        """Cleans the lines read behind another (labels): their repairs are not counted."""
        try:
            info = os.stat(source.path)
            self.year: int | None = datetime.fromtimestamp(info.st_mtime).year
            self.every_line = info.st_size <= LINE_BY_LINE_BYTES
        except OSError:  # pragma: no cover
            self.year = None
            self.every_line = False
        self.line_by_line = self.every_line
        self.final_text = b""
        """The input's last ``LINE_BY_LINE_BYTES``, read line by line after the bulk pass."""
        self.last_time: datetime | None = None
        self._time_scan: tuple[bytes, int, int, int, datetime | None] | None = None
        """``time_before``'s last scan: block, lines, start, where it found a time, the time."""
        self.last_step: int | None = None
        self.known_hosts: set[str] = set()
        self.local_to_global: dict[tuple[object, ...], int] = {}
        self.pid_local_rank: dict[int, int] = {}
        self.streams: dict[tuple[object, ...], StreamState] = {}
        self.open_streams: dict[tuple[object, ...], StreamState] = {}
        self.ranks_seen: set[int] = set()
        self.hosts_seen: set[str] = set()
        self.prev_tail = b""
        self.end_bytes = b""
        """The input's last 16 KiB read, across blocks (``batches``)."""
        self.block_data = b""
        self.in_traceback = False
        self.prefix_chars = 0
        self.consumed_until = 0
        self.ended_in_traceback = False
        self.block_newlines: np.ndarray | None = None
        self.tail: tuple[tuple[int, str], ...] = ()
        self.line_start = 0
        self.cut_tracebacks = 0
        self.line_above: tuple[int, str] = (0, "")
        """The last line with text read line by line (number, text after its prefixes)."""
        self.source_above: dict[int, tuple[int, str]] = {}
        """An error line read line by line -> the last line with text above it."""
        self.above: tuple[int, str] | None = None
        self.partial: deque[ExceptionEvent] = deque(maxlen=MAX_PARTIAL_TRACEBACKS)
        self.lines_since_stale_check = 0
        lim = limits.max_events
        self.oom = BoundedList[OomEvent]("oom_events", limits.max_oom_events)
        self.exceptions = BoundedList[ExceptionEvent]("exceptions", limits.max_exceptions)
        self.batch = BoundedList[BatchAssertion]("batch_assertions", lim)
        self.config_errors = BoundedList[ConfigErrorLine]("config_errors", lim)
        self.launcher_exits = BoundedList[LauncherExit]("launcher_exits", lim)
        self.killed = BoundedList[KilledSubprocess]("killed_subprocesses", lim)
        self.closing = BoundedList[ClosingSignal]("closing_signals", lim)
        self.failures = BoundedList[ProcessFailure]("process_failures", lim)
        self.summaries = BoundedList[FailureSummary]("failure_summaries", 64)
        self.peers = BoundedList[PeerFailureSignal]("peer_failures", lim)
        self.kills = BoundedList[KernelOomKill]("kernel_oom_kills", lim)
        self.invocations = BoundedList[OomKillerInvoked]("oom_invocations", lim)
        self.slurm = BoundedList[SlurmOomKill]("slurm_oom_kills", lim)
        self.fatal = BoundedList[FatalSignalLine]("fatal_signals", lim)
        self.memory: dict[tuple[int | None, str | None], MemoryKeeper] = {}
        self.flushes: Thinned[CacheFlushWarning] = Thinned(
            limits.series_head, limits.series_middle, limits.series_tail
        )
        self.flush_total = 0
        self.flush_max = 0
        self.flush_first: CacheFlushWarning | None = None
        self.flush_last: CacheFlushWarning | None = None
        self.step_samples: Thinned[StepSample] = Thinned(
            limits.series_head, limits.series_middle, limits.series_tail
        )
        self.loss = RunningStats()
        self.max_step: int | None = None
        self.last_step_sample: StepSample | None = None
        self.last_by_rank: dict[int | None, StepSample] = {}
        self.config_dump: DsConfigDump | None = None
        self.parsed_config_dump: DumpedConfig | None = None
        self.param_count: ParamCount | None = None
        self.config_dumps_seen = 0
        self.world: WorldSize | None = None
        self.summary_ooms: list[ProcessFailure] = []
        self.completion: CompletionLine | None = None
        self.platform: dict[str, PlatformHint] = {}
        self.alloc_summaries = BoundedList[AllocatorSummary]("allocator_summaries", 64)
        self.alloc_device: int | None = None
        self.smi_device: int | None = None
        self.last_prefix: LinePrefix | None = None
        self.progress_line: dict[int | None, int] = {}
        """The line of each rank's last training progress (not a progress bar)."""
        self.gpu_usage = BoundedList[GpuUsage]("gpu_usage", 64)
        self.gpu_processes = BoundedList[GpuProcess]("gpu_processes", 64)
        self.takers: dict[int, tuple[Callable[[LogReader, Line], bool], ...]] = {}
        """The matchers for each combination of line kinds seen (a handful)."""

    # --- the pass -------------------------------------------------------------------------

    def run(self) -> LogFacts:
        # The collector waits past the facts too: they are built from the pass's survivors
        # (thousands of kept samples at once), which hold no cycles; collecting as they were
        # built, and once over the whole pass's survivors as it ended, cost 0.14 s of a dense
        # 1 GiB 64-rank log's 4 s.
        with gc_paused():
            number = batches.read(self, self.jobs)
            self.source.stats.lines = number - 1
            self.tail = self._tail(number)
            if not self.every_line:
                self._read_the_end()
            self._close_all(at_end=True)
            fold_summary_ooms(self.oom, self.summary_ooms)
            self.oom.items.sort(key=lambda e: e.source.line or 0)
            return log_facts(self)

    def _read_the_end(self) -> None:
        """The kept last lines of an input read in bulk, read again for what only the wider
        table finds at a run's end (``END_OF_RUN``); a line holding an anchor of the main table
        was read by the pass already.  The clock does not move: only the pass's lines move it."""
        scanner = bulk.paste_scanner()
        clock = self.last_time, self.year
        for number, text in self.tail:
            raw = text.encode("utf-8", "surrogateescape")
            mask = 0
            for _, bits in scanner.hits(raw):
                mask |= bits
            if mask & END_OF_RUN and not mask & MAIN:
                self._handle(text, number, raw, 0, None, 0, mask & END_OF_RUN)
        self.last_time, self.year = clock

    def sample_progress_bar(self, data: bytes, first_line: int) -> None:
        """tqdm rewrites its bar many times a second: read only the block's last one."""
        for anchor in steps.TQDM_ANCHORS:
            hit = data.rfind(anchor)
            if hit < 0:
                continue
            start = data.rfind(b"\n", 0, hit) + 1
            end = data.find(b"\n", hit)
            end = len(data) if end < 0 else end
            text = self.cleaner.clean(data[start:end])
            rest, prefix = strip_prefixes(text, self.known_hosts)
            progress = steps.parse_step_line(rest)
            if progress is not None and progress.kind == "tqdm":
                if self.block_newlines is None:
                    self.block_newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
                number = first_line + int(np.searchsorted(self.block_newlines, start))
                rank = self._rank_of(prefix)
                self.add_step(
                    progress,
                    SourceRef(self.path, number, rank, prefix.host or self.layout_host),
                    self.last_time,
                )
            return

    def read_line(self, data: bytes, start: int, end: int, number: int, mask: int) -> None:
        """The per-line path for one line (``start``..``end`` of block ``data``)."""
        self.block_data = data
        self.line_start = start
        text = self.cleaner.clean(data[start:end])
        if self.every_line and text:
            text = paste.unquote(text)
        if text:
            self._handle(text, number, data, start, None, 0, mask)
        else:
            for key, stream in list(self.open_streams.items()):
                if not key and stream.tb.open:
                    self._feed_stream(
                        stream,
                        key,
                        "",
                        SourceRef(self.path, number, self.layout_rank, self.layout_host),
                        0,
                    )

    # --- one line -------------------------------------------------------------------------

    def _handle(
        self,
        text: str,
        number: int,
        data: bytes,
        start: int,
        outer: LinePrefix | None,
        depth: int,
        mask: int,
    ) -> None:
        rest, prefix = strip_prefixes(text, self.known_hosts)
        self.prefix_chars = len(text) - len(rest) if depth == 0 else -1
        if outer is not None and prefix.host is None and outer.host is not None:
            prefix = LinePrefix(
                outer.host,
                prefix.rank,
                prefix.local_rank,
                prefix.role,
                (("host", outer.host),) + prefix.key,
            )
        if depth < 8 and "[" in rest:
            glued = _GLUED.search(rest, 1)
            if glued is not None:
                self._handle_rest(rest[: glued.start()], prefix, number, data, start, mask)
                self._handle(rest[glued.start() :], number, data, start, prefix, depth + 1, mask)
                return
        self._handle_rest(rest, prefix, number, data, start, mask)

    def _wrapped_prefix(self, prefix: LinePrefix) -> LinePrefix:
        """A terminal that wraps a prefixed line prints the prefix once: a line with none that
        follows a rank's unfinished exception message continues that message."""
        last, self.last_prefix = self.last_prefix, prefix
        if prefix.key or last is None or not last.key:
            return prefix
        stream = self.streams.get(last.key)
        own = self.streams.get(())
        if stream is None or stream.tb.exception_class is None or (own is not None and own.open):
            return prefix
        self.last_prefix = last
        return last

    def _rank_of(self, prefix: LinePrefix) -> int | None:
        if prefix.rank is not None:
            if prefix.local_rank is not None and len(self.local_to_global) < MAX_STREAMS:
                self.local_to_global[(prefix.host, prefix.role, prefix.local_rank)] = prefix.rank
            return prefix.rank
        if prefix.local_rank is not None:
            return self.local_to_global.get(
                (prefix.host, prefix.role, prefix.local_rank), prefix.local_rank
            )
        return self.layout_rank

    def stream_of(self, key: tuple[object, ...]) -> StreamState:
        stream = self.streams.get(key)
        if stream is None:
            if len(self.streams) >= MAX_STREAMS:
                self._close_all(at_end=False)
                self.streams.clear()
            stream = self.streams[key] = StreamState()
        return stream

    def _handle_rest(
        self, rest: str, prefix: LinePrefix, number: int, data: bytes, start: int, mask: int
    ) -> None:
        above = self.line_above
        if self.every_line:
            prefix = self._wrapped_prefix(prefix)
            self.line_above = (number, rest)
        rank = self._rank_of(prefix)
        host = prefix.host if prefix.host is not None else self.layout_host
        if rank is not None and rank not in self.ranks_seen and len(self.ranks_seen) < MAX_STREAMS:
            self.ranks_seen.add(rank)
        if host is not None and host not in self.hosts_seen and len(self.hosts_seen) < MAX_STREAMS:
            self.hosts_seen.add(host)
        when: datetime | None = None
        first = rest[:1]
        if first and first in "[0123456789IWEF":
            when, has_year = leading_timestamp(rest, self.year)
            if when is not None and (not self.every_line or mask & MAIN or self.open_streams):
                # read line by line, only the lines a fast pass would see move the clock: the
                # times facts carry do not depend on how the input was read
                self.last_time = when
                if has_year:
                    self.year = when.year
        record = deepspeed.parse_logger_line(rest) if first == "[" else None
        if record is not None and rank is None and record.rank is not None:
            rank = record.rank
        ref = SourceRef(self.path, number, rank, host)
        self.above = above if self.every_line and above[0] else None
        key = prefix.key
        stream = self.stream_of(key)
        self.in_traceback = False
        if self.every_line:
            rest = paste.strip_logger(rest)  # a traceback relayed line by line by a service
        if stream.open or mask & TB or stream.pending_memory is not None:
            if self._feed_stream(stream, key, rest, ref, mask):
                return
        if mask:
            message = record.message if record is not None else rest
            wanted = self.takers.get(mask)
            if wanted is None:
                wanted = self.takers[mask] = takers(mask)
            line = Line(rest, message, record, ref, when, prefix, stream, key, data, start, mask)
            for take in wanted:
                if take(self, line):
                    return

    def _feed_stream(
        self, stream: StreamState, key: tuple[object, ...], rest: str, ref: SourceRef, mask: int
    ) -> bool:
        """Feed the stream's state machines; True when the line was consumed by one."""
        if stream.failure_block is not None:
            if stream.failure_block.feed(rest, ref.line):
                if stream.failure_block.done:
                    self._finish_failure_block(stream)
                    self.sync_open(key, stream)
                return True
            self._finish_failure_block(stream)
            self.sync_open(key, stream)
        if stream.config_dump is not None:
            consumed = stream.config_dump.feed(rest)
            if (consumed or stream.config_dump.json_closed) and len(
                stream.config_lines
            ) < MAX_CONFIG_DUMP_LINES:
                stream.config_lines.append((ref, rest))  # the closing "}" ends the dump, in it
            if consumed:
                return True
            self._finish_config_dump(stream)
            self.sync_open(key, stream)
        if stream.pending_memory is not None and not mask & DS_CPU:
            self.flush_memory(stream, None)
        now = self.last_time
        if stream.tb.open and stream.tb.exception_class is None and rest[:1] not in (" ", "\t", ""):
            now = self.time_before(self.block_data, self.line_start)  # a likely exception line
        was_open = stream.tb.open
        finished = stream.tb.feed(rest, ref, now)
        if finished is not None:
            self._finished(finished)
        self.in_traceback = was_open and stream.tb.open
        if stream.tb.exception_class is not None and (
            (mask & OOM and torch_oom.complete_on_its_line(rest))
            or (
                stream.tb.oom_like
                and stream.tb.message_lines > 1
                and stream.tb.may_hold_allocator_message()
                and stream.tb.may_be_complete()
                and torch_oom.wrapped_complete(stream.tb.exception_text)
            )
        ):
            finished = stream.tb.close()  # nothing follows a complete allocator message
            if finished is not None:
                self._finished(finished)
        current = stream.tb.exception_class
        if current is not None and current.endswith("ChildFailedError"):
            finished = stream.tb.close()
            if finished is not None:
                self._finished(finished)
            stream.failure_block = torchrun.FailureBlockParser(ref)
        self.sync_open(key, stream)
        return False

    def sync_open(self, key: tuple[object, ...], stream: StreamState) -> None:
        if stream.open:
            self.open_streams[key] = stream
        else:
            self.open_streams.pop(key, None)

    def standalone_exception(
        self,
        rest: str,
        ref: SourceRef,
        stream: StreamState,
        key: tuple[object, ...],
        data: bytes,
        start: int,
        mask: int,
    ) -> None:
        """An OOM, an uncaught C++ exception or a ChildFailedError outside any traceback."""
        finished = None
        if mask & TERMINATE:
            terminate = _TERMINATE.search(rest)
            if terminate is not None:
                finished = stream.tb.start_exception(
                    terminate.group("cls"), rest, ref, self.time_before(data, start)
                )
        elif mask & OOM and (mask & OOM_START or torch_oom.starts_oom(rest)):
            cls = _EXCEPTION_CLASS.search(rest)
            now = self.time_before(data, start)
            finished = stream.tb.start_exception(cls.group("cls") if cls else "", rest, ref, now)
            if self.above is not None and ref.line is not None and len(self.source_above) < 64:
                self.source_above[ref.line] = self.above
            if torch_oom.complete_on_its_line(rest):
                self._finished_maybe(finished)
                finished = stream.tb.close()
        elif (
            mask & SUMMARY
            and rest.rstrip().endswith("ChildFailedError:")
            and stream.failure_block is None
        ):
            stream.failure_block = torchrun.FailureBlockParser(ref)
        elif mask & SUMMARY and self.every_line and stream.failure_block is None:
            # a paste that starts inside torchrun's failure table
            if torchrun.starts_failure_table(rest):
                stream.failure_block = torchrun.FailureBlockParser(ref, headless=True)
                stream.failure_block.feed(rest, ref.line)
        elif mask & EXCEPTION:
            cls_name = paste.standalone_exception_class(rest)
            if cls_name is not None:
                finished = stream.tb.start_exception(
                    cls_name, rest, ref, self.time_before(data, start)
                )
        self._finished_maybe(finished)
        self.sync_open(key, stream)

    def _finished_maybe(self, finished: FinishedException | None) -> None:
        if finished is not None:
            self._finished(finished)

    # --- handlers -------------------------------------------------------------------------

    def _finished(self, finished: FinishedException) -> None:
        traceback = finished.traceback
        phase, evidence, placed = (
            classify_traceback(traceback) if traceback is not None else (Phase.UNKNOWN, None, None)
        )
        if phase is Phase.UNKNOWN:
            phase, evidence, placed = self._placed_by_source(finished, phase, evidence, placed)
        if not finished.exception_class and not finished.text:
            self.cut_tracebacks += 1
            if traceback is not None and traceback.frames:
                self.partial.append(
                    ExceptionEvent(
                        finished.source,
                        "",
                        "",
                        traceback,
                        phase,
                        evidence,
                        False,
                        None,
                        False,
                        phase_source=placed,
                    )
                )
            return
        messages = torch_oom.parse_oom_messages(
            finished.text or finished.exception_class,
            exception_class=finished.exception_class or None,
        )
        ref = finished.source
        when = finished.time
        for oom in messages:
            event = OomEvent(
                source=ref,
                message=oom,
                phase=phase,
                phase_evidence=evidence,
                traceback=traceback,
                origin="log",
                timestamp=when,
                timestamp_exact=False,
                preamble=torch_oom.preamble(finished.text, oom.text, oom.exception_class),
                phase_source=placed,
            )
            self._add_oom(event)
        if messages:
            return
        after_exception(self, finished)
        if traceback is None and not finished.exception_class:
            return
        peer = (
            torchrun.parse_peer_failure(finished.text) is not None
            or "DistBackendError" in finished.exception_class
        )
        self.exceptions.add(
            ExceptionEvent(
                source=ref,
                exception_class=finished.exception_class,
                text=finished.text[:2000],
                traceback=traceback,
                phase=phase,
                phase_evidence=evidence,
                peer_failure=peer,
                timestamp=when,
                timestamp_exact=False,
                phase_source=placed,
            )
        )

    def _placed_by_source(
        self,
        finished: FinishedException,
        phase: Phase,
        evidence: str | None,
        placed: SourceRef | None,
    ) -> tuple[Phase, str | None, SourceRef | None]:
        """No frame placed the error: the code that raised it, as the text shows it (the
        innermost frame's current line, or the source line right above an error that has no
        frame: ``source_line``), or a line only one phase prints, the last before the error
        (``library_lines``)."""
        traceback = finished.traceback
        if traceback is not None and traceback.current_line and traceback.frames:
            last = traceback.frames[-1]
            said = source_line_phase(traceback.current_line, last.filename)
            where = replace(traceback.source, line=last.at) if last.at is not None else None
        elif traceback is None and finished.source.line in self.source_above:
            line, text = self.source_above[finished.source.line]
            adjacent = line == finished.source.line - 1
            said = (source_line_phase(text) if adjacent else None) or announced_phase(text)
            where = replace(finished.source, line=line)
        else:
            return phase, evidence, placed
        if said is None:
            return phase, evidence, placed
        return said[0], said[1], where

    def _add_oom(self, event: OomEvent) -> None:
        self.oom.add(event)

    def _finish_failure_block(self, stream: StreamState) -> None:
        parser, stream.failure_block = stream.failure_block, None
        if parser is None or parser._rules == 0:
            return
        summary = parser.finish()
        self.summaries.add(summary)
        for failure in summary.failures:
            self.failures.add(failure)
            if (
                failure.pid is not None
                and failure.local_rank is not None
                and len(self.pid_local_rank) < MAX_STREAMS
            ):
                self.pid_local_rank.setdefault(failure.pid, failure.local_rank)
            if failure.rank is not None and len(self.ranks_seen) < MAX_STREAMS:
                self.ranks_seen.add(failure.rank)
            if failure.oom is not None:
                self._fold_summary_oom(failure)
        ranks = {f.rank for f in summary.failures if f.rank is not None}
        if ranks:
            self.set_world(max(ranks) + 1, "torchrun_summary", summary.source)

    def _fold_summary_oom(self, failure: ProcessFailure) -> None:
        if len(self.summary_ooms) < self.limits.max_events:
            self.summary_ooms.append(failure)

    def _finish_config_dump(self, stream: StreamState) -> None:
        collector, stream.config_dump = stream.config_dump, None
        lines, stream.config_lines = stream.config_lines, []
        if collector is None or stream.config_ref is None or self.config_dump is not None:
            return
        # imported here, as rare as config dumps are (12-17 ms of every read's start)
        from oomlens.ingest.ds_config import parse_config_dump

        dump = parse_config_dump(lines)
        self.parsed_config_dump = DumpedConfig(
            source=dump.header,
            effective=dump.effective(),
            user_config=dict(dump.user_config.data) if dump.user_config is not None else {},
            complete=dump.complete,
            problems=dump.problems,
        )
        self.config_dump = DsConfigDump(
            stream.config_ref,
            tuple(collector.entries),
            collector.json_text,
            collector.complete,
        )
        for name, value in collector.entries:
            if name == "world_size":
                try:
                    number = float(value.strip())
                except ValueError:
                    break
                self.set_world(
                    int(number) if number.is_integer() else number, "config_dump", stream.config_ref
                )
                break

    # --- closing ----------------------------------------------------------------------------

    def close_stale(self, number: int) -> None:
        """Close tracebacks whose stream stopped writing (its process died); failure blocks
        and config dumps end by themselves or at their bounded length."""
        for key, stream in list(self.open_streams.items()):
            if stream.tb.stale(number):
                finished = stream.tb.close()
                if finished is not None:
                    self._finished(finished)
            self.sync_open(key, stream)

    def _close_all(self, *, at_end: bool) -> None:
        for key, stream in list(self.streams.items()):
            if stream.tb.open:
                if at_end and stream.tb.in_frames:
                    self.ended_in_traceback = True
                finished = stream.tb.close()
                if finished is not None:
                    self._finished(finished)
            if stream.failure_block is not None:
                self._finish_failure_block(stream)
            if stream.config_dump is not None:
                self._finish_config_dump(stream)
            if stream.pending_memory is not None:
                self.flush_memory(stream, None)
            self.open_streams.pop(key, None)


def read_log(
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    host: str | None = None,
    display: str | None = None,
    limits: ReaderLimits | None = None,
    chunk_bytes: int | None = None,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> LogFacts:
    """Read one training log in one streaming pass; see the module docstring.

    ``jobs``: processes that scan the input ahead of the pass (``batches``), 0 for one per
    core; a log under ``batches.PARALLEL_MIN_BYTES`` on disk is scanned in this process
    whatever ``jobs`` says.  The facts are the same for any ``jobs``.  ``progress(read,
    total)`` is told the bytes read after each batch of a log of at least that size (``total``
    0 when compressed).

    Raises InputError when the file does not exist, cannot be read, is a directory, is
    empty, or cannot be decompressed at all.
    """
    source = open_text(
        path, display=display, **({"chunk_bytes": chunk_bytes} if chunk_bytes else {})
    )
    try:
        size = os.path.getsize(path)
    except OSError as exc:  # pragma: no cover - open_text checked it
        raise InputError(source.display, f"cannot be read ({exc})") from exc
    if size == 0:
        raise InputError(source.display, "is empty", "pass the log of the failed run")
    large = size >= batches.PARALLEL_MIN_BYTES
    if jobs <= 0:
        jobs = batches.default_jobs()
    reader = LogReader(
        source, rank=rank, host=host, limits=limits or ReaderLimits(), jobs=jobs if large else 1
    )
    if large and progress is not None:
        total = size if source.compression is Compression.NONE else 0
        reader.progress = lambda done: progress(done, total)
    return reader.run()
