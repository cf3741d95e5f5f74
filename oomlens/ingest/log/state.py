"""The state one pass of the log reader keeps, bounded: per-stream open blocks, per-rank memory
series, capped lists of facts, and the anchor scanner."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Generic, TypeVar

import numpy as np

from oomlens.facts import SourceRef
from oomlens.facts.log import LabelStats, MemorySample, MemorySeries
from oomlens.ingest.log import deepspeed, torchrun
from oomlens.ingest.log.series import RunningStats, Thinned
from oomlens.ingest.log.traceback import TracebackAssembler

T = TypeVar("T")
MAX_LABELS = 64
"""Distinct ``see_memory_usage`` labels followed per rank."""


@dataclass(frozen=True, slots=True)
class ReaderLimits:
    """Bounds on what one log can make the reader keep."""

    max_oom_events: int = 1000
    max_exceptions: int = 500
    max_events: int = 2000
    """Per other list (failures, kernel lines, launcher lines...)."""
    series_head: int = 32
    series_middle: int = 192
    series_tail: int = 32


class AnchorScanner:
    """Start offsets of anchor matches in a block: Aho-Corasick when available."""

    def __init__(self, anchors: tuple[bytes, ...], bits: tuple[int, ...]) -> None:
        self._bits = bits
        self._bit_array = np.asarray(bits, dtype=np.int64)
        self._automaton = None
        try:
            import ahocorasick_rs

            self._automaton = ahocorasick_rs.BytesAhoCorasick(
                list(anchors), matchkind=ahocorasick_rs.MatchKind.LeftmostFirst
            )
        except ImportError:  # pragma: no cover - exercised where the extra is missing
            self._pattern = re.compile(b"|".join(b"(" + re.escape(a) + b")" for a in anchors))

    @property
    def accelerated(self) -> bool:
        return self._automaton is not None

    def arrays(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """``hits`` as two int64 arrays (offsets, bits), made without a tuple per hit where
        Aho-Corasick runs."""
        if self._automaton is not None:
            found = self._automaton.find_matches_as_indexes(data)
            flat = np.fromiter(chain.from_iterable(found), dtype=np.int64, count=3 * len(found))
            flat = flat.reshape(-1, 3)
            return flat[:, 1], self._bit_array[flat[:, 0]]
        hits = self.hits(data)
        return (
            np.asarray([h[0] for h in hits], dtype=np.int64),
            np.asarray([h[1] for h in hits], dtype=np.int64),
        )

    def hits(self, data: bytes) -> list[tuple[int, int]]:
        """``(offset, category bits)`` of every anchor found, in order."""
        if self._automaton is not None:
            return [
                (start, self._bits[index])
                for index, start, _ in self._automaton.find_matches_as_indexes(data)
            ]
        return [
            (m.start(), self._bits[(m.lastindex or 1) - 1]) for m in self._pattern.finditer(data)
        ]


class StreamState:
    """What one stream (a rank, a host, a launcher role) has open: a traceback, a failure
    block, a config dump, a memory block waiting for its CPU line."""

    __slots__ = (
        "config_dump",
        "config_lines",
        "config_ref",
        "failure_block",
        "pending_memory",
        "tb",
    )

    def __init__(self) -> None:
        self.tb = TracebackAssembler()
        self.failure_block: torchrun.FailureBlockParser | None = None
        self.config_dump: deepspeed.ConfigDumpCollector | None = None
        self.config_lines: list[tuple[SourceRef, str]] = []
        self.config_ref: SourceRef | None = None
        self.pending_memory: (
            tuple[SourceRef, str | None, deepspeed.MemoryReading, datetime | None, int | None]
            | None
        ) = None

    @property
    def open(self) -> bool:
        return self.tb.open or self.failure_block is not None or self.config_dump is not None


class MemoryKeeper:
    """One rank's ``see_memory_usage`` series: thinned samples and running statistics."""

    __slots__ = (
        "allocated",
        "cpu",
        "host",
        "labels",
        "max_allocated",
        "rank",
        "reserved",
        "samples",
    )

    def __init__(self, rank: int | None, host: str | None, limits: ReaderLimits) -> None:
        self.rank = rank
        self.host = host
        self.samples: Thinned[MemorySample] = Thinned(
            limits.series_head, limits.series_middle, limits.series_tail
        )
        self.allocated = RunningStats()
        self.reserved = RunningStats()
        self.max_allocated = RunningStats()
        self.cpu = RunningStats()
        self.labels: dict[str, tuple[RunningStats, RunningStats]] = {}

    def add(self, sample: MemorySample) -> None:
        self.samples.add(sample)
        self.allocated.add(sample.allocated)
        self.reserved.add(sample.reserved)
        self.max_allocated.add(sample.max_allocated)
        if sample.cpu_used is not None:
            self.cpu.add(sample.cpu_used)
        if sample.label is not None:
            stats = self.labels.get(sample.label)
            if stats is None and len(self.labels) < MAX_LABELS:
                stats = self.labels[sample.label] = (RunningStats(), RunningStats())
            if stats is not None:
                stats[0].add(sample.allocated)
                stats[1].add(sample.reserved)

    def freeze(self) -> MemorySeries:
        return MemorySeries(
            rank=self.rank,
            host=self.host,
            samples=self.samples.items(),
            total_samples=self.samples.count,
            allocated=self.allocated.freeze(),
            reserved=self.reserved.freeze(),
            max_allocated=self.max_allocated.freeze(),
            cpu_used=self.cpu.freeze() if self.cpu.count else None,
            by_label=tuple(
                LabelStats(label, a.freeze(), r.freeze()) for label, (a, r) in self.labels.items()
            ),
        )


class BoundedList(Generic[T]):
    """A list that keeps ``limit`` items, the first ones and the latest ones (half each),
    and counts the rest under ``name``: a run's crash comes last, after however many of its
    kind the run printed before (a healthy run's caught OOMs, retried)."""

    __slots__ = ("dropped", "items", "limit", "name")

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.items: list[T] = []
        self.dropped = 0

    def add(self, item: T) -> None:
        if len(self.items) < self.limit:
            self.items.append(item)
            return
        self.dropped += 1
        if self.limit >= 2:  # the oldest of the latest half makes room
            del self.items[self.limit - self.limit // 2]
            self.items.append(item)
