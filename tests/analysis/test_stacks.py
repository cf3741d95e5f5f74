"""StackResolver: an attribution depends on what the frames say, not on how the pickle shared
their objects."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis import stacks
from oomlens.analysis.allocator import analyze_snapshot
from oomlens.analysis.stacks import StackResolver
from oomlens.ingest.snapshot import load_snapshot

SAMPLES = Path(__file__).resolve().parents[1] / "assets" / "snapshots"


def _unshared(data: dict[str, Any]) -> dict[str, Any]:
    """The same snapshot with every block and trace entry given its own list of its own frame
    dicts (the strings stay shared), as a tool that copies records writes it."""

    def copy_frames(record: dict[str, Any]) -> None:
        if type(record.get("frames")) is list:
            record["frames"] = [dict(frame) for frame in record["frames"]]

    for segment in data["segments"]:
        copy_frames(segment)
        for block in segment["blocks"]:
            copy_frames(block)
    for trace in data["device_traces"]:
        for entry in trace:
            copy_frames(entry)
    return data


@pytest.mark.parametrize(
    "name",
    ["snapshot_t211_stacks_all_oom.pickle", "snapshot_t211_stacks_python_expandable_oom.pickle"],
)
def test_unshared_frames_give_the_same_analysis_and_classify_each_frame_once(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = load_snapshot(SAMPLES / name)
    path = tmp_path / "unshared_rank0.pickle"
    path.write_bytes(pickle.dumps(_unshared(pickle.loads((SAMPLES / name).read_bytes())), 4))
    unshared = load_snapshot(path)
    frames = [
        frame
        for trace in unshared.raw.device_traces
        for entry in trace
        for frame in entry.get("frames") or []
    ]
    distinct = {(f["filename"], f["line"], f["name"]) for f in frames}
    assert len({id(frame) for frame in frames}) == len(frames) > 3 * len(distinct)
    classified: list[object] = []
    original = stacks._classify_frame

    def counting(frame: object) -> Any:
        classified.append(frame)
        return original(frame)

    monkeypatch.setattr(stacks, "_classify_frame", counting)

    expected = analyze_snapshot(shared).devices
    classified.clear()
    found = analyze_snapshot(unshared).devices

    assert found == expected
    contents = [(f["filename"], f["line"], f["name"]) for f in classified]  # type: ignore[index]
    assert len(contents) == len(set(contents))  # each distinct frame classified once


def test_equal_stacks_resolve_alike_and_different_ones_do_not() -> None:
    user = {"filename": "/home/me/train.py", "line": 12, "name": "step"}
    module = {
        "filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py",
        "line": 125,
        "name": "forward",
    }
    resolver = StackResolver()

    first = resolver.resolve([dict(module), dict(user)])
    again = resolver.resolve([dict(module), dict(user)])
    other = resolver.resolve([dict(module), dict(user, line=13)])

    assert first is again
    assert first.site is not None and first.site.line == 12
    assert other.site is not None and other.site.line == 13


def test_crafted_unhashable_frames_still_resolve() -> None:
    resolver = StackResolver()
    crafted = [{"filename": ["x"], "line": {}, "name": None}, [1, 2], {"line": 3}]

    assert resolver.resolve(crafted) == resolver.resolve(list(crafted))


def test_lists_of_unshared_frame_dicts_do_not_each_add_an_identity_key() -> None:
    # One copy of the frame dicts per block: a key per list would grow with the file, and
    # none of them would ever be met again.
    stack = [
        {"filename": "/home/me/model.py", "line": line, "name": "forward"} for line in range(40)
    ]
    resolver = StackResolver()

    found = {resolver.resolve([dict(frame) for frame in stack]) for _ in range(2000)}

    assert len(found) == 1
    assert len(resolver._buckets) <= 1 + stacks._ALIASES_PER_STACK
