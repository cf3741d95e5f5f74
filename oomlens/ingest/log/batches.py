"""The log reader's pass over its input: blocks grouped in batches, each batch scanned at once
(``bulk.scan_batch``: in this process, or in worker processes ahead of the reader), then read in
order: the per-line path for the lines that need it, runs of bulk lines applied at once
(``bulk_apply``).

The blocks are the text source's (1 MiB reads cut at a line end); the per-line path keeps
working block by block as before (block-relative offsets, the previous block's tail for look
behind, one tqdm sample per block), so a batch changes nothing it reads.  A run of bulk lines
may span blocks; it stops at the end of a block holding a tqdm bar (its sample comes between
that block's lines and the next block's).

Scanning is pure (a batch's bytes in, arrays out), so it is what runs in parallel: with
``jobs`` > 1, up to ``ahead(jobs)`` batches are scanned by worker threads (the C scan, ``native``,
which runs without the GIL) or worker processes (the pure path) while the reader reads the
earlier ones, and the reader applies every result in input order.  The facts are the same
whatever ``jobs`` is (tested); memory grows by the batches in flight (``BATCH_BLOCKS`` blocks each).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from oomlens.gcpause import gc_paused
from oomlens.ingest.log import bulk, bulk_apply, heap, native
from oomlens.ingest.log.bulk_apply import stream_key

if TYPE_CHECKING:
    from oomlens.ingest.log.reader import LogReader

Parts = tuple[bytes | memoryview, ...]
"""A block as ``TextSource.block_parts`` gives it: the pieces whose join is its bytes."""

BATCH_BLOCKS = 8 if native.NATIVE else 4
"""Blocks scanned at once.  The C scan's: 8 (8 MiB with the default 1 MiB blocks): its batches
cost little beyond their bytes (see ``GROUP_BATCHES``).  The pure path's: 4, large enough that
the scan's fixed costs vanish, small enough to keep memory flat: a batch's scan holds several
times its bytes at its peak (line index, padded copy, Arrow columns), and up to
``ahead(jobs) + 1`` batches are in flight.  Reading a dense 1 GiB 64-rank log with two workers
(peak RSS, CPU): 8 blocks 217 MiB, 36 s; 4 blocks 168 MiB, 37-38 s; 2 blocks 137 MiB, 41 s
(measured)."""
MIN_RUN = 32
"""Bulk lines applied at once below this count go the per-line way: the fixed cost of applying
a run is that of a few dozen lines read one by one (measured)."""
TAIL_BYTES = 16384
PARALLEL_MIN_BYTES = 32 << 20
"""A log smaller than this on disk is scanned in the reading process: starting workers costs
more than they save there."""


MERGE = 3
"""Scanned batches applied together (``bulk.merge_scans``), in the reading process as with
workers, where the reader waits for that many: applying a run costs a fixed part per rank
whatever its length, which a group pays once.  1 GiB 64-rank logs: in one process, apply CPU
and peak RSS with 1, 2, 3 batches together: dense 6.0, 4.7, 4.5 s at 162, 171, 185 MiB; sparse
7.1-8.9, 4.3, 2.9-3.7 s at 135, 138, 142 MiB.  With two workers on two cores (wall): dense
17.5 s one at a time, 15.2-16.1 s three; sparse 13.5 s, 9.6-10.4 s, peak RSS 177 and 143 MiB.
The facts are the same however batches are grouped (tested)."""


GROUP_BATCHES = 4
GROUP_HITS = 60_000
"""With the C scan, scanned batches are applied together until they hold this many batches'
worth of bytes (32 MiB with the default blocks) or this many anchored lines: a run's cost is
mostly a fixed part per rank, which a group pays once, and a group's memory is mostly its
anchored lines' arrays (about 250 bytes a line, scan and apply) and its bytes.  1 GiB 64-rank
logs, two cores, two threads, in-process time and peak RSS: sparse 7.4 s with groups of three
4 MiB batches, 5.1 s with six 8 MiB ones; dense 10.4 s and 8.1 s, at 139 and 188 MiB.  Since
the threads join the batches (``_scan``), whose buffers their malloc arenas keep, six
took the sparse log to 179-205 MiB; four: 155-168 MiB in the same time (2.5-3.0 s)."""


MAX_AHEAD = 5
"""Batches in flight at most, whatever ``jobs`` is: each holds about 10 MiB in the reading
process (its bytes and its scan), and past a few workers the reader's own in-order pass is what
limits the speed, not the scans.  Before batches were applied together (``MERGE``), 1 GiB dense
64-rank log, 16 cores: 8.3 s with 4 workers and 8 batches in flight, 8.0 s with 8 and 16,
9.2 s with 15 and 30, at 216, 268 and 370 MiB of peak RSS."""


NATIVE_AHEAD = 2
NATIVE_AHEAD_SPARSE = 3
"""Batches in flight at most with the C scan: it scans four times faster than the reader
applies, so two or three keep the threads busy.  Each holds 8 MiB of bytes and, when scanned,
its anchored lines' arrays: about as much again on a dense log, little on a sparse one, so a
third is in flight only while the batches are sparse (``_sparse``).  1 GiB 64-rank logs, two
cores, the collector paused for the pass: dense, peak RSS 189-202 MiB with 3 in flight,
162-164 MiB with 2; sparse 179 MiB and 4.6-4.9 s with 3, 172-177 MiB and 5.3-5.4 s with 2."""


SCAN_THREADS = 2
"""Threads that scan with the C scan, at most: each kept a malloc arena of its own, where the
batches it joined stayed, until the pass shared one (``heap.steady_heap``) (16 cores, dense
1 GiB log, 8 threads and 3 batches in flight: peak RSS 212 MiB, 181 MiB with 2 threads; with
the joins in the threads, 3 threads: 176-191 MiB), and the reader's in-order pass is what
limits past two (16 cores, three runs: dense 2.0-2.3 s with
2 threads, 1.8-2.4 s with 3; sparse 1.3-1.5 s and 1.4-1.5 s)."""


def ahead(jobs: int, sparse: bool = False) -> int:
    """How many batches are scanned ahead of the reader with ``jobs`` workers: enough that
    they have work while the reader applies the group it waited for; ``sparse``: the last
    batch scanned had few anchored lines (the C scan's arrays small)."""
    if native.NATIVE:
        return min(2 * jobs, NATIVE_AHEAD_SPARSE if sparse else NATIVE_AHEAD)
    return min(2 * jobs + MERGE - 1, MAX_AHEAD)


def _sparse(batch: _Batch, scan: bulk.BatchScan) -> bool:
    """Whether a scanned batch's arrays (about 120 bytes per anchored line) are under a
    sixteenth of its bytes."""
    return len(scan.hit_line) * 120 * 16 < len(batch.data)


def default_jobs() -> int:
    """Worker processes for ``--jobs auto``: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


class _Batch:
    """A batch's bytes held once: joined for the scan, each block cut out again as it is read
    (holding the blocks and their join too doubled the memory of the batches in flight)."""

    __slots__ = ("_cut", "_data", "_parts", "prev_tail", "starts")

    def __init__(self, blocks: list[Parts], prev_tail: bytes) -> None:
        self._parts: list[bytes | memoryview] | None = [part for block in blocks for part in block]
        self._data: bytes | None = None
        self.prev_tail = prev_tail
        starts = [0]
        for block in blocks[:-1]:
            starts.append(starts[-1] + sum(len(part) for part in block))
        self.starts = starts
        self._cut: tuple[int, bytes] | None = None

    @property
    def data(self) -> bytes:
        """The blocks' bytes, joined on first use (their parts, ``TextSource.block_parts``:
        each byte copied once): by the thread that scans the batch where threads scan
        (``_scan``)."""
        data = self._data
        if data is None:
            parts = self._parts
            assert parts is not None
            only = parts[0] if len(parts) == 1 else None
            data = self._data = only if isinstance(only, bytes) else b"".join(parts)
            self._parts = None
        return data

    def __len__(self) -> int:
        return len(self.starts)

    def block(self, b: int) -> bytes:
        """Block ``b``'s bytes (the last one cut is kept: a block is asked for again and
        again while it is read)."""
        if len(self.starts) == 1:
            return self.data
        if self._cut is None or self._cut[0] != b:
            end = self.starts[b + 1] if b + 1 < len(self.starts) else len(self.data)
            self._cut = (b, self.data[self.starts[b] : end])
        return self._cut[1]

    def tail_before(self, b: int) -> bytes:
        """The ``TAIL_BYTES`` before block ``b`` (the previous batch's for the first)."""
        if b == 0:
            return self.prev_tail
        start = self.starts[b]
        return self.data[max(self.starts[b - 1], start - TAIL_BYTES) : start]

    def size(self, b: int) -> int:
        """Block ``b``'s length in bytes."""
        return (self.starts[b + 1] if b + 1 < len(self.starts) else len(self.data)) - self.starts[b]

    def tail_of(self, b: int) -> bytes:
        """The last ``TAIL_BYTES`` of block ``b`` (its whole bytes when shorter), without
        cutting the block out: a block whose lines all go in runs is never cut out whole."""
        end = self.starts[b] + self.size(b)
        return self.data[max(self.starts[b], end - TAIL_BYTES) : end]


class _Merged:
    """Consecutive batches read as one (``bulk.merge_scans`` their scans): the blocks of all,
    nothing copied."""

    __slots__ = ("_parts", "starts")

    def __init__(self, batches: list[_Batch]) -> None:
        self._parts: list[tuple[_Batch, int]] = []
        self.starts: list[int] = []
        offset = 0
        for batch in batches:
            for b, start in enumerate(batch.starts):
                self._parts.append((batch, b))
                self.starts.append(offset + start)
            offset += len(batch.data)

    def __len__(self) -> int:
        return len(self._parts)

    def block(self, b: int) -> bytes:
        batch, own = self._parts[b]
        return batch.block(own)

    def tail_before(self, b: int) -> bytes:
        batch, own = self._parts[b]
        return batch.tail_before(own)

    def size(self, b: int) -> int:
        batch, own = self._parts[b]
        return batch.size(own)

    def tail_of(self, b: int) -> bytes:
        batch, own = self._parts[b]
        return batch.tail_of(own)


def _batches(reader: LogReader) -> Iterator[_Batch]:
    """The input's batches for the bulk path, but for its last ``LINE_BY_LINE_BYTES`` (whole
    lines), left in ``reader.final_text`` for ``_read_final``: the blocks are held back until
    that much follows them, so the input's size need not be known (a compressed one)."""
    from oomlens.ingest.log.reader import LINE_BY_LINE_BYTES

    blocks: list[Parts] = []
    size = 0
    previous_tail = b""
    limit = BATCH_BLOCKS * reader.source.chunk_bytes
    held: deque[Parts] = deque()
    held_size = 0
    for _, parts in reader.source.block_parts(number_lines=False):
        held.append(parts)
        held_size += _size(parts)
        while held and held_size - _size(held[0]) >= LINE_BY_LINE_BYTES:
            first = held.popleft()
            held_size -= _size(first)
            blocks.append(first)
            size += _size(first)
            if size >= limit:
                batch = _Batch(blocks, previous_tail)
                previous_tail = _last_bytes(blocks[-1], TAIL_BYTES)
                blocks, size = [], 0  # before the yield: the batch holds the bytes now
                yield batch
    if held:
        rest = b"".join(bytes(part) for parts in held for part in parts)
        cut = rest.find(b"\n", max(0, len(rest) - LINE_BY_LINE_BYTES - 1)) + 1
        if cut > 0:
            blocks.append((rest[:cut],))
        reader.final_text = rest[cut:]
    if blocks:
        yield _Batch(blocks, previous_tail)


def _size(parts: Parts) -> int:
    return sum(len(part) for part in parts)


def _read_final(reader: LogReader, number: int) -> int:
    """The input's last ``LINE_BY_LINE_BYTES`` read as an input that small is (every line,
    the wider anchor table, a paste's decorations): what a paste alone shows, it shows after
    any length of other lines (an exception without its traceback's header, an OOM message
    wrapped mid-word); the reader's state carries on from the bulk pass."""
    text, reader.final_text = reader.final_text, b""
    if not text:
        return number
    reader.every_line = True
    data = bulk.plain_spaces(text)
    batch = _Batch([(data,)], reader.prev_tail)
    scan = bulk.scan_batch(data, batch.starts, reader.prev_tail, paste=True)
    return _process(reader, batch, scan, number)


def _last_bytes(parts: Parts, count: int) -> bytes:
    """The last ``count`` bytes of the join of ``parts`` (all of it when shorter), copying
    only those."""
    taken: list[bytes] = []
    for part in reversed(parts):
        piece = part[-count:] if len(part) > count else part
        taken.append(bytes(piece))
        count -= len(piece)
        if count <= 0:
            break
    return b"".join(reversed(taken))


def _scan(
    batch: _Batch, scan: Callable[[bytes, list[int], bytes], bulk.BatchScan] | None = None
) -> bulk.BatchScan:
    """``scan`` (``_scan_bytes`` by default) of ``batch``, joining its blocks first.  Where
    threads scan, they call it (``bytes.join`` lets go of the GIL, and the reading thread is
    the one that limits on a dense log).  1 GiB dense 64-rank log, two cores, three runs each
    way: the reading thread's CPU 3.2-3.7 s, was 4.1-4.5 s with the joins (its page faults
    too); wall 3.9-4.4 s, was 4.6-4.9 s."""
    return (scan or _scan_bytes)(batch.data, batch.starts, batch.prev_tail)


def _scan_bytes(data: bytes, starts: list[int], prev_tail: bytes) -> bulk.BatchScan:
    """``bulk.scan_batch`` in this process or a worker (what a worker is sent: the bytes)."""
    # The scan builds a few million small acyclic objects (Aho-Corasick's match tuples, the
    # label slices): collections in the middle found nothing and cost a quarter of the scan's
    # time (dense 1 GiB log in one process: scan 36 s of CPU with the collector, 27 s without).
    with gc_paused():
        return bulk.scan_batch(data, starts, prev_tail)


def read(reader: LogReader, jobs: int = 1) -> int:
    """Read the whole input; returns the number of the line after the last."""
    # The cyclic collector waits for the end of the pass: what the pass builds holds no cycles
    # (a 150 MiB log of tracebacks and OOM messages read the per-line way left 322 objects in
    # cycles), and collecting once a batch cost the dense 1 GiB log 0.8 s of its 6.5 s
    with gc_paused():
        if reader.every_line:
            return _read_line_by_line(reader)
        with heap.steady_heap():
            return _read(reader, jobs)


def _read(reader: LogReader, jobs: int) -> int:
    return _read_final(reader, _read_bulk(reader, jobs))


def _read_bulk(reader: LogReader, jobs: int) -> int:
    number = 1
    if jobs <= 1:
        groups = _Groups(reader, number)
        for batch in _batches(reader):
            groups.add(batch, _scan(batch))
        return groups.finish()
    if native.NATIVE and bulk.AVAILABLE:
        # The C scan lets go of the GIL for all its passes: threads scan in parallel with the
        # reader and nothing is copied between processes (1 GiB dense 64-rank log, two cores:
        # 13.3 s with two worker processes, 4.3 s of it in the kernel passing batches and
        # arrays; 10.4 s with two threads, 1.7 s in the kernel)
        native.prepare()
        with ThreadPoolExecutor(max_workers=min(jobs, SCAN_THREADS)) as threads:
            return _read_in_threads(reader, threads, jobs, number)
    # imported here: the C scan needs neither (10-15 ms of every process's start)
    import concurrent.futures
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    processes = concurrent.futures.ProcessPoolExecutor
    with processes(max_workers=min(jobs, MAX_AHEAD), mp_context=context) as pool:
        return _read_ahead(reader, pool, jobs, number, _scan_bytes)


class _Groups:
    """Scanned batches, in input order, gathered into groups and each group applied once full
    (``_group_full``); ``number``: the line number after the last applied."""

    __slots__ = ("_group", "number", "reader", "sparse")

    def __init__(self, reader: LogReader, number: int) -> None:
        self.reader = reader
        self.number = number
        self._group: list[tuple[_Batch, bulk.BatchScan]] = []
        self.sparse = False
        """Whether the last batch added was sparse (``_sparse``); False until one is."""

    def add(self, batch: _Batch, scan: bulk.BatchScan) -> None:
        """The next scanned batch; its group applied if it is full now."""
        self._group.append((batch, scan))
        self.sparse = _sparse(batch, scan)
        if _group_full(self._group, self.reader):
            self.number = _process_group(self.reader, self._group, self.number)

    def finish(self) -> int:
        """Apply what is left; the number of the line after the last."""
        if self._group:
            self.number = _process_group(self.reader, self._group, self.number)
        return self.number


def _group_full(group: list[tuple[_Batch, bulk.BatchScan]], reader: LogReader) -> bool:
    """Whether the scanned batches held are applied now: ``MERGE`` of them on the pure path;
    with the C scan, once they hold ``GROUP_BATCHES`` batches' worth of bytes or
    ``GROUP_HITS`` anchored lines."""
    if not native.NATIVE:
        return len(group) >= MERGE
    size = sum(len(batch.data) for batch, _ in group)
    hits = sum(len(scan.hit_line) for _, scan in group)
    return size >= GROUP_BATCHES * BATCH_BLOCKS * reader.source.chunk_bytes or hits >= GROUP_HITS


def _read_line_by_line(reader: LogReader) -> int:
    """A small input (a paste, a window of a log; ``LogReader.every_line``): block by block as
    read, every line visited, anchors from the wider table, until the text read passes
    ``LINE_BY_LINE_MAX_TEXT`` (then the rest is read as any log, one block a batch)."""
    from oomlens.ingest.log.reader import LINE_BY_LINE_MAX_TEXT

    number = 1
    tail = b""
    for block in reader.source.blocks(number_lines=False):
        if reader.every_line and reader.source.stats.bytes_read > LINE_BY_LINE_MAX_TEXT:
            reader.every_line = False
        data = bulk.plain_spaces(block.data) if reader.every_line else block.data
        batch = _Batch([(data,)], tail)
        scan = bulk.scan_batch(data, batch.starts, tail, paste=reader.every_line)
        number = _process(reader, batch, scan, number)
        tail = data[-TAIL_BYTES:]
    return number


def _read_ahead(
    reader: LogReader,
    pool: Executor,
    jobs: int,
    number: int,
    scan: Callable[[bytes, list[int], bytes], bulk.BatchScan],
) -> int:
    """Scan ahead in ``pool`` (worker processes, sent each batch's bytes) while the reader
    reads the input and applies the scanned groups in order."""
    pending: deque[tuple[_Batch, Future[bulk.BatchScan]]] = deque()
    groups = _Groups(reader, number)

    def take() -> None:
        """The oldest scan into the groups."""
        batch, future = pending.popleft()
        groups.add(batch, future.result())

    for batch in _batches(reader):
        pending.append((batch, pool.submit(scan, batch.data, batch.starts, batch.prev_tail)))
        while len(pending) > ahead(jobs, groups.sparse):
            take()
    while pending:
        take()
    return groups.finish()


_T = TypeVar("_T")


class _InTurn(Generic[_T]):
    """The input's batches handed out to the threads that scan, the k-th to the k-th task
    (``take(k)``), in input order whichever thread runs a task: a task waits for the one
    before it to have read its batch.  A pool's queue is first in, first out, so the task
    waited for has been started: no task waits for one that never runs."""

    def __init__(self, batches: Iterator[_T]) -> None:
        self._batches = batches
        self._turn = 0
        self._ended = False
        self._turns = threading.Condition()

    def take(self, k: int) -> _T | None:
        """Batch ``k`` (None past the last, or once reading failed: the failure is raised by
        the task whose batch it was)."""
        with self._turns:
            self._turns.wait_for(lambda: self._turn == k)
            try:
                batch = None if self._ended else next(self._batches, None)
                self._ended = batch is None
                return batch
            except BaseException:
                self._ended = True
                raise
            finally:
                self._turn += 1
                self._turns.notify_all()


def _read_in_threads(reader: LogReader, threads: Executor, jobs: int, number: int) -> int:
    """Read, join and scan batches in ``threads`` (``_InTurn``) while this thread applies
    the scanned groups in order.  Reading the input here kept it off the threads' hands
    while this thread applied a group, and cost this thread, the one that limits once there
    are cores to spare, 0.35 s of CPU per dense GiB (the copy from the page cache and
    ``TextSource.block_parts``).  A task holds no bytes until it starts, so the batches in
    flight, and the memory, are those of ``_read_ahead``."""
    turns = _InTurn(_batches(reader))

    def read_and_scan(k: int) -> tuple[_Batch, bulk.BatchScan] | None:
        batch = turns.take(k)
        return None if batch is None else (batch, _scan(batch, bulk.scan_batch))

    pending: deque[Future[tuple[_Batch, bulk.BatchScan] | None]] = deque()
    groups = _Groups(reader, number)
    submitted, ended = 0, False
    while True:
        while not ended and len(pending) <= ahead(jobs, groups.sparse):
            pending.append(threads.submit(read_and_scan, submitted))
            submitted += 1
        if not pending:
            break
        scanned = pending.popleft().result()
        if scanned is None:
            ended = True  # the tasks after it find no batch either
            continue
        groups.add(*scanned)
        del scanned  # the group holds the scan now, and lets go of it once merged
    return groups.finish()


def _process_group(
    reader: LogReader, group: list[tuple[_Batch, bulk.BatchScan]], number: int
) -> int:
    """Read consecutive scanned batches as one; returns the next line number.  Empties
    ``group``: the batches' own scans are let go of once merged."""
    if len(group) == 1:
        batch, scan = group.pop()
        return _process(reader, batch, scan, number)
    merged = bulk.merge_scans([scan for _, scan in group], [len(batch.data) for batch, _ in group])
    batches = _Merged([batch for batch, _ in group])
    group.clear()
    return _process(reader, batches, merged, number)


def _process(reader: LogReader, batch: _Batch | _Merged, scan: bulk.BatchScan, number: int) -> int:
    """Read one scanned batch, block by block; returns the next line number (the collector
    paused by ``read``)."""
    number = _process_blocks(reader, batch, scan, number)
    if reader.progress is not None:
        reader.progress(reader.source.stats.bytes_read)
    return number


def _process_blocks(
    reader: LogReader, batch: _Batch | _Merged, scan: bulk.BatchScan, number: int
) -> int:
    hit_line = scan.hit_line
    # where each run must stop: the next line for the per-line path, the end of a tqdm block
    n = len(hit_line)
    per_line = np.flatnonzero(scan.kind == bulk.NONE)
    next_stop = np.full(n + 1, n, dtype=np.int64)
    if len(per_line):
        marks = np.full(n + 1, n, dtype=np.int64)
        marks[per_line] = per_line
        next_stop = np.minimum.accumulate(marks[::-1])[::-1]
    line_base = 0
    block_ends: list[int] = []
    for count in scan.line_counts:
        line_base += count
        block_ends.append(int(np.searchsorted(hit_line, line_base)))
    stops = [end for bar, end in zip(scan.progress_bars, block_ends, strict=True) if bar]
    context = _Context(reader, batch, scan, number, next_stop, stops)
    h = 0
    line_base = 0
    for b in range(len(batch)):
        count = scan.line_counts[b]
        reader.consumed_until = 0
        reader.block_newlines = None
        context.block = b
        h = _scan_block(context, batch, h, block_ends[b], line_base, number)
        if scan.progress_bars[b]:
            reader.sample_progress_bar(batch.block(b), number)
        tail = batch.tail_of(b)
        reader.prev_tail = tail
        # the input's last bytes (its tail lines), whatever the blocks: a short block adds on
        ends = reader.end_bytes + tail if batch.size(b) < TAIL_BYTES else tail
        reader.end_bytes = ends[-TAIL_BYTES:]
        number += count
        line_base += count
    return number


class _Context:
    """What a batch's runs need: where they stop, and the blocks for deferred labels."""

    __slots__ = ("batch", "block", "first_line", "next_stop", "reader", "scan", "stops")

    def __init__(
        self,
        reader: LogReader,
        batch: _Batch | _Merged,
        scan: bulk.BatchScan,
        first_line: int,
        next_stop: np.ndarray,
        stops: list[int],
    ) -> None:
        self.reader = reader
        self.batch = batch
        self.scan = scan
        self.first_line = first_line
        self.next_stop = next_stop
        self.stops = stops
        self.block = 0

    def run_end(self, h: int) -> int:
        end = int(self.next_stop[h])
        for stop in self.stops:
            if stop > h:
                return min(end, stop)
        return end

    def deferred_label(self, h: int) -> str | None:
        """``label_before`` for the memory line at hit ``h``, in its block."""
        scan, batch, reader = self.scan, self.batch, self.reader
        start = int(scan.hit_start[h])
        b = int(np.searchsorted(batch.starts, start, side="right")) - 1
        block = batch.block(b)
        prev_tail = batch.tail_before(b)
        reader.prefix_chars = int(scan.prefix_len[h])
        return reader.label_before(
            block, start - batch.starts[b], stream_key(int(scan.key[h]), scan.hosts), prev_tail
        )


def _scan_block(
    context: _Context,
    batch: _Batch | _Merged,
    h: int,
    h_end: int,
    line_base: int,
    first_line: int,
) -> int:
    """Block ``context.block``'s lines that need the per-line path (every line while a stream
    is open) and the bulk runs between them; returns the next hit to read (past this block when
    a run went on into the next ones).  The block's bytes are cut out of the batch only when a
    line is read the per-line way (1 GiB dense log: 0.2 s of copies for nothing otherwise)."""
    reader, scan = context.reader, context.scan
    hit_line, bits, kind, consumed = scan.hit_line, scan.hit_bits, scan.kind, scan.consumed
    line_count = scan.line_counts[context.block]
    positions: np.ndarray | None = None
    k = 0
    while True:
        if not reader.open_streams and not reader.every_line:
            while h < h_end and hit_line[h] - line_base < k:
                h += 1
            if h >= h_end:
                return h
            if kind[h] != bulk.NONE and not consumed[h]:
                end = context.run_end(h)
                if end - h >= MIN_RUN and bulk_apply.apply_run(
                    reader,
                    scan,
                    h,
                    end,
                    context.first_line,
                    context.deferred_label,
                ):
                    h = end
                    if h >= h_end:
                        return h
                    k = int(hit_line[h]) - line_base
                    continue
            k = int(hit_line[h]) - line_base
            mask = int(bits[h])
            h += 1
        elif k >= line_count:
            return h
        else:
            mask = 0
            while h < h_end and hit_line[h] - line_base <= k:
                if hit_line[h] - line_base == k:
                    mask = int(bits[h])
                h += 1
        if positions is None:
            data = batch.block(context.block)
            positions = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            reader.block_newlines = positions
        start = int(positions[k - 1]) + 1 if k else 0
        end_at = int(positions[k]) if k < len(positions) else len(data)
        if start >= reader.consumed_until:
            reader.read_line(data, start, end_at, first_line + k, mask)
        k += 1
        if reader.open_streams:
            reader.lines_since_stale_check += 1
            if reader.lines_since_stale_check >= 32:
                reader.lines_since_stale_check = 0
                reader.close_stale(first_line + k)
