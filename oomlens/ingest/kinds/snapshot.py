"""Allocator snapshots: ``torch.cuda.memory._snapshot()`` pickles (or gzips of one), loaded by
the restricted unpickler (``oomlens.ingest.snapshot``): a pickle from a stranger never runs
code."""

from __future__ import annotations

import os
from typing import ClassVar

from oomlens.facts.snapshot import HistoryMode
from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample
from oomlens.ingest.snapshot.unpickler import looks_like_snapshot_pickle
from oomlens.ingest.textstream import Compression


class SnapshotKind(InputKind):
    id: ClassVar[str] = "snapshot_pickle"
    label: ClassVar[str] = "an allocator snapshot"
    slot: ClassVar[str] = "snapshots"
    precedence: ClassVar[int] = 10
    order: ClassVar[int] = 40
    reader: ClassVar[str] = "oomlens.ingest.snapshot"
    names: ClassVar[tuple[str, ...]] = (
        "*.pickle",
        "*snapshot*.pkl",
        "*.pickle.gz",
        "*snapshot*.pkl.gz",
    )
    from_workdir: ClassVar[bool] = True
    binary: ClassVar[bool] = True

    def recognise(self, sample: Sample) -> str | None:
        if not looks_like_snapshot_pickle(sample.head):
            return None
        what = f"pickle protocol {sample.head[1]}" if sample.head[:1] == b"\x80" else "pickle"
        if sample.compression is Compression.NONE:
            return what
        return f"{sample.compression}-compressed {what}"

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.snapshot import load_snapshot

        size = os.path.getsize(found.path)
        if options.max_snapshot_bytes is not None and size > options.max_snapshot_bytes:
            # Not a failure of the file: the caller's time box; the report says how to proceed.
            return Reading(
                (),
                f"{size} bytes",
                problem=f"{found.path}: snapshot of {size} bytes skipped (limit "
                f"{options.max_snapshot_bytes}); analyze it with oomlens analyze directly",
            )
        snapshot = load_snapshot(
            found.path,
            limits=options.snapshot_limits,
            rank=found.location.rank,
            freeze_gc=False,
        )
        detail = (
            f"{snapshot.layout.value} layout, {_HISTORY[snapshot.history]}, "
            f"{snapshot.segment_count} segments, {snapshot.trace_entry_count} trace entries"
        )
        return Reading((snapshot,), detail, rank=snapshot.source.rank)


_HISTORY = {
    HistoryMode.ALLOC_HISTORY: "allocation history",
    HistoryMode.STATE_ONLY: "live blocks only (no allocation history)",
    HistoryMode.NONE: "no allocation history",
}

KIND = SnapshotKind()
