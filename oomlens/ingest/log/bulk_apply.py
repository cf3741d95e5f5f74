"""A run of bulk lines applied to the log reader's state at once, as the per-line path would
have applied them one by one.

A run is consecutive anchor lines of a ``BatchScan`` that are all bulk lines (memory, CPU,
cache-flush and step lines the scan read), met while no stream has a traceback, a failure
block or a config dump open.  What the per-line path does with such lines, and how it is done
here with arrays instead:

* every line it visits marks its rank as seen and makes its stream; a leading timestamp
  becomes the reader's last time (and year); a step line's step its last step: carried forward
  over the run (``_Latest``);
* a memory line opens its stream's pending sample (label, values, last time, last step); the
  stream's next visited line closes it, with the CPU values when that is a CPU line; a CPU line
  right after its memory line, read ahead with it (``consumed``), closes it at once.  Samples
  reach their rank's series in the order they close (``_memory``);
* cache-flush and step lines add to their series in line order.

Only the items the thinned series keep are built as objects; the statistics take whole arrays
(``RunningStats.merge``, exact).  ``apply_run`` returns False, changing nothing, when the run
would make more streams than the reader follows (the per-line path then takes it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import numpy as np

from oomlens.facts import SourceRef
from oomlens.facts.log import CacheFlushWarning, MemorySample, StepSample
from oomlens.ingest.log import bulk, bulk_keys, bulk_labels, native
from oomlens.ingest.log.deepspeed import MemoryReading
from oomlens.ingest.log.series import (
    Lazy,
    RunningStats,
    first_seen,
    grouped_columns,
    grouped_stats,
    grouped_sums,
    small_ints,
)
from oomlens.ingest.log.state import MAX_LABELS, MemoryKeeper

if TYPE_CHECKING:
    from oomlens.ingest.log.reader import LogReader

_EPOCH = datetime(1970, 1, 1)
MAX_STREAMS = 4096
Pending = tuple[SourceRef, str | None, MemoryReading, datetime | None, int | None]


def when_of(micros: int) -> datetime:
    """A scan timestamp (microseconds since 1970) as the naive datetime the parsers make."""
    return _EPOCH + timedelta(microseconds=micros)


def stream_key(key: int, hosts: list[str]) -> tuple[object, ...]:
    """The ``LinePrefix.key`` of a scan key (``hosts``: the scan's)."""
    host, key = bulk_keys.split_key(key)
    outer: tuple[object, ...] = () if host < 0 else (("host", hosts[host]),)
    if key == bulk_keys.NO_KEY:
        return outer
    if key >= bulk_keys.TASK_ROLE:
        return (*outer, ("task", key - bulk_keys.TASK_ROLE))
    if key >= bulk_keys.DEFAULT_ROLE:
        return (*outer, ("default", key - bulk_keys.DEFAULT_ROLE))
    return (*outer, ("rank", key))


class _Latest:
    """For positions of a run, the latest position where a mask holds (at or before it with
    ``include_self``, strictly before it otherwise), -1 for none: looked up for the positions
    asked about (the few thousand samples a series keeps), not made for every line."""

    __slots__ = ("_marks", "_side")

    def __init__(self, mask: np.ndarray, include_self: bool) -> None:
        self._marks = np.flatnonzero(mask)
        self._side: Literal["left", "right"] = "right" if include_self else "left"

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        """The latest marked position for each of ``positions`` (int64 array)."""
        if not len(self._marks):
            return np.full(len(positions), -1, dtype=np.int64)
        at = np.searchsorted(self._marks, positions, side=self._side) - 1
        return np.where(at >= 0, self._marks[np.maximum(at, 0)], -1)

    def at(self, position: int) -> int:
        """``self[[position]]`` for one position.  By one ``searchsorted`` a call: a run asks
        a hundred times or so (dense 1 GiB 64-rank log: 12,290 calls over 120 runs) about a
        mask marking most of its lines, which ``bisect`` over a list needed made first
        (3 M ints, 0.16 s of the reading thread's CPU)."""
        at = int(self._marks.searchsorted(position, side=self._side)) - 1
        return int(self._marks[at]) if at >= 0 else -1


class Run:
    """One run's arrays, and what the per-line path would know at each of its lines."""

    def __init__(
        self,
        reader: LogReader,
        scan: bulk.BatchScan,
        lo: int,
        hi: int,
        first_line: int,
        deferred: Callable[[int], str | None],
    ) -> None:
        self.reader = reader
        self.scan = scan
        self.lo = lo
        self.kind = scan.kind[lo:hi]
        self.consumed = scan.consumed[lo:hi]
        self.handled = ~self.consumed
        self.keys = scan.key[lo:hi]
        self.numbers = scan.hit_line[lo:hi] + first_line
        self.ts = scan.ts[lo:hi]
        self.deferred = deferred
        ranks: list[int | None] = []
        firsts, self.stream = first_seen(self.keys)
        """Each hit's stream: its index in ``stream_keys``."""
        self.stream_keys: list[int] = self.keys[firsts].tolist()
        self.hosts: list[str | None] = [reader.layout_host]
        """Host names by index, each once: 0 the file's (the lines without a host's prefix)."""
        stream_hosts: list[int] = []
        for hosted in self.stream_keys:
            h, key = bulk_keys.split_key(hosted)
            host = reader.layout_host if h < 0 else scan.hosts[h]
            stream_hosts.append(0 if h < 0 else self.host_index(host))
            if key == bulk_keys.NO_KEY:
                ranks.append(reader.layout_rank)
            elif key >= bulk_keys.TASK_ROLE:
                ranks.append(key - bulk_keys.TASK_ROLE)
            elif key >= bulk_keys.DEFAULT_ROLE:
                local = key - bulk_keys.DEFAULT_ROLE
                where = (None if h < 0 else host, "default", local)
                ranks.append(reader.local_to_global.get(where, local))
            else:
                ranks.append(key)
        self.stream_ranks = [-1 if r is None else r for r in ranks]
        """Each stream's rank (-1: none), in ``stream_keys``'s order."""
        self.stream_hosts = stream_hosts
        """Each stream's host, an index in ``hosts``."""
        self.host = np.asarray(stream_hosts, dtype=np.int64)[self.stream]
        """Each hit's host, an index in ``hosts``."""
        self.prefix_rank = np.asarray(self.stream_ranks, dtype=np.int64)[self.stream]
        # a progress line: the record's "[Rank N]" or the text's rank when the prefix gives none
        own = (self.kind == bulk.PROGRESS) & (self.prefix_rank < 0)
        self.rank = np.where(own, np.maximum(scan.c[lo:hi], -1), self.prefix_rank)
        self.time_source = _Latest(self.handled & (self.ts != bulk_keys.NO_TS), include_self=True)
        progress = self.handled & (self.kind == bulk.PROGRESS)
        self.samples = progress & ((scan.d[lo:hi] & bulk.FORM_MASK) != 0)
        """The progress lines that report progress (a ``StepSample`` each)."""
        self.step_lines = progress & ((scan.d[lo:hi] & bulk.HAS_STEP) != 0)
        self.step_source = _Latest(self.step_lines, include_self=False)
        self._times: dict[int, datetime] = {}

    def when(self, i: int) -> datetime | None:
        """The reader's last time once line ``i``'s own timestamp is read (the matchers'
        ``line.when or reader.last_time``)."""
        source = self.time_source.at(i)
        if source < 0:
            return self.reader.last_time
        found = self._times.get(source)
        if found is None:
            found = self._times[source] = when_of(int(self.ts[source]))
        return found

    def step(self, i: int) -> int | None:
        """The reader's last step when line ``i`` is read."""
        source = self.step_source.at(i)
        return self.reader.last_step if source < 0 else int(self.scan.a[self.lo + source])

    def ref(self, i: int, rank: int | None = None) -> SourceRef:
        r = int(self.rank[i]) if rank is None else rank
        number = int(self.numbers[i])
        host = self.hosts[int(self.host[i])]
        return SourceRef(self.reader.path, number, None if r < 0 else r, host)

    def host_index(self, host: str | None) -> int:
        """The index of ``host`` in ``hosts`` (added if new)."""
        if host in self.hosts:
            return self.hosts.index(host)
        self.hosts.append(host)
        return len(self.hosts) - 1

    def label(self, i: int) -> str | None:
        ident = int(self.scan.label[self.lo + i])
        if ident == bulk_labels.LABEL_DEFERRED:
            return self.deferred(self.lo + i)
        return None if ident < 0 else self.scan.labels[ident]


def apply_run(
    reader: LogReader,
    scan: bulk.BatchScan,
    lo: int,
    hi: int,
    first_line: int,
    deferred: Callable[[int], str | None],
) -> bool:
    """Apply hits ``lo..hi`` of ``scan`` (all bulk lines; batch line 0 is line number
    ``first_line``); ``deferred(h)`` looks up the label of the memory line at hit ``h`` that
    the scan left to the reader.  False, and nothing changed, when the run would need more
    streams than the reader follows."""
    run = Run(reader, scan, lo, hi, first_line, deferred)
    new = [k for k in run.stream_keys if stream_key(k, scan.hosts) not in reader.streams]
    if len(reader.streams) + len(new) > MAX_STREAMS:
        return False
    _seen(run)
    _memory(run)
    _flushes(run)
    _steps(run)
    stamped = np.flatnonzero(run.handled & (run.ts != bulk_keys.NO_TS))
    if len(stamped):
        last = run.when(int(stamped[-1]))
        assert last is not None
        reader.last_time = last
        reader.year = last.year
    reader.in_traceback = False
    return True


def _first_occurrences(values: np.ndarray) -> list[int]:
    """The distinct ``values``, in the order they first occur."""
    result: list[int] = values[first_seen(values)[0]].tolist()
    return result


def _seen(run: Run) -> None:
    reader = run.reader
    # the streams of the visited lines in the order they first come, and their ranks (a
    # prefix's rank is its stream's)
    streams = _first_occurrences(run.stream[run.handled])
    hosts = run.scan.hosts
    for s in streams:
        reader.stream_of(stream_key(run.stream_keys[s], hosts))
    for rank in dict.fromkeys(run.stream_ranks[s] for s in streams):
        if rank >= 0 and rank not in reader.ranks_seen and len(reader.ranks_seen) < MAX_STREAMS:
            reader.ranks_seen.add(rank)
    for h in dict.fromkeys(run.stream_hosts[s] for s in streams):
        host = run.hosts[h]
        if host is not None and host not in reader.hosts_seen:
            if len(reader.hosts_seen) < MAX_STREAMS:
                reader.hosts_seen.add(host)
    # strip_prefixes remembers a host given before a known prefix
    for s in streams:
        h = bulk_keys.split_key(run.stream_keys[s])[0]
        if h >= 0 and run.scan.host_followed[h] and len(reader.known_hosts) < 4096:
            reader.known_hosts.add(hosts[h])


# --- memory samples ---------------------------------------------------------------------------


def _memory(run: Run) -> None:
    streams = [run.reader.streams[stream_key(k, run.scan.hosts)] for k in run.stream_keys]
    open_before = np.asarray([s.pending_memory is not None for s in streams], dtype=np.int8)
    line, cpu, state = _close_order(run.kind, run.consumed, run.stream, open_before)
    # the samples open before the run, by their rows in closing order
    before = np.flatnonzero(line < 0)
    pending: dict[int, Pending] | None = None
    if len(before):
        opened = (-1 - line[before]).tolist()
        pending = {
            r: cast(Pending, streams[s].pending_memory)
            for r, s in zip(before.tolist(), opened, strict=True)
        }
        line[before] = -1
    for s, open_at in enumerate(state.tolist()):
        if open_at >= 0:
            streams[s].pending_memory = _pending(run, open_at)
        elif open_at == -1:
            streams[s].pending_memory = None
    if len(line):
        _feed_keepers(run, line, cpu, pending)


def _close_order(
    kind: np.ndarray, consumed: np.ndarray, stream: np.ndarray, open_before: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A run's memory samples in the order they close, and what each stream leaves open:
    ``_scan.close_order``'s contract (see ``_scan_apply.h``): per closed sample, its hit
    (``-1 - s``: stream ``s``'s sample from before the run) and the hit of its CPU values (-1:
    none); per stream, the hit of the sample left open (-1: none, -2: the one from before the
    run, when no line of the stream was visited).  The bulk path runs only with the
    extension (``bulk.AVAILABLE``)."""
    assert native._scan is not None
    closing = native._scan.close_order(
        np.ascontiguousarray(kind, dtype=np.int8),
        np.ascontiguousarray(consumed, dtype=bool),
        np.ascontiguousarray(stream, dtype=np.int64),
        np.ascontiguousarray(open_before, dtype=np.int8),
    )
    # writable: the caller marks the rows from before the run
    line, cpu, state = (np.frombuffer(raw, dtype=np.int64) for raw in closing)
    return line, cpu, state


def _pending(run: Run, i: int) -> Pending:
    scan, j = run.scan, run.lo + i
    reading = MemoryReading(int(scan.a[j]), int(scan.b[j]), int(scan.c[j]), int(scan.d[j]))
    return (run.ref(i), run.label(i), reading, run.when(i), run.step(i))


def _feed_keepers(
    run: Run, line: np.ndarray, cpu: np.ndarray, pending: dict[int, Pending] | None
) -> None:
    """The closed samples, in closing order (``_close_order``'s ``line`` and ``cpu``, -1 for
    the samples open before the run, in ``pending`` by row), to their ranks' series: objects
    for the samples the thinned series keep, exact statistics for all (one grouped pass per
    column)."""
    reader, scan, lo = run.reader, run.scan, run.lo
    rows = len(line)
    j = lo + np.maximum(line, 0)
    values = np.stack((scan.a[j], scan.b[j], scan.c[j]), axis=1).astype(np.float64)
    ranks = run.rank[np.maximum(line, 0)].copy()
    hosts = run.host[np.maximum(line, 0)].copy()
    labels = np.where(line >= 0, scan.label[j], bulk_labels.LABEL_NONE).astype(np.int64)
    extra: list[str] = []
    extra_ids: dict[str, int] = {}

    def text_id(text: str | None) -> int:
        # the scan's id of a text it holds (its table, made once per scan), else one past them
        if text is None:
            return bulk_labels.LABEL_NONE
        found = bulk.label_ids(scan).get(text)
        if found is None:
            found = extra_ids.get(text)
            if found is None:
                found = extra_ids[text] = len(scan.labels) + len(extra)
                extra.append(text)
        return found

    for r in np.flatnonzero(labels == bulk_labels.LABEL_DEFERRED).tolist():
        labels[r] = text_id(run.deferred(int(j[r])))
    for r in np.flatnonzero(line < 0).tolist():
        p = None if pending is None else pending.get(r)
        if p is not None:
            values[r] = (p[2].allocated, p[2].max_allocated, p[2].reserved)
            ranks[r] = -1 if p[0].rank is None else p[0].rank
            hosts[r] = run.host_index(p[0].host)
            labels[r] = text_id(p[1])
    texts = scan.labels + extra if extra else scan.labels
    cpu_rows = cpu >= 0
    cpu_used = scan.a[lo + np.maximum(cpu, 0)].astype(np.float64)
    # Each rank's keeper (of a host), made on first use up to the cap (one past it is dropped).
    keepers: list[MemoryKeeper | None] = []
    firsts, rank_group = first_seen(hosts * bulk_keys.HOST_ROLE + ranks + 1)
    keeper_of_group = np.full(len(firsts), -1, dtype=np.int64)
    for g, (rank, h) in enumerate(zip(ranks[firsts].tolist(), hosts[firsts].tolist(), strict=True)):
        host = run.hosts[h]
        key = (None if rank < 0 else rank, host)
        keeper = reader.memory.get(key)
        if keeper is None and len(reader.memory) < MAX_STREAMS:
            keeper = reader.memory[key] = MemoryKeeper(key[0], host, reader.limits)
        if keeper is not None:
            keeper_of_group[g] = len(keepers)
            keepers.append(keeper)
    keeper_of = keeper_of_group[rank_group]
    kept = keeper_of >= 0
    # the kept rows by keeper, in closing order within a keeper (the dropped, -1, sort first)
    by_keeper = np.argsort(small_ints(keeper_of), kind="stable")[rows - int(kept.sum()) :]
    columns = grouped_columns(keeper_of, [values[:, c] for c in range(3)], by_keeper)
    cpu_stats = grouped_stats(keeper_of[kept & cpu_rows], cpu_used[kept & cpu_rows])
    rows_of = _SampleRows(run, line, cpu, pending, labels, texts, hosts)
    # The rows each keeper's thinned series keeps, read out for all keepers at once.
    sizes = np.bincount(keeper_of[kept], minlength=len(keepers))
    groups = np.split(by_keeper, np.cumsum(sizes)[:-1])
    plans = []
    for keeper, mine in zip(keepers, groups, strict=True):
        assert keeper is not None
        positions, stride = keeper.samples.wanted(len(mine))
        plans.append((positions, stride, keeper.samples.tail_split(len(mine), positions)))
    # the rows kept for good, keeper after keeper, then those that end in a tail: built only
    # if still kept at the end, and a tail's read only if kept past it
    good, tails = [], []
    for mine, (positions, _, split) in zip(groups, plans, strict=True):
        good.append(mine[positions[:split]])
        tails.append(mine[positions[split:]])
    fields = rows_of.fields(np.concatenate(good + tails)) if groups else None
    at, tail_at = 0, sum(len(part) for part in good)
    for k, keeper in enumerate(keepers):
        assert keeper is not None and fields is not None
        positions, stride, split = plans[k]
        ends = tail_at + len(positions) - split
        keeper.samples.place(
            len(groups[k]),
            positions,
            stride,
            fields.items(at, at + split),
            fields.tail(tail_at, ends),
        )
        at, tail_at = at + split, ends
        keeper.allocated.merge(*columns[0][k])
        keeper.max_allocated.merge(*columns[1][k])
        keeper.reserved.merge(*columns[2][k])
        if k in cpu_stats:
            keeper.cpu.merge(*cpu_stats[k])
    _labels(keepers, keeper_of, labels, values, texts)


class _SampleRows:
    """What a run's closed samples are made of, read out only for the samples a series keeps
    (``fields``)."""

    def __init__(
        self,
        run: Run,
        line: np.ndarray,
        cpu: np.ndarray,
        pending: dict[int, Pending] | None,
        labels: np.ndarray,
        texts: list[str],
        hosts: np.ndarray,
    ) -> None:
        self.run, self.line, self.cpu, self.pending = run, line, cpu, pending
        self.labels, self.texts, self.hosts = labels, texts, hosts

    def fields(self, rows: np.ndarray) -> _Fields:
        """The ``rows`` (of the closed samples) as columns of fields, a sample the reader had
        open before the run built at once, from what it read."""
        run, scan, lo = self.run, self.run.scan, self.run.lo
        line = self.line[rows]
        i = np.maximum(line, 0)
        j = lo + i
        cpu = self.cpu[rows]
        c = lo + np.maximum(cpu, 0)
        has_cpu = cpu >= 0
        step_source = run.step_source[i]
        steps = np.where(step_source >= 0, scan.a[lo + np.maximum(step_source, 0)], -1)
        time_source = run.time_source[i]
        micros = np.where(time_source >= 0, run.ts[np.maximum(time_source, 0)], bulk_keys.NO_TS)
        reader, texts = run.reader, self.texts
        columns = [
            run.numbers[i].tolist(),
            run.rank[i].tolist(),
            _texts_of(texts, self.labels[rows]),
            scan.a[j].tolist(),
            scan.b[j].tolist(),
            scan.c[j].tolist(),
            scan.d[j].tolist(),
            np.where(has_cpu, scan.a[c], -1).tolist(),
            np.where(has_cpu, scan.f[c], np.nan).tolist(),
            has_cpu.tolist(),
            steps.tolist(),
            micros.tolist(),
            _texts_of(cast(list[str], run.hosts), self.hosts[rows]),
        ]
        built: dict[int, MemorySample] = {}
        if self.pending is not None:
            for r in np.flatnonzero(line < 0).tolist():
                p = self.pending.get(int(rows[r]))
                if p is not None:  # a sample the reader had open: what it read then
                    used = scan.a[c[r]] if has_cpu[r] else None
                    pct = scan.f[c[r]] if has_cpu[r] else None
                    reading = p[2]
                    built[r] = MemorySample(
                        p[0],
                        p[1],
                        reading.allocated,
                        reading.max_allocated,
                        reading.reserved,
                        reading.max_reserved,
                        None if used is None else int(used),
                        None if pct is None else float(pct),
                        p[4],
                        p[3],
                    )
        builder = _Builder(reader.path, reader.last_step, reader.last_time)
        return _Fields(builder, columns, built)


def _texts_of(texts: list[str], ids: np.ndarray) -> list[str | None]:
    """The label texts of ``ids`` (None for those below 0)."""
    # by the rows asked about, not the table (a scan of labels naming their step: 10^4 texts)
    result: list[str | None] = [texts[i] if i >= 0 else None for i in ids.tolist()]
    return result


class _Fields:
    """Rows of closed samples as columns of fields (``_SampleRows.fields``), and those built
    already (by row)."""

    __slots__ = ("build", "built", "columns")

    def __init__(
        self, builder: _Builder, columns: list[list[Any]], built: dict[int, MemorySample]
    ) -> None:
        self.build, self.columns, self.built = builder.build, columns, built

    def items(self, start: int, end: int) -> list[MemorySample]:
        """Rows ``start..end`` as ``Lazy`` items (one tuple of fields each), most of which
        the series drop again unbuilt as later samples come."""
        build = self.build
        rows = zip(*(column[start:end] for column in self.columns), strict=True)
        items = cast(list[MemorySample], [Lazy(build, row) for row in rows])
        for r, sample in self.built.items():
            if start <= r < end:
                items[r - start] = sample
        return items

    def tail(self, start: int, end: int) -> _TailRows:
        """Rows ``start..end`` as a sequence of ``Lazy`` items made when read."""
        columns = [column[start:end] for column in self.columns]
        built = {r - start: s for r, s in self.built.items() if start <= r < end}
        return _TailRows(self.build, columns, built)


class _TailRows(Sequence[MemorySample]):
    """A keeper's last rows of a run, the tail of its series: a ``Lazy`` item made for a row
    only when the series reads it (when the next run pushes it into the middle, or the read
    ends); the tails of a dense 1 GiB log are 123k rows, read about one in ten.  Holds its
    own rows' fields alone, whatever the run."""

    __slots__ = ("build", "built", "columns", "rows")

    def __init__(
        self,
        build: Callable[[object], object],
        columns: list[list[Any]],
        built: dict[int, MemorySample],
    ) -> None:
        self.build, self.columns, self.built = build, columns, built
        self.rows: list[tuple[Any, ...]] | None = None
        """The rows' fields as tuples, made at the first read (at most 32 rows; a series
        pushed on by short runs reads most of them, one by one)."""

    def __len__(self) -> int:
        return len(self.columns[0])

    @overload
    def __getitem__(self, j: int) -> MemorySample: ...
    @overload
    def __getitem__(self, j: slice) -> Sequence[MemorySample]: ...
    def __getitem__(self, j: int | slice) -> MemorySample | Sequence[MemorySample]:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        found = self.built.get(j)
        if found is not None:
            return found
        if self.rows is None:
            self.rows = list(zip(*self.columns, strict=True))
        return cast(MemorySample, Lazy(self.build, self.rows[j]))


class _Builder:
    """Builds a ``MemorySample`` from one row's fields, with what the reader knew when the run
    was applied (its last step and time before the run: the row is built after later runs
    have moved them on)."""

    __slots__ = ("last_step", "last_time", "path")

    def __init__(self, path: str, last_step: int | None, last_time: datetime | None) -> None:
        self.path, self.last_step, self.last_time = path, last_step, last_time

    def build(self, row: object) -> object:
        """A ``Lazy`` item's build: ``row`` is ``_SampleRows.items``'s tuple of fields."""
        number, rank, label, a, b, c, d, used, pct, has_cpu, step, micros, host = cast(
            tuple[Any, ...], row
        )
        return MemorySample(
            SourceRef(self.path, number, None if rank < 0 else rank, host),
            label,
            a,
            b,
            c,
            d,
            used if has_cpu else None,
            pct if has_cpu else None,
            self.last_step if step < 0 else step,
            self.last_time if micros == bulk_keys.NO_TS else when_of(micros),
        )


def _labels(
    keepers: list[MemoryKeeper | None],
    keeper_of: np.ndarray,
    labels: np.ndarray,
    values: np.ndarray,
    texts: list[str],
) -> None:
    """Per-label statistics: a keeper follows at most ``MAX_LABELS`` labels, the first it
    meets."""
    labelled = np.flatnonzero((keeper_of >= 0) & (labels >= 0))
    if not len(labelled):
        return
    width = int(labels.max()) + 1
    pair = keeper_of[labelled] * width + labels[labelled]
    # A keeper that follows MAX_LABELS labels takes no new one: only its own labels matter,
    # each looked up among the run's label texts (a log whose labels name the step has a new
    # text every step: looking each of those up in every keeper's labels cost a tenth of the
    # apply on a dense 64-rank log).
    full = np.asarray([k is not None and len(k.labels) >= MAX_LABELS for k in keepers])
    if full.any():
        ids_of_text: dict[str, list[int]] = {}
        present = labels[labelled]
        for i in present[first_seen(present)[0]].tolist():
            ids_of_text.setdefault(texts[i], []).append(i)
        known = np.zeros((len(keepers), width), dtype=bool)
        # keepers that met the same first labels (most ranks print the same) are looked up once
        found_for: dict[frozenset[str], list[int]] = {}
        for k in np.flatnonzero(full).tolist():
            own = frozenset(keepers[k].labels)  # type: ignore[union-attr]
            found = found_for.get(own)
            if found is None:
                found = found_for[own] = [i for text in own for i in ids_of_text.get(text, ())]
            known[k, found] = True
        wanted = ~full[keeper_of[labelled]] | known[keeper_of[labelled], labels[labelled]]
        labelled, pair = labelled[wanted], pair[wanted]
    firsts, group = first_seen(pair)
    stats_of: list[tuple[RunningStats, RunningStats] | None] = []
    for combined in pair[firsts].tolist():
        keeper = keepers[combined // width]
        assert keeper is not None
        label = texts[combined % width]
        stats = keeper.labels.get(label)
        if stats is None and len(keeper.labels) < MAX_LABELS:
            stats = keeper.labels[label] = (RunningStats(), RunningStats())
        stats_of.append(stats)
    accepted = np.asarray([stats is not None for stats in stats_of], dtype=bool)
    if not accepted.any():
        return
    take = accepted[group]
    rows, groups = labelled[take], group[take]
    allocated, reserved = grouped_columns(groups, [values[rows, 0], values[rows, 2]])
    for g, stats in enumerate(stats_of):
        if stats is not None:
            stats[0].merge(*allocated[g])
            stats[1].merge(*reserved[g])


# --- cache flushes and steps ------------------------------------------------------------------


def _flushes(run: Run) -> None:
    reader, scan, lo = run.reader, run.scan, run.lo
    at = np.flatnonzero(run.handled & (run.kind == bulk.FLUSH_LINE))
    if not len(at):
        return
    counts = scan.a[lo + at]

    def make(positions: list[int]) -> list[CacheFlushWarning]:
        return [
            CacheFlushWarning(
                run.ref(int(at[p])), int(counts[p]), run.step(int(at[p])), run.when(int(at[p]))
            )
            for p in positions
        ]

    reader.flushes.extend(len(at), make)
    reader.flush_total += int(counts.sum())
    reader.flush_max = max(reader.flush_max, int(counts.max()))
    first, last = make([0, len(at) - 1])
    if reader.flush_first is None:
        reader.flush_first = first
    reader.flush_last = last


def _steps(run: Run) -> None:
    """``LogReader.add_step`` for each progress line of the run, in order."""
    reader, scan, lo = run.reader, run.scan, run.lo
    at = np.flatnonzero(run.samples)
    if not len(at):
        return
    j = lo + at
    flags, step, rank = scan.d[j], scan.a[j], run.rank[at]

    def sample(p: int) -> StepSample:
        i, k, flag = int(at[p]), int(j[p]), int(flags[p])
        form = bulk.FORMS[flag & bulk.FORM_MASK]
        skipped = form == "deepspeed"
        total = -1 if skipped else int(scan.b[k])
        memory, peak = int(scan.e[k]), int(scan.h[k])
        return StepSample(
            run.ref(i, int(rank[p])),
            form,
            int(step[p]) if flag & bulk.HAS_STEP else None,
            total if total >= 0 else None,
            float(scan.f[k]) if flag & bulk.HAS_LOSS else None,
            float(scan.g[k]) if flag & bulk.HAS_EPOCH else None,
            memory if memory >= 0 else None,
            peak if peak >= 0 else None,
            int(scan.b[k]) if skipped else None,
            run.when(i),
        )

    reader.step_samples.extend(len(at), lambda positions: [sample(p) for p in positions])
    stepped = (flags & bulk.HAS_STEP) != 0
    if stepped.any():
        reader.last_step = int(step[stepped][-1])
        top = int(step[stepped].max())
        reader.max_step = top if reader.max_step is None else max(reader.max_step, top)
    losses = scan.f[j[(flags & bulk.HAS_LOSS) != 0]]
    reader.loss.extend(losses[~np.isnan(losses)])
    reader.last_step_sample = sample(len(at) - 1)
    # the last line of each rank (the first of the reversed order), and of each rank's lines
    # other than progress bars (``progress_line``)
    bars = (flags & bulk.FORM_MASK) == bulk.FORMS.index("tqdm")
    for every, kept in ((True, np.ones(len(at), dtype=bool)), (False, ~bars)):
        positions = np.flatnonzero(kept)
        if not len(positions):
            continue
        reverse = rank[positions][::-1]
        first_reversed = first_seen(reverse)[0]
        last_of = dict(
            zip(
                reverse[first_reversed].tolist(),
                positions[len(positions) - 1 - first_reversed].tolist(),
                strict=True,
            )
        )
        for r in _first_occurrences(rank[positions]):
            key = None if r < 0 else r
            if key in reader.last_by_rank or len(reader.last_by_rank) < MAX_STREAMS:
                if every:
                    reader.last_by_rank[key] = sample(last_of[r])
                else:
                    reader.progress_line[key] = int(run.numbers[at[last_of[r]]])


__all__ = ["apply_run", "grouped_sums", "stream_key", "when_of"]
