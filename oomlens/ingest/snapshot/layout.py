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
first one that does not (``segments[12].blocks[3].size is a str``), and every number must lie in
the range of the C++ field torch copies it from (addresses and sizes below 2**64, ...): None, a
float or a 5,001-digit int is refused here, not met later by the analysis.  Trace entries, which
can number in the millions, get the same numeric check on one expression per entry; the rest of
an entry is checked by the analysis as it reads it.  Before any of that,
:func:`check_walk` makes sure the walks cost what the file suggests: no segment, block list or
trace may appear twice (pickle memoization would let a small file repeat one millions of
times), and the blocks and trace entries to visit stay within :class:`SnapshotLimits`.
Nothing is copied or mutated: :class:`RawSnapshot` holds the unpickled lists themselves.
"""

from __future__ import annotations

from typing import Any

from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts import SourceRef
from oomlens.facts.snapshot import (
    AllocatorSettings,
    HistoryMode,
    RawSnapshot,
    Snapshot,
    SnapshotLayout,
    StackDepth,
)
from oomlens.ingest.snapshot.unpickler import SnapshotLimits

KNOWN_BLOCK_STATES = frozenset(
    {"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"}
)
"""Block states torch writes (``active_awaiting_free`` is the name in the 2.11 docstring)."""

_MARKER_ACTIONS = frozenset({"snapshot", "oom"})
_TOP_LEVEL_KEYS = frozenset(
    {"segments", "device_traces", "allocator_settings", "external_annotations", "traces"}
)
_STACK_SCAN_LIMIT = 500
_SEGMENT_OPTIONAL_SIZES = ("address", "allocated_size", "active_size", "requested_size")

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
    limits: SnapshotLimits | None = None,
) -> Snapshot:
    """Check the shape of unpickled ``data`` and wrap it as a :class:`Snapshot`.

    Raises ``InputError`` (naming ``source.path``) when ``data`` is not one of the layouts in
    the module docstring, a segment/block field has a type torch never writes, or the data
    repeats a segment, a block list or a trace (see :func:`check_walk`);
    ``ResourceLimitError`` when walking it would visit more blocks or trace entries than
    ``limits`` allow (the defaults of :class:`SnapshotLimits` when None).
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

    check_walk(where, segments, device_traces, limits or SnapshotLimits())
    block_count, block_history = _check_segments(where, segments)
    devices = {segment["device"] for segment in segments}
    trace_entries = 0
    for device, trace in enumerate(device_traces):
        trace_entries += len(trace)
        # every entry is checked: later passes read them all, not just up to the first event
        if _check_trace(where, device, trace):
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


def _check_trace(where: str, device: int, trace: list[Any]) -> bool:
    """Check every entry of one device's trace as :func:`_action` does; return whether any is
    an allocator event (not a ``snapshot``/``oom`` marker).

    :func:`_action`'s test, inlined on locals: a trace holds millions of entries, and a call
    and four global lookups per entry were half of this walk's time.  An entry that fails it
    goes to :func:`_action`, which names what is wrong (or passes an ``oom`` entry whose
    ``device_free`` it has checked).
    """
    u64 = _U64
    time_low, time_high = _TIME_RANGE
    stream_low, stream_high = _STREAM_RANGE
    markers = _MARKER_ACTIONS
    events = False
    for index, entry in enumerate(trace):
        if type(entry) is dict:
            action = entry.get("action")
            addr = entry.get("addr", 0)
            size = entry.get("size", 0)
            time_us = entry.get("time_us", 0)
            stream = entry.get("stream", 0)
            if (
                type(action) is str
                and type(addr) is int
                and type(size) is int
                and type(time_us) is int
                and type(stream) is int
                and 0 <= addr < u64
                and 0 <= size < u64
                and time_low <= time_us < time_high
                and stream_low <= stream < stream_high
                and (action != "oom" or "device_free" not in entry)
            ):
                if not events and action not in markers:
                    events = True
                continue
        if _action(where, device, index, entry) not in markers:
            events = True
    return events


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
    # Every entry is checked, so the common case is one expression on locals.
    addr = entry.get("addr", 0)
    size = entry.get("size", 0)
    time_us = entry.get("time_us", 0)
    stream = entry.get("stream", 0)
    if (
        type(addr) is not int
        or type(size) is not int
        or type(time_us) is not int
        or type(stream) is not int
        or not 0 <= addr < _U64
        or not 0 <= size < _U64
        or not _TIME_RANGE[0] <= time_us < _TIME_RANGE[1]
        or not _STREAM_RANGE[0] <= stream < _STREAM_RANGE[1]
        or (action == "oom" and "device_free" in entry)
    ):
        location = f"device_traces[{device}][{index}]"
        for key in ("addr", "size", "device_free"):
            _int_field(where, entry, key, location, required=False)
        _int_field(where, entry, "time_us", location, required=False, bounds=_TIME_RANGE)
        _int_field(where, entry, "stream", location, required=False, bounds=_STREAM_RANGE)
    return action


def _bad(where: str, location: str, what: str) -> InputError:
    return InputError(where, f"{location} {what}", _SHAPE_HINT)


# The ranges of the C++ types torch copies each number from: addresses and sizes are size_t
# (unsigned 64-bit), time_us an int64 of microseconds, a stream a cudaStream_t (a pointer, or a
# negative id for the special streams), a device a c10::DeviceIndex (int8; int16 before 2.1).
# A number outside them (a 5,001-digit int, which str() even refuses) is not torch's.
_U64 = 2**64
_STREAM_RANGE = (-(2**63), _U64)
_TIME_RANGE = (-(2**63), 2**63)
_DEVICE_RANGE = (0, 2**15)
_SIZE_RANGE = (0, _U64)


def _int_field(
    where: str,
    record: dict[Any, Any],
    key: str,
    location: str,
    *,
    required: bool = True,
    bounds: tuple[int, int] = _SIZE_RANGE,
) -> None:
    """Check ``record[key]`` is an int within ``bounds`` (low inclusive, high exclusive).

    Absent is allowed when not ``required``; present, it must be an int whatever: torch never
    writes None in a numeric field.
    """
    if key not in record and not required:
        return
    value = record.get(key)
    if type(value) is not int:
        if key not in record:
            what = "is missing"
        else:
            what = "is None" if value is None else f"is a {type(value).__name__}"
            what += ", not an int"
        raise _bad(where, f"{location}.{key}", what)
    low, high = bounds
    if not low <= value < high:
        raise _bad(where, f"{location}.{key}", _out_of_range(value, bounds))


def _out_of_range(value: int, bounds: tuple[int, int]) -> str:
    low, high = bounds
    if low == 0 and value < 0 and value.bit_length() <= 64:
        return f"is negative ({value})"
    shown = f"a {value.bit_length()}-bit int" if value.bit_length() > 64 else f"{value:,}"
    return f"is {shown}, outside {low:,} to {high - 1:,}, the range torch writes it in"


def check_walk(
    where: str, segments: list[Any], device_traces: list[Any], limits: SnapshotLimits
) -> None:
    """Refuse, before any walk, data whose walk would cost more than its file suggests.

    Pickle memoization lets a 300 KB file list one 1,000-block segment 100,000 times: 10^8
    blocks to walk from one segment's bytes.  torch writes every segment, block list and
    trace once, so a repeated one (the very same object twice) is refused as crafted, and the
    blocks and trace entries to visit are counted (one ``len`` per segment and per device, not
    per block) against ``limits.max_blocks`` / ``limits.max_trace_entries``.
    """
    blocks = 0
    dict_segments = []
    block_lists = []
    for segment in segments:
        if type(segment) is dict:  # _check_segments names any other
            dict_segments.append(segment)
            segment_blocks = segment.get("blocks")
            if type(segment_blocks) is list:
                block_lists.append(segment_blocks)
                blocks += len(segment_blocks)
    entries = sum(len(trace) for trace in device_traces)
    for items, location in (
        (dict_segments, "segments[{}]"),
        (block_lists, "the blocks list of segment {}"),
        (device_traces, "device_traces[{}]"),
    ):
        if len(set(map(id, items))) != len(items):
            raise _repeated(where, items, location)
    for count, limit, what, field in (
        (blocks, limits.max_blocks, "blocks", "max_blocks"),
        (entries, limits.max_trace_entries, "trace entries", "max_trace_entries"),
    ):
        if limit is not None and count > limit:
            raise ResourceLimitError(
                where,
                f"the snapshot holds {count:,} {what}, over the limit of {limit:,} that one "
                "analysis may walk",
                f"raise SnapshotLimits.{field} if this is a genuine snapshot",
            )


def _repeated(where: str, items: list[Any], location: str) -> InputError:
    """Name the first repeated object of ``items`` (``location`` formats an index)."""
    first: dict[int, int] = {}
    index = earlier = 0
    for index, item in enumerate(items):
        earlier = first.setdefault(id(item), index)
        if earlier != index:
            break
    repeats = len(items) - len(set(map(id, items)))
    return InputError(
        where,
        f"{location.format(index)} is the very same object as {location.format(earlier)} "
        f"({repeats:,} such repeats): torch writes each once, and walking the repeats could "
        "cost far more than the file's size, so the file is crafted or corrupt",
        "check where the file came from and take the snapshot from the job again",
    )


def _check_segments(where: str, segments: list[Any]) -> tuple[int, bool]:
    """Check every segment and block; return (number of blocks, whether blocks use ``history``).

    The per-block checks run on every block of every snapshot, so they are plain type tests
    on locals; a block's location string is only built when it is wrong.
    """
    blocks_total = 0
    block_history = False
    histories_seen: set[int] = set()
    states = KNOWN_BLOCK_STATES
    for seg_index, segment in enumerate(segments):
        if type(segment) is not dict:
            raise _bad(
                where, f"segments[{seg_index}]", f"is a {type(segment).__name__}, not a dict"
            )
        device = segment.get("device")
        total = segment.get("total_size")
        seg_address = segment.get("address", 0)
        allocated = segment.get("allocated_size", 0)
        active = segment.get("active_size", 0)
        seg_requested = segment.get("requested_size", 0)
        stream = segment.get("stream", 0)
        pool_id = segment.get("segment_pool_id", (0, 0))
        blocks: list[Any] = segment.get("blocks")  # type: ignore[assignment]  # checked below
        # The common case is one expression on locals (there can be a million segments);
        # the field-by-field checks run only when it fails, to name the wrong field.
        if not (
            type(device) is int
            and 0 <= device < _DEVICE_RANGE[1]
            and type(total) is int
            and 0 <= total < _U64
            and type(seg_address) is int
            and 0 <= seg_address < _U64
            and type(allocated) is int
            and 0 <= allocated < _U64
            and type(active) is int
            and 0 <= active < _U64
            and type(seg_requested) is int
            and 0 <= seg_requested < _U64
            and type(stream) is int
            and _STREAM_RANGE[0] <= stream < _STREAM_RANGE[1]
            and segment.get("segment_type", "large") in _SEGMENT_TYPES
            and type(pool_id) is tuple
            and len(pool_id) == 2
            and type(pool_id[0]) is int
            and type(pool_id[1]) is int
            and 0 <= pool_id[0] < _U64
            and 0 <= pool_id[1] < _U64
            and type(blocks) is list
        ):
            _check_segment_fields(where, segment, f"segments[{seg_index}]")
        for block_index, block in enumerate(blocks):
            if type(block) is not dict:
                raise _bad(
                    where,
                    f"segments[{seg_index}].blocks[{block_index}]",
                    f"is a {type(block).__name__}, not a dict",
                )
            size = block.get("size")
            state = block.get("state")
            requested = block.get("requested_size", 0)
            frames = block.get("frames")
            address = block.get("address", 0)
            if (
                type(size) is not int
                or not 0 <= size < _U64
                or type(state) is not str
                or state not in states
                or type(requested) is not int
                or not 0 <= requested < _U64
                or type(address) is not int
                or not 0 <= address < _U64
                or (frames is not None and type(frames) is not list)
            ):
                raise _block_error(where, f"segments[{seg_index}].blocks[{block_index}]", block)
            if frames is None:
                history = block.get("history")
                if history is not None:
                    block_history = True
                    # Checked once per list: a crafted file may share one long history list
                    # between every block.
                    if id(history) not in histories_seen:
                        histories_seen.add(id(history))
                        if type(history) is not list or not all(
                            type(item) is dict for item in history
                        ):
                            raise _bad(
                                where,
                                f"segments[{seg_index}].blocks[{block_index}].history",
                                "is not a list of dicts",
                            )
                        for item_index, item in enumerate(history):
                            for key in ("addr", "real_size"):
                                _int_field(
                                    where,
                                    item,
                                    key,
                                    f"segments[{seg_index}].blocks[{block_index}]"
                                    f".history[{item_index}]",
                                    required=False,
                                )
        blocks_total += len(blocks)
    return blocks_total, block_history


_SEGMENT_TYPES = ("large", "small")


def _check_segment_fields(where: str, segment: dict[Any, Any], location: str) -> None:
    """Check a segment's fields one by one; raise ``InputError`` naming the first wrong one."""
    _int_field(where, segment, "device", location, bounds=_DEVICE_RANGE)
    _int_field(where, segment, "total_size", location)
    for key in _SEGMENT_OPTIONAL_SIZES:
        _int_field(where, segment, key, location, required=False)
    _int_field(where, segment, "stream", location, required=False, bounds=_STREAM_RANGE)
    segment_type = segment.get("segment_type", "large")
    if segment_type not in _SEGMENT_TYPES:
        raise _bad(
            where, f"{location}.segment_type", f"is {segment_type!r}, not 'large' or 'small'"
        )
    pool_id = segment.get("segment_pool_id", (0, 0))
    if not (
        isinstance(pool_id, tuple | list)
        and len(pool_id) == 2
        and all(type(part) is int and 0 <= part < _U64 for part in pool_id)
    ):
        raise _bad(where, f"{location}.segment_pool_id", "is not a pair of unsigned 64-bit ints")
    blocks = segment.get("blocks")
    if type(blocks) is not list:
        raise _bad(where, f"{location}.blocks", "is missing" if blocks is None else "is not a list")


def _block_error(where: str, location: str, block: dict[Any, Any]) -> InputError:
    """The first wrong field of a block that failed the fast check, as ``_check_segments``
    names it."""
    _int_field(where, block, "size", location)
    state = block.get("state")
    if type(state) is not str or state not in KNOWN_BLOCK_STATES:
        return _bad(
            where, f"{location}.state", f"is {_short_repr(state)}, not a state torch writes"
        )
    _int_field(where, block, "requested_size", location, required=False)
    _int_field(where, block, "address", location, required=False)
    return _bad(where, f"{location}.frames", "is not a list")


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
    seen_frames: set[int] = set()
    for frames in frame_lists():
        if not frames or type(frames) is not list:
            continue
        # Frame lists are memoized in the pickle: a free shares its block's alloc stack.
        if id(frames) in seen:
            continue
        seen.add(id(frames))
        scanned += 1
        # Frame dicts are shared too: only the ones not met before are looked at (found at C
        # speed; a deep stack of known frames costs no Python step per frame).
        by_id = dict(zip(map(id, frames), frames, strict=True))
        for key in by_id.keys() - seen_frames:
            frame = by_id[key]
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
        seen_frames.update(by_id)
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


def _threshold(value: Any) -> float | None:
    """A garbage-collection threshold as a float; None for what is no number (or an integer
    too large for a float, which no real setting is)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


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
                pair = (int(key), int(value))
            except (TypeError, ValueError, OverflowError):  # inf, nan, huge
                continue
            if all(0 <= part < _U64 for part in pair):
                divisions.append(pair)
    threshold = raw.get("garbage_collection_threshold")
    other = tuple(
        (str(key)[:100], _short_repr(value))
        for key, value in raw.items()
        if key not in _KNOWN_SETTINGS
    )
    return AllocatorSettings(
        raw_config=conf_text,
        expandable_segments=_bool_or_none(raw.get("expandable_segments")),
        max_split_size=max_split if type(max_split) is int and 0 <= max_split < _U64 else None,
        garbage_collection_threshold=_threshold(threshold),
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
