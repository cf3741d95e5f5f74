"""Bounded keepers for long series: thinned samples and running statistics."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from oomlens.facts.log import SeriesStats

T = TypeVar("T")


class Thinned(Generic[T]):
    """Keeps the first ``head`` and last ``tail`` items and at most ``middle`` items between,
    evenly thinned (every 2**k-th item, k growing as items arrive).  Memory is bounded by
    ``head + middle + tail`` whatever the number of items added."""

    __slots__ = ("_head", "_head_max", "_middle", "_middle_max", "_stride", "_tail", "count")

    def __init__(self, head: int = 32, middle: int = 192, tail: int = 32) -> None:
        self._head: list[T] = []
        self._head_max = head
        self._middle: list[tuple[int, T]] = []
        self._middle_max = max(middle, 2)
        self._stride = 1
        self._tail: deque[tuple[int, T]] = deque(maxlen=max(tail, 1))
        self.count = 0

    def add(self, item: T) -> None:
        index = self.count
        self.count += 1
        if index < self._head_max:
            self._head.append(item)
            return
        if len(self._tail) == self._tail.maxlen:
            old_index, old = self._tail[0]
            if old_index % self._stride == 0:
                self._middle.append((old_index, old))
                if len(self._middle) > self._middle_max:
                    self._stride *= 2
                    self._middle = [(i, v) for i, v in self._middle if i % self._stride == 0]
        self._tail.append((index, item))

    def items(self) -> tuple[T, ...]:
        return (
            tuple(self._head) + tuple(v for _, v in self._middle) + tuple(v for _, v in self._tail)
        )


class RunningStats:
    """Count, first, last, min, max, mean and the least-squares slope of value against sample
    index (0, 1, 2...), updated in O(1) per value with Welford-style updates (numerically
    stable for large byte counts)."""

    __slots__ = ("_cxy", "_mean_y", "count", "first", "last", "maximum", "minimum")

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.minimum = 0.0
        self.maximum = 0.0
        self._mean_y = 0.0
        self._cxy = 0.0

    def add(self, value: float) -> None:
        value = float(value)
        n = self.count + 1
        self.count = n
        if n == 1:
            self.first = self.minimum = self.maximum = value
        elif value < self.minimum:
            self.minimum = value
        elif value > self.maximum:
            self.maximum = value
        self.last = value
        # x runs 0, 1, 2...: the x mean before this sample is (n - 2) / 2, so x - mean = n / 2.
        mean_y = self._mean_y + (value - self._mean_y) / n
        self._mean_y = mean_y
        self._cxy += (n / 2) * (value - mean_y)

    def freeze(self) -> SeriesStats:
        n = self.count
        sxx = n * (n * n - 1) / 12  # sum of (x - mean x)^2 for x = 0..n-1
        slope = self._cxy / sxx if n >= 2 else None
        return SeriesStats(
            n, self.first, self.last, self.minimum, self.maximum, self._mean_y, slope
        )
