"""Consistent snapshots for the tests, made by recording workloads through the allocator model
(``bench/whatif_bench.py``'s :class:`RecordingMemory`): every segment, address and OOM in them
is what the caching allocator would have done, so a rewind or replay has exact ground truth."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oomlens.analysis.whatif.alloc_conf import parse_alloc_conf
from oomlens.analysis.whatif.allocator_model import Limit
from oomlens.facts.snapshot import Snapshot
from oomlens.ingest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
MiB = 1024**2


def _bench() -> Any:
    name = "whatif_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "whatif_bench.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


bench = _bench()
RecordingMemory = bench.RecordingMemory
OutOfMemory = bench.OutOfMemory


def record(
    workload: Callable[[Any], None],
    conf: str = "",
    *,
    allowed: int | None = None,
    capacity: int | None = None,
    max_entries: int | None = None,
) -> tuple[Any, str | None]:
    """Run ``workload`` on a recording model; returns the recorder and the step it ran out at."""
    memory = RecordingMemory(
        parse_alloc_conf(conf), Limit(allowed=allowed, capacity=capacity), max_entries=max_entries
    )
    try:
        workload(memory)
    except OutOfMemory as err:
        return memory, str(err)
    return memory, None


def write(memory: Any, path: Path) -> Snapshot:
    """Dump the recorder's snapshot to ``path`` and load it back through oomlens' loader."""
    path.write_bytes(pickle.dumps(memory.snapshot(), protocol=4))
    return load_snapshot(path)


def rounds(count: int, keep: int = 40, big: int = 64, final: int = 120) -> Callable[[Any], None]:
    """Each round frees a ``big`` MiB buffer and keeps ``keep`` MiB carved from it; then a
    ``final`` MiB request (the fragmentation that expandable segments cure)."""

    def workload(memory: Any) -> None:
        kept = []
        for index in range(count):
            memory.step(f"round{index}")
            buffer = memory.alloc(big * MiB)
            memory.free(buffer)
            kept.append(memory.alloc(keep * MiB))
        memory.step("final")
        kept.append(memory.alloc(final * MiB))

    return workload


def small_tensors(count: int = 1200, final: int = 400) -> Callable[[Any], None]:
    """600 KiB tensors, one in three kept, then a ``final`` MiB request (small-pool
    fragmentation that no setting cures)."""

    def workload(memory: Any) -> None:
        memory.step("fill")
        batch = [memory.alloc(600 * 1024) for _ in range(count)]
        memory.step("thin")
        for index, handle in enumerate(batch):
            if index % 3:
                memory.free(handle)
        memory.step("final")
        memory.alloc(final * MiB)

    return workload
