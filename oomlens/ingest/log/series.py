"""Bounded keepers for long series: thinned samples and running statistics.

Both take items one at a time (``add``) or many at once (``extend``), with the same result
either way and whatever the batches: the log reader's per-line path adds, its bulk path
(``bulk_apply``) extends, and a log read in pieces gives the facts of one pass.  That is why
``RunningStats`` sums exactly (integers, not Welford's floating-point recurrence, whose result
depends on the order and the grouping of the additions): the mean and the slope are the exact
values rounded once.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

import numpy as np

from oomlens.facts.log import SeriesStats
from oomlens.ingest.log import native

T = TypeVar("T")


class Lazy:
    """An item of a ``Thinned`` built only if it is still kept when the series is read out
    (``items``): ``build(row)``.  The bulk path hands the series its items this way: most of
    them leave it again, unkept, when later items come (the tail's when the next run comes,
    the middle's when its stride doubles).  ``row`` is all a ``Lazy`` keeps alive: one item's
    fields, so that a series of them stays as bounded as one of built items."""

    __slots__ = ("build", "row")

    def __init__(self, build: Callable[[object], object], row: object) -> None:
        self.build = build
        self.row = row


def _real(item: T) -> T:
    if isinstance(item, Lazy):
        return cast(T, item.build(item.row))
    return item


def _real_pairs(pairs: list[tuple[int, T]]) -> list[tuple[int, T]]:
    return [(i, _real(v)) for i, v in pairs]


class Thinned(Generic[T]):
    """Keeps the first ``head`` and last ``tail`` items and at most ``middle`` items between,
    evenly thinned (every 2**k-th item, k growing as items arrive).  Memory is bounded by
    ``head + middle + tail`` whatever the number of items added.

    Which items are kept depends only on their indices and the count: the middle always holds
    the items of index ``i`` with ``head <= i < count - tail`` and ``i % stride == 0``, for the
    smallest power-of-two stride that leaves at most ``middle`` of them."""

    __slots__ = (
        "_head",
        "_head_max",
        "_middle",
        "_middle_max",
        "_stride",
        "_tail",
        "_tail_run",
        "count",
    )

    def __init__(self, head: int = 32, middle: int = 192, tail: int = 32) -> None:
        self._head: list[T] = []
        self._head_max = head
        self._middle: list[tuple[int, T]] = []
        self._middle_max = max(middle, 2)
        self._stride = 1
        self._tail: deque[tuple[int, T]] = deque(maxlen=max(tail, 1))
        self._tail_run: tuple[int, Sequence[T]] | None = None
        """The tail as ``place`` was handed it, when it is one run of items (the first's index,
        the items) rather than ``_tail``'s pairs: its items are made only when asked for
        (most are pushed out again, unasked, by the next run)."""
        self.count = 0

    def _tail_pairs(self) -> deque[tuple[int, T]]:
        """The tail as pairs of index and item (made from ``_tail_run`` if need be)."""
        if self._tail_run is not None:
            first, run = self._tail_run
            self._tail = deque(
                ((first + j, run[j]) for j in range(len(run))), maxlen=self._tail.maxlen
            )
            self._tail_run = None
        return self._tail

    def add(self, item: T) -> None:
        index = self.count
        self.count += 1
        if index < self._head_max:
            self._head.append(item)
            return
        self._tail_pairs()
        if len(self._tail) == self._tail.maxlen:
            old_index, old = self._tail[0]
            if old_index % self._stride == 0:
                self._middle.append((old_index, old))
                if len(self._middle) > self._middle_max:
                    self._stride *= 2
                    self._middle = [(i, v) for i, v in self._middle if i % self._stride == 0]
        self._tail.append((index, item))

    def _multiples(self, end: int, stride: int) -> int:
        """How many indices in ``[head, end)`` are multiples of ``stride``."""
        start = self._head_max
        if end <= start:
            return 0
        return (end - 1) // stride - (start - 1) // stride

    def wanted(self, n: int) -> tuple[list[int], int]:
        """The positions (0-based, among ``n`` items about to be added) that ``extend`` would
        keep, and the stride it would leave."""
        head, tail_max = self._head_max, self._tail.maxlen or 1
        old, new = self.count, self.count + n
        evicted_end = max(head, new - tail_max)
        stride = self._stride
        while self._multiples(evicted_end, stride) > self._middle_max:
            stride *= 2
        positions = list(range(0, max(0, min(head, new) - old)))
        start = max(old, head)
        first_multiple = -(-start // stride) * stride
        positions.extend(i - old for i in range(first_multiple, evicted_end, stride))
        positions.extend(range(max(start, evicted_end) - old, n))
        return positions, stride

    def extend(
        self,
        n: int,
        make: Callable[[list[int]], Sequence[T]],
        lazy: Callable[[list[int]], Sequence[Lazy]] | None = None,
    ) -> None:
        """Add ``n`` items at once, as ``n`` calls of ``add`` would; ``make(positions)`` builds
        only the items that are kept (positions 0-based among the ``n``, ascending), so that
        adding a million items costs what the few hundred kept ones cost.  With ``lazy``, the
        items that end in the tail come from it (a sequence of ``Lazy`` ones, each read only
        if it is kept past the tail), built if they are still kept when the series is read
        out."""
        if n <= 0:
            return
        positions, stride = self.wanted(n)
        if lazy is None:
            self.place(n, positions, stride, list(make(positions)))
            return
        split = self.tail_split(n, positions)
        tail = cast(Sequence[T], lazy(positions[split:]))
        self.place(n, positions, stride, list(make(positions[:split])), tail)

    def tail_split(self, n: int, positions: list[int]) -> int:
        """How many of ``wanted(n)``'s positions are kept for good (the rest end in the tail,
        where the next items may push them out)."""
        evicted_end = max(self._head_max, self.count + n - (self._tail.maxlen or 1))
        return bisect.bisect_left(positions, evicted_end - self.count)

    def place(
        self,
        n: int,
        positions: list[int],
        stride: int,
        items: Sequence[T],
        tail: Sequence[T] | None = None,
    ) -> None:
        """``extend``'s second half: ``items`` for the ``positions`` and ``stride`` of
        ``wanted(n)`` (for callers that build the items of many series at once).  With
        ``tail``, ``items`` are those of the positions kept for good (``tail_split``) and
        ``tail`` those of the rest, in order: a sequence whose items are read only if they are
        kept past the tail (they are held as the sequence while it is the whole tail)."""
        head, tail_max = self._head_max, self._tail.maxlen or 1
        old, new = self.count, self.count + n
        evicted_end = max(head, new - tail_max)
        # positions ascend: the head's, the middle's and the tail's are three slices
        to_middle = bisect.bisect_left(positions, head - old)
        to_tail = bisect.bisect_left(positions, evicted_end - old, lo=to_middle)
        if len(items) + (0 if tail is None else len(tail)) != len(positions):
            raise ValueError("place: one item per position")
        if tail is not None and to_tail != len(items):
            raise ValueError("place: the tail's items start where the tail does")
        middle = (
            self._middle
            if stride == self._stride
            else [(i, v) for i, v in self._middle if i % stride == 0]
        )
        # the tail holds consecutive indices: the evicted ones are its first ``cut``, and
        # those of them the middle keeps every ``stride``-th from the first multiple
        run = self._tail_run
        if run is not None:
            first, held = run
            size = len(held)
        else:
            first = self._tail[0][0] if self._tail else 0
            size = len(self._tail)
        cut = min(size, max(0, evicted_end - first))
        kept_from = -(-first // stride) * stride - first
        if run is not None:
            middle.extend((first + j, held[j]) for j in range(kept_from, cut, stride))
            remaining = [(first + j, held[j]) for j in range(cut, size)]
        else:
            old_tail = list(self._tail)
            middle.extend(old_tail[kept_from:cut:stride])
            remaining = old_tail[cut:]
        self._head.extend(items[:to_middle])
        middle_indices = [old + p for p in positions[to_middle:to_tail]]
        middle.extend(zip(middle_indices, items[to_middle:to_tail], strict=True))
        self._middle = middle
        self._stride = stride
        self.count = new
        new_tail = positions[to_tail:]
        if tail is None:
            tail = items[to_tail:]
        if not remaining and new_tail:  # the new items are the whole tail: held as they are
            self._tail = deque(maxlen=tail_max)
            self._tail_run = (old + new_tail[0], tail)
            return
        remaining.extend(zip([old + p for p in new_tail], tail, strict=True))
        self._tail = deque(remaining, maxlen=tail_max)
        self._tail_run = None

    def items(self) -> tuple[T, ...]:
        """The kept items in order, ``Lazy`` ones built (once: they stay built)."""
        self._head = [_real(v) for v in self._head]
        self._middle = _real_pairs(self._middle)
        tail = _real_pairs(list(self._tail_pairs()))
        self._tail = deque(tail, maxlen=self._tail.maxlen)
        return tuple(self._head) + tuple(v for _, v in self._middle) + tuple(v for _, v in tail)


_SCALE = 1130
"""Sums are kept as integers in units of 2**-_SCALE: every finite float64 is a whole number of
them (the smallest subnormal is 2**-1074; the margin keeps the shifts below non-negative)."""
_CHUNK = 1 << 20
"""Items summed in one go: 18-bit limbs times 20-bit index pieces, 2**20 of them, stay below
2**63."""


def _scaled(value: float) -> int:
    """``value * 2**_SCALE``, exactly (``value`` finite)."""
    numerator, denominator = value.as_integer_ratio()
    return numerator << (_SCALE - denominator.bit_length() + 1)


def small_ints(values: np.ndarray) -> np.ndarray:
    """Integer ``values`` as int16 where they all fit, else as they are: numpy sorts 16-bit
    integers stably by radix (200k keys of 64 ranks: 2.4 ms against 13 ms as int64), and a
    stable order or ``unique`` does not depend on the dtype."""
    if len(values) and values.dtype.kind in "iu":
        if -(1 << 15) <= int(values.min()) and int(values.max()) < (1 << 15):
            return values.astype(np.int16)
    return values


def first_seen(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For integer ``values``: where each distinct value first occurs, in the order they first
    occur, and each value's group (the index of its value's first occurrence among those).
    By the extension in one hashed pass where it is built (the bulk apply groups each run's
    lines by stream, rank and label: numpy's ``unique`` sorts each time).  The bulk path, its
    only user, runs only with the extension (``bulk.AVAILABLE``)."""
    assert native._scan is not None
    firsts, groups = native._scan.first_seen(np.ascontiguousarray(values, dtype=np.int64))
    return np.frombuffer(firsts, dtype=np.int64), np.frombuffer(groups, dtype=np.int64)


def grouped_sums(
    groups: np.ndarray, values: np.ndarray, index: np.ndarray
) -> dict[int, tuple[int, int]]:
    """For each group id, ``(sum of value, sum of index * value)`` in units of 2**-_SCALE,
    exactly, for finite float64 ``values``; ``index`` (int64, from 0 up to below 2**40) is
    each value's position in its series.

    How: each value is ``M * 2**(e - 53)`` with an integer ``M`` of 53 bits (``frexp``); the
    extension sums ``M`` and ``index * M`` per group and ``e`` in 128-bit integers, one pass;
    Python integers put the sums together (one per group and exponent, a handful).  The bulk
    path, its only user, runs only with the extension (``bulk.AVAILABLE``)."""
    result: dict[int, tuple[int, int]] = {}
    assert native._scan is not None
    for begin in range(0, len(values), _CHUNK):
        end = begin + _CHUNK
        for group, e, total, weighted in native._scan.grouped_sums(
            np.ascontiguousarray(groups[begin:end], dtype=np.int64),
            np.ascontiguousarray(values[begin:end], dtype=np.float64),
            np.ascontiguousarray(index[begin:end], dtype=np.int64),
        ):
            shift = e - 53 + _SCALE
            before = result.get(group, (0, 0))
            result[group] = (before[0] + (total << shift), before[1] + (weighted << shift))
    return result


GroupStats = tuple[int, float, float, float, float, int, int]
"""count, first, last, minimum, maximum, sum, index-weighted sum (see ``RunningStats.merge``)."""


def grouped_stats(groups: np.ndarray, values: np.ndarray) -> dict[int, GroupStats]:
    """For each group id, what ``RunningStats.merge`` takes for its values in order (finite
    float64 values; the index of a value is its position among its group's)."""
    return grouped_columns(groups, [values])[0]


def grouped_columns(
    groups: np.ndarray, columns: list[np.ndarray], order: np.ndarray | None = None
) -> list[dict[int, GroupStats]]:
    """``grouped_stats`` of each of several value columns over the same groups (grouped once).
    ``order``: the rows to take, ordered by group stably (a caller that sorted them already);
    all rows, sorted here, by default."""
    if order is None:
        order = np.argsort(small_ints(groups), kind="stable")
    if len(order) == 0:
        return [{} for _ in columns]
    g = groups[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    ends = np.append(starts[1:], len(g))
    sizes = ends - starts
    index = np.arange(len(g)) - np.repeat(starts, sizes)
    ids = g[starts].tolist()
    counts = sizes.tolist()
    result: list[dict[int, GroupStats]] = []
    for values in columns:
        v = values[order]
        sums = grouped_sums(g, v, index)
        firsts = v[starts].tolist()
        lasts = v[ends - 1].tolist()
        lows = np.minimum.reduceat(v, starts).tolist()
        highs = np.maximum.reduceat(v, starts).tolist()
        out: dict[int, GroupStats] = {}
        for k, group in enumerate(ids):
            total, weighted = sums[group]
            out[group] = (counts[k], firsts[k], lasts[k], lows[k], highs[k], total, weighted)
        result.append(out)
    return result


class RunningStats:
    """Count, first, last, min, max, mean and the least-squares slope of value against sample
    index (0, 1, 2...), in O(1) memory.  The sums behind the mean and the slope are exact
    (integers in units of 2**-1130), so the figures are the exact ones rounded once, and the
    same whether the values came one by one, in batches, or in pieces read apart.

    Values are finite or infinite; a NaN is the caller's to drop.  An infinite value makes the
    mean infinite (NaN if both signs came) and the slope NaN."""

    __slots__ = ("_inf", "_sum", "_weighted", "count", "first", "last", "maximum", "minimum")

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.minimum = 0.0
        self.maximum = 0.0
        self._sum = 0
        self._weighted = 0
        self._inf = (0, 0)

    def add(self, value: float) -> None:
        value = float(value)
        n = self.count
        self.count = n + 1
        if n == 0:
            self.first = self.minimum = self.maximum = value
        elif value < self.minimum:
            self.minimum = value
        elif value > self.maximum:
            self.maximum = value
        self.last = value
        if math.isinf(value):
            self._inf = (self._inf[0] + (value > 0), self._inf[1] + (value < 0))
            return
        scaled = _scaled(value)
        self._sum += scaled
        self._weighted += n * scaled

    def extend(self, values: np.ndarray) -> None:
        """Add float64 ``values`` in order, as ``add`` would one by one."""
        if len(values) == 0:
            return
        values = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(values)
        if not finite.all():
            for value in values.tolist():
                self.add(value)
            return
        sums = grouped_sums(
            np.zeros(len(values), dtype=np.int64), values, np.arange(len(values), dtype=np.int64)
        )
        self.merge(len(values), values[0], values[-1], values.min(), values.max(), *sums[0])

    def merge(
        self, n: int, first: float, last: float, low: float, high: float, total: int, weighted: int
    ) -> None:
        """Take ``n`` finite values summarised by ``grouped_sums`` (``weighted`` with indices
        counted from 0 within them) as if added one by one after the values already here."""
        if n <= 0:
            return
        if self.count == 0:
            self.first, self.minimum, self.maximum = float(first), float(low), float(high)
        else:
            self.minimum = min(self.minimum, float(low))
            self.maximum = max(self.maximum, float(high))
        self.last = float(last)
        self._weighted += weighted + self.count * total
        self._sum += total
        self.count += n

    def freeze(self) -> SeriesStats:
        n = self.count
        positive, negative = self._inf
        slope: float | None
        if positive or negative:
            mean = math.nan if positive and negative else math.inf if positive else -math.inf
            slope = math.nan if n >= 2 else None
        else:
            mean = self._sum / (n << _SCALE) if n else 0.0
            # sum((x - mean x) * y) = S1 - (n - 1) / 2 * S0, and sum((x - mean x)^2) =
            # n (n^2 - 1) / 12 for x = 0..n-1: one exact fraction, rounded once.
            slope = (
                (12 * self._weighted - 6 * (n - 1) * self._sum) / ((n * (n * n - 1)) << _SCALE)
                if n >= 2
                else None
            )
        return SeriesStats(n, self.first, self.last, self.minimum, self.maximum, mean, slope)
