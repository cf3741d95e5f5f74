"""Snapshot layouts for ``bench/snapshot_bench.py``, generated from real recordings.

Every layout is made by code from real torch 2.11 snapshots, read through oomlens' restricted
loader: the crash corpus's recordings (``fixtures/crash_logs/*/snapshot_rank*.pickle``,
stacks='python', H200) and the real samples (``tests/assets/snapshots``, the same files as the
shared samples: stacks='all', stacks='python' with expandable segments, enabled='state').  A
layout copies those recordings end to end (1 TiB apart in address space, one after the other in
time) until the pickle reaches the size asked for, keeping their segment/block layout, their
action mix and their sharing; only the axes below change.

Axes (see :data:`LAYOUTS`):

* ``stacks``: ``all`` (every Python stack gets a real native unwind from the stacks='all'
  sample in front of it, as torch's default records it; the sample's own stacks stay as they
  are), ``python`` (native frames dropped, as stacks='python' records), ``none`` (every frame
  list empty, as a recording with ``context=None`` writes it, like ``fixtures/whatif``'s).
* ``frames``: ``shared`` (torch's symbolizer shares one dict per distinct frame across the
  whole recording and one list per captured traceback, which a block and its ``alloc`` entry,
  a ``free_requested`` and its ``free_completed``, share) or ``per-block`` (every block and
  every trace entry carries its own list of its own frame dicts, as a snapshot rebuilt by a
  tool that copies records does; the strings stay shared, so pickle writes only memo
  references for them: the cheapest stream per frame for ``pickle.load``, hence the hardest
  case for a reader measured against it).
* ``source``: ``corpus`` (all recordings above) or ``expandable`` (the expandable-segments
  sample alone: ``is_expandable`` segments, ``segment_map``/``segment_unmap`` actions, its
  allocator settings).
* ``history``: with the trace, or ``state`` (segments and blocks only, as enabled='state'
  records them: the bytes are all in the segments).
"""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "tests" / "assets" / "snapshots"
CORPUS = ROOT / "fixtures" / "crash_logs"
MiB = 1024**2
_ADDRESS_STRIDE = 1 << 40  # 1 TiB between copies: no address of one copy falls in another
_MARKERS = ("oom", "snapshot")
_ALL_SAMPLE = "snapshot_t211_stacks_all_oom.pickle"
_EXPANDABLE_SAMPLE = "snapshot_t211_stacks_python_expandable_oom.pickle"
_STATE_SAMPLE = "snapshot_t211_enabled_state.pickle"


@dataclass(frozen=True)
class Layout:
    """One point on the axes of the module docstring."""

    stacks: str = "all"  # all | python | none
    frames: str = "shared"  # shared | per-block
    source: str = "corpus"  # corpus | expandable
    history: bool = True

    def describe(self) -> str:
        parts = [f"stacks={self.stacks}"]
        if self.stacks != "none":
            parts.append(f"frames {self.frames}")
        if self.source != "corpus":
            parts.append(f"{self.source} segments")
        if not self.history:
            parts.append("state only (many segments)")
        return ", ".join(parts)


LAYOUTS: dict[str, Layout] = {
    "all-shared": Layout("all", "shared"),
    "python-shared": Layout("python", "shared"),
    "none": Layout("none"),
    "all-per-block": Layout("all", "per-block"),
    "python-per-block": Layout("python", "per-block"),
    "state-segments": Layout("all", "shared", history=False),
    "expandable": Layout("python", "shared", source="expandable"),
    "expandable-per-block": Layout("python", "per-block", source="expandable"),
}
"""Every layout the corpus and the shared samples hold, by name."""


def _restricted(path: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from oomlens.ingest.snapshot.unpickler import restricted_load

    data = restricted_load(path).data
    assert isinstance(data, dict)
    return data


Source = tuple[list[Any], list[Any], list[Any]]


def _sources(source: str) -> list[Source]:
    """(segments, trace, annotations) of every real recording with a history, per device."""
    if source == "expandable":
        files = [ASSETS / _EXPANDABLE_SAMPLE]
    else:
        files = sorted(CORPUS.glob("*/snapshot_rank*.pickle")) + sorted(ASSETS.glob("*.pickle"))
    found = []
    for path in files:
        data = _restricted(path)
        for device, trace in enumerate(data["device_traces"]):
            if not any(entry["action"] not in _MARKERS for entry in trace):
                continue  # an enabled='state' snapshot, or the other rank's empty device
            segments = [s for s in data["segments"] if s["device"] == device]
            annotations = [a for a in data.get("external_annotations", []) if a["device"] == device]
            found.append((segments, trace, annotations))
    # Smallest first, so that a small target is not overshot by one large recording.
    found.sort(key=lambda item: len(item[1]) + sum(len(s["blocks"]) for s in item[0]))
    return found


def _is_native(frame: dict[str, Any]) -> bool:
    # stacks='python' records only frames with a Python file and a line; native ones have line 0.
    return not (frame["filename"].endswith(".py") or frame["line"] > 0)


def native_stacks() -> list[list[Any]]:
    """The native part of each distinct stack of the real stacks='all' sample.

    torch writes a stacks='all' frame list as the native unwind (innermost first, down to
    ``_start``, with the innermost Python frame where the interpreter sits) followed by the
    Python frames; this keeps the native part, real frame dicts shared as torch shares them.
    """
    sample = _restricted(ASSETS / _ALL_SAMPLE)
    found: dict[tuple[int, ...], list[Any]] = {}
    for entry in sample["device_traces"][0]:
        frames = entry.get("frames") or []
        native = []
        for frame in frames:
            native.append(frame)
            if frame["name"] == "_start":
                break
        if len(native) < len(frames):
            found.setdefault(tuple(map(id, native)), native)
    return list(found.values())


class _Stacks:
    """The frame list a layout gives each source list: same for every copy (cached)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.natives = native_stacks() if layout.stacks == "all" else []
        self.cache: dict[int, list[Any]] = {}
        self.pinned: list[Any] = []

    def base(self, frames: list[Any]) -> list[Any]:
        found = self.cache.get(id(frames))
        if found is not None:
            return found
        self.pinned.append(frames)
        stacks = self.layout.stacks
        if stacks == "none" or not frames:
            found = []
        elif stacks == "python":
            found = [frame for frame in frames if not _is_native(frame)]
        elif any(_is_native(frame) for frame in frames):
            found = list(frames)  # a real stacks='all' stack
        else:
            found = self.natives[len(self.cache) % len(self.natives)] + frames
        self.cache[id(frames)] = found
        return found


class _Copier:
    """One copy of a real recording's device: new dicts and lists.

    ``frames='shared'``: each source frame list gets one new list per copy (so a list the
    source shared stays shared) holding the shared frame dicts.  ``frames='per-block'``: every
    record gets a list of its own frame dicts.  Addresses move by ``address_shift``, times by
    ``time_shift``.
    """

    def __init__(self, stacks: _Stacks, address_shift: int, time_shift: int) -> None:
        self.stacks = stacks
        self.per_block = stacks.layout.frames == "per-block"
        self.address_shift = address_shift
        self.time_shift = time_shift
        self.lists: dict[int, list[Any]] = {}

    def frames(self, frames: Any) -> Any:
        if type(frames) is not list:
            return frames
        base = self.stacks.base(frames)
        if self.per_block:
            return [dict(frame) for frame in base]
        copied = self.lists.get(id(frames))
        if copied is None:
            copied = self.lists[id(frames)] = list(base)
        return copied

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        copied = {}
        for key, value in record.items():
            if key in ("addr", "address") and type(value) is int and value:
                value += self.address_shift
            elif key == "time_us" and type(value) is int:
                value += self.time_shift
            elif key == "frames":
                value = self.frames(value)
            elif key == "device":
                value = 0
            elif key == "blocks":
                value = [self.record(block) for block in value]
            copied[key] = value
        return copied


def _pickled_size(value: Any) -> int:
    return len(pickle.dumps(value, protocol=4))


def generate_layout(target_bytes: int, layout: Layout) -> dict[str, Any]:
    """A snapshot of ``layout``, about ``target_bytes`` once pickled, made of copies of real
    recordings (see the module docstring).  Only the last copy keeps its ``oom`` entry; a
    state-only layout keeps the real enabled='state' sample's ``snapshot`` marker as its trace.
    """
    sources = _sources(layout.source)
    stacks = _Stacks(layout)
    settings_file = _EXPANDABLE_SAMPLE if layout.source == "expandable" else _ALL_SAMPLE
    settings = _restricted(ASSETS / settings_file)["allocator_settings"]
    segments: list[Any] = []
    trace: list[Any] = []
    annotations: list[Any] = []
    sizes: dict[int, int] = {}
    total = 0
    clock = 0
    copy_index = 0
    oom_source = next(
        i for i, (_, t, _) in enumerate(sources) if any(e["action"] == "oom" for e in t)
    )
    while True:
        source = copy_index % len(sources)
        last = total + sizes.get(source, 0) >= target_bytes
        if last:
            source = oom_source
        src_segments, src_trace, src_annotations = sources[source]
        if not layout.history:
            src_trace, src_annotations = [], []
        times = [e["time_us"] for e in src_trace if type(e.get("time_us")) is int]
        start = min(times) if times else 0
        copier = _Copier(stacks, copy_index * _ADDRESS_STRIDE, clock - start + 1000)
        new_trace = [
            copier.record(entry) for entry in src_trace if last or entry["action"] not in _MARKERS
        ]
        new_segments = [copier.record(segment) for segment in src_segments]
        new_annotations = [copier.record(record) for record in src_annotations]
        if source not in sizes:
            # Marginal pickled size of a copy: what all copies share is paid once, by the first.
            once = _pickled_size([new_segments, new_trace, new_annotations])
            again_copier = _Copier(stacks, 0, 0)
            again = [
                [again_copier.record(item) for item in part]
                for part in (src_segments, src_trace, src_annotations)
            ]
            both = _pickled_size([[new_segments, new_trace, new_annotations], again])
            sizes[source] = both - once
        segments += new_segments
        trace += new_trace
        annotations += new_annotations
        total += sizes[source]
        clock = max(times) - start + clock + 1000 if times else clock
        copy_index += 1
        if last:
            break
    segments.sort(key=lambda segment: segment["address"])
    traces: list[Any] = [trace, []]
    if not layout.history:
        state = _restricted(ASSETS / _STATE_SAMPLE)
        traces = [[dict(marker) for marker in device] for device in state["device_traces"]]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": settings,
        "external_annotations": annotations,
    }


def generate_corpus_snapshot(target_bytes: int, *, stacks: str = "all") -> dict[str, Any]:
    """The corpus layout with shared frames (issue 15's benchmark input): many small blocks,
    deep stacks, long traces (about 3 blocks per 10 trace entries)."""
    return generate_layout(target_bytes, Layout(stacks, "shared"))
