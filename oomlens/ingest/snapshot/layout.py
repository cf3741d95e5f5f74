"""Recognise a loaded pickle's snapshot layout, check its shape, and build :class:`Snapshot`.

Layouts accepted (torch's own readers, ``_memory_viz._read`` and MemoryViz.js, accept the same):

* torch >= 2.1 ``_snapshot()`` / ``_dump_snapshot``: a dict with ``segments``,
  ``device_traces`` and, from 2.3 on, ``allocator_settings`` and ``external_annotations``;
* torch 2.0: the same dict, but blocks carry ``history`` (``addr``, ``real_size``,
  ``frames``) instead of ``frames``/``address``/``requested_size``, and trace entries carry no
  ``time_us``;
* a bare list of segments (``torch.cuda.memory_snapshot()``, or 1.13's ``_snapshot()``).

Segments and blocks are checked one by one here (there are at most a few hundred thousand):
every field the analysis reads must have the type torch writes, or :class:`InputError` names the
first one that does not (``segments[12].blocks[3].size is a str``).  Trace entries, which can
number in the millions, are checked by the analysis as it reads them.  Nothing is copied or
mutated: :class:`RawSnapshot` holds the unpickled lists themselves.
"""

from __future__ import annotations

from typing import Any

from oomlens.errors import InputError
from oomlens.facts import SourceRef
from oomlens.facts.snapshot import (
    AllocatorSettings,
    HistoryMode,
    RawSnapshot,
    Snapshot,
    SnapshotLayout,
    StackDepth,
)

KNOWN_BLOCK_STATES = frozenset(
    {"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"}
)
"""Block states torch writes (``active_awaiting_free`` is the name in the 2.11 docstring)."""

_MARKER_ACTIONS = frozenset({"snapshot", "oom"})
_TOP_LEVEL_KEYS = frozenset(
    {"segments", "device_traces", "allocator_settings", "external_annotations", "traces"}
)
_STACK_SCAN_LIMIT = 500

_SHAPE_HINT = (
    "this does not look like a torch.cuda.memory._snapshot() pickle; "
    "check that the right file was given"
)


def build_snapshot(
    data: object,
    *,
    source: SourceRef,
    protocol: int | None,
    compressed: bool,
    file_bytes: int,
    pickle_bytes: int,
) -> Snapshot:
    """Check the shape of unpickled ``data`` and wrap it as a :class:`Snapshot`.

    Raises ``InputError`` (naming ``source.path``) when ``data`` is not one of the layouts in
    the module docstring or a segment/block field has a type torch never writes.
    """
    where = source.path
    segments: object
    device_traces: list[Any]
    annotations: list[Any]
    settings: AllocatorSettings | None = None
    extra_keys: tuple[str, ...] = ()
    if isinstance(data, list):
        segments = data
        device_traces = []
        annotations = []
        is_dict = False
    elif isinstance(data, dict):
        is_dict = True
        segments = data.get("segments")
        if not isinstance(segments, list):
            found = "no" if segments is None else f"a {type(segments).__name__} as"
            raise InputError(
                where, f"the pickle is a dict with {found} 'segments' list", _SHAPE_HINT
            )
        device_traces = _checked_traces(where, data.get("device_traces", data.get("traces", [])))
        has_traces = "device_traces" in data or "traces" in data
        raw_annotations = data.get("external_annotations", [])
        annotations = raw_annotations if isinstance(raw_annotations, list) else []
        raw_settings = data.get("allocator_settings")
        if isinstance(raw_settings, dict):
            settings = parse_allocator_settings(raw_settings)
        extra_keys = tuple(sorted(str(key) for key in data if key not in _TOP_LEVEL_KEYS))[:20]
    else:
        raise InputError(
            where,
            f"the pickle holds a {type(data).__name__}, not a snapshot dict or segment list",
            _SHAPE_HINT,
        )

    block_count, block_history = _check_segments(where, segments)
    devices = {segment["device"] for segment in segments}
    trace_entries = 0
    for device, trace in enumerate(device_traces):
        trace_entries += len(trace)
        if any(
            _action(where, device, index, entry) not in _MARKER_ACTIONS
            for index, entry in enumerate(trace)
        ):
            devices.add(device)
    device_count = max(len(device_traces), max(devices, default=-1) + 1)

    if not is_dict:
        layout = SnapshotLayout.SEGMENT_LIST
        history = HistoryMode.NONE
    else:
        layout = SnapshotLayout.BLOCK_HISTORY if block_history else SnapshotLayout.CURRENT
        history = _history_mode(device_traces) if has_traces else HistoryMode.NONE
    return Snapshot(
        source=source,
        layout=layout,
        history=history,
        stacks=_stack_depth(segments, device_traces),
        pickle_protocol=protocol,
        compressed=compressed,
        file_bytes=file_bytes,
        pickle_bytes=pickle_bytes,
        devices=tuple(sorted(devices)),
        device_count=device_count,
        segment_count=len(segments),
        block_count=block_count,
        trace_entry_count=trace_entries,
        allocator_settings=settings,
        extra_keys=extra_keys,
        raw=RawSnapshot(segments=segments, device_traces=device_traces, annotations=annotations),
    )


def _checked_traces(where: str, traces: object) -> list[Any]:
    if not isinstance(traces, list):
        raise InputError(
            where, f"'device_traces' is a {type(traces).__name__}, not a list", _SHAPE_HINT
        )
    for device, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise InputError(
                where,
                f"device_traces[{device}] is a {type(trace).__name__}, not a list",
                _SHAPE_HINT,
            )
    return traces


def _action(where: str, device: int, index: int, entry: object) -> object:
    if type(entry) is not dict:
        raise InputError(
            where,
            f"device_traces[{device}][{index}] is a {type(entry).__name__}, not a dict",
            _SHAPE_HINT,
        )
    action = entry.get("action")
    if type(action) is not str:
        raise InputError(
            where, f"device_traces[{device}][{index}] has no 'action' string", _SHAPE_HINT
        )
    return action


def _bad(where: str, location: str, what: str) -> InputError:
    return InputError(where, f"{location} {what}", _SHAPE_HINT)


def _int_field(
    where: str, record: dict[Any, Any], key: str, location: str, *, required: bool = True
) -> None:
    value = record.get(key)
    if value is None and not required:
        return
    if type(value) is not int:
        what = "is missing" if value is None else f"is a {type(value).__name__}, not an int"
        raise _bad(where, f"{location}.{key}", what)
    if value < 0 and key != "stream":
        raise _bad(where, f"{location}.{key}", f"is negative ({value})")


def _check_segments(where: str, segments: list[Any]) -> tuple[int, bool]:
    """Check every segment and block; return (number of blocks, whether blocks use ``history``)."""
    blocks_total = 0
    block_history = False
    for seg_index, segment in enumerate(segments):
        location = f"segments[{seg_index}]"
        if type(segment) is not dict:
            raise _bad(where, location, f"is a {type(segment).__name__}, not a dict")
        for key in ("device", "total_size"):
            _int_field(where, segment, key, location)
        _int_field(where, segment, "address", location, required=False)
        _int_field(where, segment, "stream", location, required=False)
        segment_type = segment.get("segment_type", "large")
        if segment_type not in ("large", "small"):
            raise _bad(
                where, f"{location}.segment_type", f"is {segment_type!r}, not 'large' or 'small'"
            )
        pool_id = segment.get("segment_pool_id", (0, 0))
        if not (
            isinstance(pool_id, tuple | list)
            and len(pool_id) == 2
            and all(type(part) is int for part in pool_id)
        ):
            raise _bad(where, f"{location}.segment_pool_id", "is not a pair of ints")
        blocks = segment.get("blocks")
        if type(blocks) is not list:
            raise _bad(
                where, f"{location}.blocks", "is missing" if blocks is None else "is not a list"
            )
        for block_index, block in enumerate(blocks):
            block_location = f"{location}.blocks[{block_index}]"
            if type(block) is not dict:
                raise _bad(where, block_location, f"is a {type(block).__name__}, not a dict")
            size = block.get("size")
            if type(size) is not int or size < 0:
                raise _bad(where, f"{block_location}.size", "is not a non-negative int")
            state = block.get("state")
            if state not in KNOWN_BLOCK_STATES:
                raise _bad(
                    where,
                    f"{block_location}.state",
                    f"is {_short_repr(state)}, not a state torch writes",
                )
            requested = block.get("requested_size", 0)
            if type(requested) is not int:
                raise _bad(where, f"{block_location}.requested_size", "is not an int")
            frames = block.get("frames")
            if frames is None:
                history = block.get("history")
                if history is not None:
                    block_history = True
                    if type(history) is not list or not all(type(item) is dict for item in history):
                        raise _bad(where, f"{block_location}.history", "is not a list of dicts")
            elif type(frames) is not list:
                raise _bad(where, f"{block_location}.frames", "is not a list")
        blocks_total += len(blocks)
    return blocks_total, block_history


def _short_repr(value: object) -> str:
    text = (
        repr(value)
        if isinstance(value, str | int | float | bool | None)
        else f"a {type(value).__name__}"
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _history_mode(device_traces: list[Any]) -> HistoryMode:
    for trace in device_traces:
        for entry in trace:
            if entry["action"] not in _MARKER_ACTIONS:
                return HistoryMode.ALLOC_HISTORY
    return HistoryMode.STATE_ONLY


def _stack_depth(segments: list[Any], device_traces: list[Any]) -> StackDepth:
    """Which frames were recorded, judged from up to a few thousand frame lists."""
    seen_python = False
    scanned = 0

    def frame_lists() -> Any:
        for segment in segments:
            for block in segment["blocks"]:
                frames = block.get("frames")
                if frames is None:
                    history = block.get("history")
                    frames = history[0].get("frames") if history else None
                yield frames
        for trace in device_traces:
            for entry in trace:
                yield entry.get("frames")

    seen: set[int] = set()
    for frames in frame_lists():
        if not frames or type(frames) is not list:
            continue
        # Frame lists are memoized in the pickle: a free shares its block's alloc stack.
        if id(frames) in seen:
            continue
        seen.add(id(frames))
        scanned += 1
        for frame in frames:
            if type(frame) is not dict:
                continue
            filename = frame.get("filename")
            line = frame.get("line")
            if isinstance(filename, str) and (
                filename.endswith(".py") or (type(line) is int and line > 0)
            ):
                seen_python = True
            elif line == 0:
                return StackDepth.PYTHON_AND_NATIVE
        if scanned >= _STACK_SCAN_LIMIT:
            break
    return StackDepth.PYTHON if seen_python else StackDepth.NONE


# --------------------------------------------------------------------------------------------
# allocator_settings
# --------------------------------------------------------------------------------------------

_KNOWN_SETTINGS = frozenset(
    {
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "garbage_collection_threshold",
        "expandable_segments",
        "roundup_power2_divisions",
        "release_lock_on_cudamalloc",
    }
)
_MAX_CONFIG_CHARS = 4096


def parse_allocator_settings(raw: dict[Any, Any]) -> AllocatorSettings:
    """Read torch's ``allocator_settings`` dict; fields of unexpected type become None."""
    conf = raw.get("PYTORCH_CUDA_ALLOC_CONF")
    conf_text = conf[:_MAX_CONFIG_CHARS] if isinstance(conf, str) else ""
    max_split = raw.get("max_split_size")
    divisions_raw = raw.get("roundup_power2_divisions")
    divisions: list[tuple[int, int]] = []
    if isinstance(divisions_raw, dict):
        for key, value in divisions_raw.items():
            try:
                divisions.append((int(key), int(value)))
            except (TypeError, ValueError):
                continue
    threshold = raw.get("garbage_collection_threshold")
    other = tuple(
        (str(key)[:100], _short_repr(value))
        for key, value in raw.items()
        if key not in _KNOWN_SETTINGS
    )
    return AllocatorSettings(
        raw_config=conf_text,
        expandable_segments=_bool_or_none(raw.get("expandable_segments")),
        max_split_size=max_split if type(max_split) is int and max_split >= 0 else None,
        garbage_collection_threshold=float(threshold)
        if isinstance(threshold, int | float)
        else None,
        roundup_power2_divisions=tuple(sorted(divisions)[:64]),
        release_lock_on_cudamalloc=_bool_or_none(raw.get("release_lock_on_cudamalloc")),
        config_options=split_alloc_conf(conf_text),
        other=other[:50],
    )


def _bool_or_none(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def split_alloc_conf(text: str) -> tuple[tuple[str, str], ...]:
    """Split a config: ``"a:1,b:[2:1,4:2]"`` -> ``(("a", "1"), ("b", "[2:1,4:2]"))``.

    Splits as torch's lexer does: options on commas or whitespace, key and value on the first
    colon; a bracketed list value (``roundup_power2_divisions:[256:1,512:2]``) stays whole.
    """
    options: list[tuple[str, str]] = []
    token: list[str] = []
    depth = 0
    for char in text[:_MAX_CONFIG_CHARS] + ",":
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if depth == 0 and (char == "," or char.isspace()):
            item = "".join(token).strip()
            token = []
            if item:
                key, _, value = item.partition(":")
                options.append((key.strip(), value.strip()))
            continue
        token.append(char)
    return tuple(options)
