"""``bench/snapshot_bench_layouts.py``: every layout is what it claims, read back through the
loader as a real recording would be (stack depth, frame sharing, expandable segments, state
only), and analyzes."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.allocator import analyze_snapshot
from oomlens.facts.snapshot import HistoryMode, StackDepth
from oomlens.ingest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
layouts = importlib.import_module("snapshot_bench_layouts")

_DEPTH = {
    "all": StackDepth.PYTHON_AND_NATIVE,
    "python": StackDepth.PYTHON,
    "none": StackDepth.NONE,
}


def _frame_lists(segments: list[Any], traces: list[Any]) -> list[list[Any]]:
    records = [block for segment in segments for block in segment["blocks"]]
    records += [entry for trace in traces for entry in trace]
    return [record["frames"] for record in records if record.get("frames")]


@pytest.mark.parametrize("name", list(layouts.LAYOUTS))
def test_every_layout_reads_back_as_the_recording_it_claims(name: str, tmp_path: Path) -> None:
    layout = layouts.LAYOUTS[name]
    path = tmp_path / "snapshot_rank0.pickle"
    path.write_bytes(pickle.dumps(layouts.generate_layout(512 * 1024, layout), protocol=4))

    snapshot = load_snapshot(path)
    device = analyze_snapshot(snapshot).devices[0]

    assert 256 * 1024 < snapshot.pickle_bytes < 8 * 1024**2
    assert snapshot.stacks is _DEPTH[layout.stacks]
    lists = _frame_lists(snapshot.raw.segments, snapshot.raw.device_traces)
    frames = [frame for frames in lists for frame in frames]
    distinct = len({id(frame) for frame in frames})
    if layout.stacks == "none":
        assert not frames
    elif layout.frames == "per-block":
        assert distinct == len(frames) and len({id(frames) for frames in lists}) == len(lists)
    else:
        assert distinct * 10 < len(frames)
    segments = snapshot.raw.segments
    assert all(s["is_expandable"] for s in segments) == (layout.source == "expandable")
    if layout.history:
        assert snapshot.history is HistoryMode.ALLOC_HISTORY
        assert device.oom is not None and device.timeline is not None
    else:
        assert snapshot.history is HistoryMode.STATE_ONLY and len(segments) > 100
