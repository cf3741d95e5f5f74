"""Caching-allocator analytics: what the memory was, who held it, and why the last request failed.

Entry point: :func:`analyze_snapshot(snapshot, options) <analyze_snapshot>` ->
:class:`~oomlens.facts.snapshot.SnapshotAnalysis`, one
:class:`~oomlens.facts.snapshot.DeviceAnalysis` per device.  Everything is computed from the
snapshot alone, in two passes over the raw data (segments and blocks once, each device's
trace once), keeping only summaries and bounded top-N lists, so a 1 GB snapshot costs a small
fraction of its unpickling time and no per-block objects.

What is computed, per device (field docs in :mod:`oomlens.facts.snapshot`):

* **State** (from ``segments``): reserved / allocated / active / requested bytes; free bytes
  split into *unreleasable* (free blocks in segments that still hold a live block: what the
  OOM message calls "reserved by PyTorch but unallocated" once the OOM retry has released
  every whole free segment), *releasable* (whole free segments), free space in expandable
  segments and in private pools; the largest free block per (pool, stream, private pool);
  pools, split and expandable segments, pending frees.
* **Who holds it**: live bytes grouped by the first user frame of the allocation stack and
  by inferred category (:mod:`oomlens.analysis.stacks`); the biggest live blocks; the
  segments pinned by a live block with the most free space inside.
* **The failing request**: the last ``oom`` trace entry, its rounded size and the segment
  size torch asked for (:func:`allocation_size`, the OOM message's "Tried to allocate"),
  against the largest free block it could have used.
* **Timeline** (from ``device_traces``): live and reserved bytes replayed event by event,
  the peaks, what grew before the OOM and in its iteration, iterations (from
  ``external_annotations`` such as ``Optimizer.step#Adam.step`` START markers, else from a
  regularly recurring allocation) and a leak: live bytes growing by about the same amount
  every iteration, with the call sites whose allocations survive every iteration.
* **Settings**: the allocator settings recorded in the snapshot (on ``SnapshotAnalysis``).

Malformed trace entries (a missing key, a wrong type) raise
:class:`~oomlens.errors.InputError` naming the entry.
"""

from __future__ import annotations

import heapq
import statistics
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from oomlens.analysis.stacks import NO_PYTHON_STACK, NO_STACK, Attribution, StackResolver
from oomlens.analysis.whatif import replay_verdict
from oomlens.errors import InputError
from oomlens.facts.snapshot import (
    AllocatorSettings,
    BlockInfo,
    BlockState,
    CallSite,
    CategoryBytes,
    DeviceAnalysis,
    FreeSpace,
    Growth,
    HistoryMode,
    Iterations,
    Leak,
    LeakSite,
    MemoryCategory,
    MemoryState,
    OomEvent,
    Pool,
    PoolUsage,
    PrivatePoolUsage,
    SegmentInfo,
    SiteBytes,
    Snapshot,
    SnapshotAnalysis,
    SnapshotLayout,
    StackDepth,
    Timeline,
    TimelinePoint,
)
from oomlens.ingest.snapshot.unpickler import gc_paused

MiB = 1024**2

# Caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp).
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_LARGE_BUFFER = 20 * MiB
K_ROUND_LARGE = 2 * MiB
_DIVISION_INTERVALS = 16  # roundup_power2_divisions buckets: [1 MiB, 2 MiB), ... [32 GiB, inf)

DEFAULT_POOL: tuple[int, int] = (0, 0)

NOTES = {
    "no_history": "the snapshot has no allocation history (a bare segment list)",
    "state_only": "recorded with enabled='state': live blocks only, no timeline; record with "
    "_record_memory_history(enabled='all') to get one",
    "no_stacks": "no allocation stacks were recorded (context=None); who-holds-what is unknown",
    "history_wrapped": "the history starts mid-run (the ring buffer wrapped or recording began "
    "late): some frees have no matching alloc",
    "no_timestamps": "trace entries carry no time_us (torch 2.0)",
    "segment_size_mismatch": "some segment's blocks do not add up to its total_size",
    "pending_frees": "some blocks were freed but still wait for other streams (record_stream)",
    "oom_not_at_snapshot": "allocator events happened between the OOM and the snapshot, so the "
    "segments show a later state than the failure",
}
"""The remarks :attr:`DeviceAnalysis.notes` may hold, with what each means."""


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Knobs of the analysis; the defaults suit reports.

    ``top_n`` bounds every list (sites, blocks, segments, leak sites); ``timeline_points``
    the downsampled curve.  A leak needs ``min_leak_iterations`` complete iterations, a share
    ``leak_growing_fraction`` of them growing, a median growth of at least
    ``min_leak_bytes_per_iteration``, and at least one call site with survivors in that same
    share of the iterations.
    """

    top_n: int = 20
    timeline_points: int = 256
    min_leak_iterations: int = 3
    leak_growing_fraction: float = 0.75
    min_leak_bytes_per_iteration: int = 512
    max_boundaries: int = 64
    replay_fix: str | None = "expandable_segments:True"
    """The allocator setting replayed for a device that ran out (None: no replay)."""
    replay_max_entries: int = 2_000_000
    """Longer traces are not replayed (time is bounded by the trace's length)."""


# --------------------------------------------------------------------------------------------
# Allocator arithmetic
# --------------------------------------------------------------------------------------------


def division_table(settings: AllocatorSettings | None) -> tuple[int, ...]:
    """The 16 ``roundup_power2_divisions`` values by interval (all 0 when unset or unknown)."""
    table = [0] * _DIVISION_INTERVALS
    if settings is not None:
        for lower_mib, divisions in settings.roundup_power2_divisions:
            if lower_mib > 0 and divisions > 0:
                index = lower_mib.bit_length() - 1
                if 0 <= index < _DIVISION_INTERVALS:
                    table[index] = divisions
    return tuple(table)


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """The block size the allocator carves for a ``size``-byte request (torch's ``round_size``).

    At least 512 bytes, a multiple of 512, or the next power-of-2 division when
    ``roundup_power2_divisions`` is set for the size's interval (``divisions`` as from
    :func:`division_table`).
    """
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions:
        index = min(max(size.bit_length() - 1 - 20, 0), _DIVISION_INTERVALS - 1)
        count = divisions[index]
        if count > 1 and size > K_MIN_BLOCK_SIZE * count:
            return _roundup_power2_next_division(size, count)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def allocation_size(rounded_size: int) -> int:
    """The segment size torch cudaMallocs for a request (``get_allocation_size``).

    This is the "Tried to allocate" figure of the OOM message: 2 MiB for requests up to
    1 MiB, 20 MiB below 10 MiB, else the request rounded up to a multiple of 2 MiB.
    """
    if rounded_size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded_size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded_size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def pool_for(rounded_size: int) -> Pool:
    """Which pool a request is served from (small: <= 1 MiB)."""
    return Pool.SMALL if rounded_size <= K_SMALL_SIZE else Pool.LARGE


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def analyze_snapshot(
    snapshot: Snapshot, options: AnalysisOptions | None = None
) -> SnapshotAnalysis:
    """Analyze every device of ``snapshot``; see the module docstring.

    Raises ``InputError`` (naming the snapshot file) when a trace entry is malformed.
    """
    options = options or AnalysisOptions()
    python_only = snapshot.stacks is StackDepth.PYTHON
    resolver = StackResolver(NO_PYTHON_STACK if python_only else NO_STACK)
    divisions = division_table(snapshot.allocator_settings)
    raw = snapshot.raw
    segments_by_device: dict[int, list[Any]] = {}
    for segment in raw.segments:
        segments_by_device.setdefault(segment["device"], []).append(segment)
    annotations = _annotations_by_device(raw.annotations)
    devices = []
    with gc_paused():
        for device in snapshot.devices:
            trace = raw.device_traces[device] if device < len(raw.device_traces) else []
            devices.append(
                _analyze_device(
                    snapshot,
                    device,
                    segments_by_device.get(device, []),
                    trace,
                    annotations.get(device, []),
                    resolver,
                    divisions,
                    options,
                )
            )
    if options.replay_fix is not None:
        devices = [_with_replay(snapshot, device, options) for device in devices]
    return SnapshotAnalysis(
        source=snapshot.source,
        layout=snapshot.layout,
        history=snapshot.history,
        stacks=snapshot.stacks,
        allocator_settings=snapshot.allocator_settings,
        devices=tuple(devices),
    )


def _with_replay(
    snapshot: Snapshot, device: DeviceAnalysis, options: AnalysisOptions
) -> DeviceAnalysis:
    """``device`` with the replay's verdict on ``options.replay_fix`` when it ran out with
    memory reserved but unallocated (the fragmentation the fix is for)."""
    trace = snapshot.raw.device_traces
    if (
        device.oom is None
        or device.history is not HistoryMode.ALLOC_HISTORY
        or device.state.reserved_unallocated_bytes <= 0
        or len(trace[device.device]) > options.replay_max_entries
        or options.replay_fix is None
    ):
        return device
    verdict = replay_verdict(snapshot, device.device, options.replay_fix)
    return device if verdict is None else replace(device, replay=verdict)


def _annotations_by_device(annotations: list[Any]) -> dict[int, list[tuple[int, str]]]:
    """START annotations per device as (time_us, name), skipping malformed records."""
    found: dict[int, list[tuple[int, str]]] = {}
    for record in annotations:
        if type(record) is not dict or record.get("stage") != "START":
            continue
        device, time_us, name = record.get("device"), record.get("time_us"), record.get("name")
        if type(device) is int and type(time_us) is int and type(name) is str:
            found.setdefault(device, []).append((time_us, name))
    return found


def _analyze_device(
    snapshot: Snapshot,
    device: int,
    segments: list[Any],
    trace: list[Any],
    annotations: list[tuple[int, str]],
    resolver: StackResolver,
    divisions: tuple[int, ...],
    options: AnalysisOptions,
) -> DeviceAnalysis:
    notes: list[str] = []
    held = _segment_pass(segments, resolver, snapshot.layout, options)
    if held.size_mismatch:
        notes.append("segment_size_mismatch")
    if held.state.pending_free_blocks:
        notes.append("pending_frees")
    if snapshot.stacks is StackDepth.NONE:
        notes.append("no_stacks")

    if snapshot.history is HistoryMode.NONE:
        history = HistoryMode.NONE
        notes.append("no_history")
    elif _has_events(trace):
        history = HistoryMode.ALLOC_HISTORY
    else:
        history = HistoryMode.STATE_ONLY
        notes.append("state_only")

    timeline = growth = iteration_growth = None
    iterations = leak = None
    if history is HistoryMode.ALLOC_HISTORY:
        if trace and trace[0].get("time_us") is None:
            notes.append("no_timestamps")
        found = _analyze_history(
            snapshot.source.path, device, trace, held, annotations, resolver, divisions, options
        )
        timeline, growth, iteration_growth = found.timeline, found.growth, found.iteration_growth
        iterations, leak = found.iterations, found.leak
        oom_index, ooms, changed_after_oom = found.oom_index, timeline.ooms, found.changed_after_oom
        if timeline.unmatched_frees:
            notes.append("history_wrapped")
    else:
        # A state-only trace holds one or two entries: scanning it costs nothing.
        oom_index = _last_oom_index(trace)
        ooms = sum(1 for item in trace if type(item) is dict and item.get("action") == "oom")
        changed_after_oom = oom_index is not None and any(
            type(later) is dict and later.get("action") in _STATE_CHANGING
            for later in trace[oom_index + 1 :]
        )

    oom = None
    if oom_index is not None:
        oom = _oom_event(
            snapshot.source.path, device, trace, oom_index, held, resolver, not changed_after_oom
        )
        if not oom.snapshot_at_oom:
            notes.append("oom_not_at_snapshot")
    earlier_ooms = max(ooms - 1, 0)

    return DeviceAnalysis(
        device=device,
        history=history,
        state=held.state,
        oom=oom,
        earlier_ooms=earlier_ooms,
        live_by_site=held.by_site,
        live_by_category=held.by_category,
        top_blocks=held.top_blocks,
        pinned_segments=held.pinned_segments,
        timeline=timeline,
        growth=growth,
        iteration_growth=iteration_growth,
        iterations=iterations,
        leak=leak,
        notes=tuple(notes),
    )


def _has_events(trace: list[Any]) -> bool:
    for entry in trace:
        if type(entry) is dict and entry.get("action") not in ("snapshot", "oom"):
            return True
    return False


def _last_oom_index(trace: list[Any]) -> int | None:
    """Index of the last ``oom`` entry; the scan from the end stops at it (usually at once)."""
    for index in range(len(trace) - 1, -1, -1):
        entry = trace[index]
        if type(entry) is dict and entry.get("action") == "oom":
            return index
    return None


# --------------------------------------------------------------------------------------------
# Pass 1: segments and blocks
# --------------------------------------------------------------------------------------------


class _Tally:
    """Bytes and blocks per attribution, folded into sites and categories at the end."""

    def __init__(self) -> None:
        self.by_attribution: dict[int, list[Any]] = {}

    def add(self, attribution: Attribution, size: int) -> None:
        slot = self.by_attribution.get(id(attribution))
        if slot is None:
            self.by_attribution[id(attribution)] = [attribution, size, 1, {size: 1}]
        else:
            slot[1] += size
            slot[2] += 1
            sizes = slot[3]
            sizes[size] = sizes.get(size, 0) + 1

    def total(self) -> int:
        return sum(slot[1] for slot in self.by_attribution.values())

    def by_site(self, top_n: int) -> tuple[SiteBytes, ...]:
        sites: dict[CallSite | None, list[Any]] = {}
        for attribution, size, blocks, block_sizes in self.by_attribution.values():
            slot = sites.setdefault(attribution.site, [0, 0, {}, {}])
            slot[0] += size
            slot[1] += blocks
            slot[2][attribution.category] = slot[2].get(attribution.category, 0) + size
            for block_size, count in block_sizes.items():
                slot[3][block_size] = slot[3].get(block_size, 0) + count
        ranked = sorted(sites.items(), key=lambda item: (-item[1][0], _site_key(item[0])))
        result = []
        for site, (size, blocks, categories, block_sizes) in ranked[:top_n]:
            category = max(categories.items(), key=lambda kv: (kv[1], kv[0].value))[0]
            common_size, common_count = max(block_sizes.items(), key=lambda kv: (kv[1], kv[0]))
            result.append(SiteBytes(site, size, blocks, category, common_size, common_count))
        return tuple(result)

    def by_category(self) -> tuple[CategoryBytes, ...]:
        categories: dict[MemoryCategory, list[Any]] = {}
        for attribution, size, blocks, _ in self.by_attribution.values():
            slot = categories.setdefault(attribution.category, [0, 0, {}])
            slot[0] += size
            slot[1] += blocks
            key = (attribution.evidence, attribution.confidence)
            slot[2][key] = slot[2].get(key, 0) + size
        result = []
        for category, (size, blocks, evidence) in categories.items():
            (text, confidence), _ = max(evidence.items(), key=lambda kv: (kv[1], kv[0][0]))
            result.append(CategoryBytes(category, size, blocks, confidence, text))
        result.sort(key=lambda item: (-item.bytes, item.category.value))
        return tuple(result)


def _site_key(site: CallSite | None) -> tuple[str, int, str]:
    return ("", 0, "") if site is None else (site.filename, site.line, site.name)


@dataclass(slots=True)
class _Held:
    state: MemoryState
    by_site: tuple[SiteBytes, ...]
    by_category: tuple[CategoryBytes, ...]
    top_blocks: tuple[BlockInfo, ...]
    pinned_segments: tuple[SegmentInfo, ...]
    free_space: dict[tuple[Pool, int, tuple[int, int]], FreeSpace]
    size_mismatch: bool


def _block_frames_and_requested(block: dict[str, Any], legacy: bool) -> tuple[Any, int]:
    if not legacy:
        return block.get("frames"), block.get("requested_size", block["size"])
    frames = block.get("frames")
    if frames is not None:
        return frames, block.get("requested_size", block["size"])
    history = block.get("history")
    if history:
        first = history[0]
        requested = first.get("real_size", block.get("requested_size", block["size"]))
        return first.get("frames"), requested if type(requested) is int else block["size"]
    return None, block.get("requested_size", block["size"])


def _segment_pass(
    segments: list[Any], resolver: StackResolver, layout: SnapshotLayout, options: AnalysisOptions
) -> _Held:
    legacy = layout is not SnapshotLayout.CURRENT
    tally = _Tally()
    reserved = allocated = pending = requested = free = waste = 0
    pending_blocks = live_blocks_total = blocks_total = 0
    unreleasable = unreleasable_segments = releasable = releasable_segments = 0
    expandable_free = private_free = largest_free = split_segments = expandable_segments = 0
    size_mismatch = False
    pools: dict[Pool, list[int]] = {}
    free_space: dict[tuple[Pool, int, tuple[int, int]], list[int]] = {}
    private: dict[tuple[int, int], list[int]] = {}
    top_blocks: list[tuple[int, int, int, int]] = []  # (size, -order, segment index, block index)
    pinned: list[tuple[int, int, SegmentInfo]] = []
    top_n = options.top_n
    order = 0
    tally_add = tally.add
    resolve = resolver.resolve
    for seg_index, segment in enumerate(segments):
        total = segment["total_size"]
        pool = Pool.SMALL if segment.get("segment_type") == "small" else Pool.LARGE
        stream = segment.get("stream", 0)
        pool_id_raw = segment.get("segment_pool_id", DEFAULT_POOL)
        pool_id = (pool_id_raw[0], pool_id_raw[1])
        is_private = pool_id != DEFAULT_POOL
        expandable = segment.get("is_expandable") is True
        seg_allocated = seg_active = seg_free = seg_largest = seg_live = 0
        blocks = segment["blocks"]
        block_sum = 0
        for block_index, block in enumerate(blocks):
            size = block["size"]
            block_sum += size
            state = block["state"]
            if state == "inactive":
                seg_free += size
                if size > seg_largest:
                    seg_largest = size
                key = (pool, stream, pool_id)
                slot = free_space.get(key)
                if slot is None:
                    free_space[key] = [size, 1, size]
                else:
                    slot[0] += size
                    slot[1] += 1
                    if size > slot[2]:
                        slot[2] = size
                continue
            seg_live += 1
            seg_active += size
            if legacy:
                frames, block_requested = _block_frames_and_requested(block, legacy)
            else:
                frames = block.get("frames")
                block_requested = block.get("requested_size", size)
            requested += block_requested
            if state == "active_allocated":
                seg_allocated += size
                waste += size - block_requested
            else:
                pending += size
                pending_blocks += 1
            tally_add(resolve(frames), size)
            order += 1
            if len(top_blocks) < top_n:
                heapq.heappush(top_blocks, (size, -order, seg_index, block_index))
            elif size > top_blocks[0][0]:
                heapq.heapreplace(top_blocks, (size, -order, seg_index, block_index))
        if block_sum != total:
            size_mismatch = True
        blocks_total += len(blocks)
        live_blocks_total += seg_live
        reserved += total
        allocated += seg_allocated
        free += seg_free
        if seg_largest > largest_free:
            largest_free = seg_largest
        if len(blocks) > 1:
            split_segments += 1
        if expandable:
            expandable_segments += 1
            expandable_free += seg_free
        elif seg_live:
            if seg_free:
                unreleasable += seg_free
                unreleasable_segments += 1
        else:
            releasable += seg_free
            releasable_segments += 1
        if is_private:
            private_free += seg_free
            slot = private.setdefault(pool_id, [0, 0, 0, 0])
            slot[0] += 1
            slot[1] += total
            slot[2] += seg_allocated
            slot[3] += seg_free
        pool_slot = pools.setdefault(pool, [0, 0, 0, 0, 0, 0])
        pool_slot[0] += 1
        pool_slot[1] += total
        pool_slot[2] += seg_allocated
        pool_slot[3] += seg_active
        pool_slot[4] += seg_free
        pool_slot[5] = max(pool_slot[5], seg_largest)
        if seg_live and seg_free and not expandable:
            info = SegmentInfo(
                address=segment.get("address", 0),
                total_size=total,
                allocated_bytes=seg_allocated,
                active_bytes=seg_active,
                free_bytes=seg_free,
                largest_free_block=seg_largest,
                blocks=len(blocks),
                live_blocks=seg_live,
                pool=pool,
                stream=stream,
                pool_id=pool_id,
                is_expandable=expandable,
            )
            pinned_entry = (seg_free, -seg_index, info)
            if len(pinned) < top_n:
                heapq.heappush(pinned, pinned_entry)
            elif pinned_entry[:2] > pinned[0][:2]:
                heapq.heapreplace(pinned, pinned_entry)

    state = MemoryState(
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        active_bytes=allocated + pending,
        requested_bytes=requested,
        pending_free_bytes=pending,
        pending_free_blocks=pending_blocks,
        free_bytes=free,
        unreleasable_free_bytes=unreleasable,
        unreleasable_segments=unreleasable_segments,
        releasable_free_bytes=releasable,
        releasable_segments=releasable_segments,
        expandable_free_bytes=expandable_free,
        private_pool_free_bytes=private_free,
        reserved_unallocated_bytes=reserved - allocated - private_free,
        internal_waste_bytes=waste,
        largest_free_block=largest_free,
        segments=len(segments),
        blocks=blocks_total,
        live_blocks=live_blocks_total,
        split_segments=split_segments,
        expandable_segments=expandable_segments,
        pools=tuple(
            PoolUsage(pool, *values)
            for pool, values in sorted(pools.items(), key=lambda item: item[0].value)
        ),
        free_space=tuple(
            FreeSpace(pool, stream, pool_id, *values)
            for (pool, stream, pool_id), values in sorted(
                free_space.items(), key=lambda item: (-item[1][2], item[0][0].value, item[0][1])
            )
        )[: max(top_n, 1) * 4],
        private_pools=tuple(
            PrivatePoolUsage(pool_id, *values) for pool_id, values in sorted(private.items())
        ),
    )
    blocks_info = []
    for size, _, seg_index, block_index in sorted(top_blocks, reverse=True):
        segment = segments[seg_index]
        block = segment["blocks"][block_index]
        frames, block_requested = _block_frames_and_requested(block, legacy)
        attribution = resolver.resolve(frames)
        blocks_info.append(
            BlockInfo(
                address=block.get("address", _block_address(segment, block_index)),
                size=size,
                requested_size=block_requested,
                state=BlockState.ALLOCATED
                if block["state"] == "active_allocated"
                else BlockState.PENDING_FREE,
                segment_address=segment.get("address", 0),
                pool=Pool.SMALL if segment.get("segment_type") == "small" else Pool.LARGE,
                stream=segment.get("stream", 0),
                site=attribution.site,
                category=attribution.category,
            )
        )
    return _Held(
        state=state,
        by_site=tally.by_site(top_n),
        by_category=tally.by_category(),
        top_blocks=tuple(blocks_info),
        pinned_segments=tuple(
            info for _, _, info in sorted(pinned, key=lambda item: item[:2], reverse=True)
        ),
        free_space={
            (fs.pool, fs.stream, fs.pool_id): fs
            for fs in (FreeSpace(p, s, i, *v) for (p, s, i), v in free_space.items())
        },
        size_mismatch=size_mismatch,
    )


def _block_address(segment: dict[str, Any], block_index: int) -> int:
    """Address of a block in layouts without ``address`` (blocks are contiguous, in order)."""
    address = segment.get("address", 0)
    for block in segment["blocks"][:block_index]:
        address += block["size"]
    return int(address)


# --------------------------------------------------------------------------------------------
# The failing request
# --------------------------------------------------------------------------------------------

_STATE_CHANGING = frozenset(
    {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    }
)


def _oom_event(
    path: str,
    device: int,
    trace: list[Any],
    index: int,
    held: _Held,
    resolver: StackResolver,
    at_snapshot: bool,
) -> OomEvent:
    entry = trace[index]
    size = entry.get("size")
    if type(size) is not int or size < 0:
        raise InputError(
            path,
            f"device_traces[{device}][{index}] (the oom entry) has no valid 'size'",
            "the file is corrupt",
        )
    stream = entry.get("stream", 0)
    stream = stream if type(stream) is int else 0
    device_free = entry.get("device_free")
    time_us = entry.get("time_us")
    frames = entry.get("frames")
    attribution = resolver.resolve(frames)
    pool = pool_for(size)
    usable = held.free_space.get((pool, stream, DEFAULT_POOL))
    largest = usable.largest_free_block if usable else 0
    return OomEvent(
        trace_index=index,
        time_us=time_us if type(time_us) is int else None,
        request_bytes=size,
        alloc_size_bytes=allocation_size(size),
        pool=pool,
        stream=stream,
        device_free_bytes=device_free if type(device_free) is int else None,
        site=attribution.site,
        category=attribution.category,
        snapshot_at_oom=at_snapshot,
        largest_free_block=largest,
        free_bytes=usable.free_bytes if usable else 0,
        fits_largest_free_block=largest >= size,
    )


# --------------------------------------------------------------------------------------------
# Pass 2: the history
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Replay:
    """Raw results of one replay, before the baseline is known (values relative to the start)."""

    allocs: int
    frees: int
    segment_allocs: int
    segment_frees: int
    ooms: int
    unmatched_frees: int
    peak_active: tuple[int, int, int]  # (index, relative active, relative reserved)
    peak_reserved: tuple[int, int, int]
    end_active: int
    end_reserved: int
    samples: list[tuple[int, int, int]]  # (index, relative active, relative reserved)
    at_boundaries: list[tuple[int, int]]  # (relative active, relative reserved) at each boundary
    # At the last oom entry: (index, active, reserved, low active, low index, low reserved).
    last_oom: tuple[int, int, int, int, int, int] | None
    changed_after_oom: bool  # any allocator event after the last oom
    low: tuple[int, int]  # (relative active, index) over the whole trace
    reserved_at_low: int
    live: dict[int, int]  # address -> index << 56 | rounded size of the alloc, at the end
    live_changed_after_oom: bool
    pattern: dict[tuple[int, int], array[int]] | None


@dataclass(slots=True)
class _History:
    timeline: Timeline
    growth: Growth | None
    iteration_growth: Growth | None
    iterations: Iterations | None
    leak: Leak | None
    oom_index: int | None
    changed_after_oom: bool


def _analyze_history(
    path: str,
    device: int,
    trace: list[Any],
    held: _Held,
    annotations: list[tuple[int, str]],
    resolver: StackResolver,
    divisions: tuple[int, ...],
    options: AnalysisOptions,
) -> _History:
    rounder = _rounder(divisions)
    marker, boundaries = _annotation_boundaries(trace, annotations)
    try:
        replay = _replay(
            trace,
            rounder,
            boundaries,
            options.timeline_points,
            collect_pattern=not boundaries,
        )
    except (KeyError, TypeError, AttributeError, ValueError, IndexError):
        raise _malformed_entry(path, device, trace) from None
    source = "annotations"
    at_boundaries = replay.at_boundaries
    if not boundaries and replay.pattern:
        found = _pattern_boundaries(replay.pattern, replay.samples)
        if found is not None:
            source = "alloc_pattern"
            marker, boundaries, at_boundaries = found

    base_active = held.state.active_bytes - replay.end_active
    base_reserved = held.state.reserved_bytes - replay.end_reserved

    def point(index: int, active: int, reserved: int) -> TimelinePoint:
        return TimelinePoint(
            index, _time_of(trace, index), base_active + active, base_reserved + reserved
        )

    samples = tuple(point(index, active, reserved) for index, active, reserved in replay.samples)
    first_time = trace[0].get("time_us") if trace else None
    last_time = trace[-1].get("time_us") if trace else None
    end_index = len(trace) - 1
    timeline = Timeline(
        entries=len(trace),
        first_time_us=first_time if type(first_time) is int else None,
        last_time_us=last_time if type(last_time) is int else None,
        allocs=replay.allocs,
        frees=replay.frees,
        segment_allocs=replay.segment_allocs,
        segment_frees=replay.segment_frees,
        ooms=replay.ooms,
        unmatched_frees=replay.unmatched_frees,
        baseline_active_bytes=base_active,
        baseline_reserved_bytes=base_reserved,
        peak_active=point(*replay.peak_active),
        peak_reserved=point(*replay.peak_reserved),
        end=point(end_index, replay.end_active, replay.end_reserved),
        samples=samples,
    )

    live = replay.live
    oom_index = replay.last_oom[0] if replay.last_oom is not None else None
    if oom_index is not None and replay.live_changed_after_oom:
        live = _live_at(trace, oom_index, rounder)
    if replay.last_oom is not None:
        oom_index, end_active, end_reserved, low_active, low_index, low_reserved = replay.last_oom
        end_point = point(oom_index, end_active, end_reserved)
    else:
        low_active, low_index = replay.low
        low_reserved = replay.reserved_at_low
        end_point = timeline.end
    low_point = (
        point(low_index, low_active, low_reserved)
        if low_index >= 0
        else TimelinePoint(-1, timeline.first_time_us, base_active + low_active, base_reserved)
    )
    # Every window below starts at the lowest point or at an iteration boundary: attribute
    # the allocations still live at the end of the window once, from the earliest of them.
    earliest = min([low_index + 1, *boundaries[:1]])
    survivors = _Survivors(trace, live, earliest, resolver)
    growth = _growth("since_lowest_point", low_point, end_point, low_index + 1, survivors, options)

    iterations = leak = iteration_growth = None
    at_boundary_active = [value for value, _ in at_boundaries]
    if len(boundaries) >= 2:
        iterations = _iterations(
            source, marker, trace, boundaries, at_boundary_active, base_active, options
        )
        leak = _leak(boundaries, at_boundary_active, survivors, options)
    if boundaries:
        position = bisect_right(boundaries, end_point.index) - 1
        if position >= 0:
            start_index = boundaries[position]
            start_point = point(start_index, *at_boundaries[position])
            iteration_growth = _growth(
                "last_iteration", start_point, end_point, start_index, survivors, options
            )
    return _History(
        timeline,
        growth,
        iteration_growth,
        iterations,
        leak,
        oom_index,
        replay.changed_after_oom,
    )


def _time_of(trace: list[Any], index: int) -> int | None:
    value = trace[index].get("time_us") if 0 <= index < len(trace) else None
    return value if type(value) is int else None


def _rounder(divisions: tuple[int, ...]) -> Callable[[int], int] | None:
    """None when plain 512-byte rounding applies (the replay then inlines it)."""
    if any(count > 1 for count in divisions):
        return lambda size: round_size(size, divisions)
    return None


_PACK_SHIFT = 56
_SIZE_MASK = (1 << _PACK_SHIFT) - 1
"""Live allocations are stored as ``index << 56 | rounded size``: one int per address, so a
free never has to go back to its alloc entry (a cache miss per event on a large trace)."""


def _replay(
    trace: list[Any],
    rounder: Callable[[int], int] | None,
    boundaries: list[int],
    points: int,
    *,
    collect_pattern: bool,
) -> _Replay:
    """One pass over the trace, in stretches between the points where something is recorded
    (timeline samples, iteration boundaries), so that the per-event loop does only the
    bookkeeping of the event itself.  Kept flat and local-variable heavy: it runs per event.
    """
    n = len(trace)
    live: dict[int, int] = {}
    live_pop = live.pop
    active = reserved = 0
    peak_a = peak_r = 0
    peak_a_i = peak_r_i = -1
    peak_a_r = peak_r_a = 0
    low_a, low_i = 0, -1
    low_r = 0
    allocs = frees = seg_allocs = seg_frees = ooms = unmatched = 0
    step = max(1, -(-n // max(points, 1)))
    sample_ends = set(range(step, n, step))
    stops = sorted(sample_ends.union(index for index in boundaries if 0 <= index < n))
    stops.append(n)
    boundary_count: dict[int, int] = {}
    for index in boundaries:
        boundary_count[index] = boundary_count.get(index, 0) + 1
    samples: list[tuple[int, int, int]] = []
    at_boundaries: list[tuple[int, int]] = []
    pattern: dict[tuple[int, int], array[int]] | None = {} if collect_pattern else None
    last_oom: tuple[int, int, int, int, int, int] | None = None
    last_change = last_live_change = -1
    start = 0
    new_stretch = True
    stretch_max = stretch_i = stretch_r = 0
    for stop in stops:
        at_boundaries.extend([(active, reserved)] * boundary_count.get(start, 0))
        if new_stretch:
            stretch_max = active
            stretch_i = max(start - 1, 0)
            stretch_r = reserved
        for i, entry in enumerate(trace[start:stop], start):
            action = entry["action"]
            if action == "alloc":
                size = entry["size"]
                if rounder is None:
                    size = 512 if size < 512 else (size + 511) & -512
                else:
                    size = rounder(size)
                if size > _SIZE_MASK:
                    raise ValueError("allocation size out of range")
                if pattern is not None and size >= 1048576:
                    frames = entry.get("frames")
                    signature = (size, len(frames) if type(frames) is list else -1)
                    series = pattern.get(signature)
                    if series is None:
                        series = pattern[signature] = array("q")
                    series.append(i)
                    series.append(active)
                    series.append(reserved)
                active += size
                live[entry["addr"]] = (i << _PACK_SHIFT) | size
                allocs += 1
                last_change = last_live_change = i
                if active > stretch_max:
                    stretch_max = active
                    stretch_i = i
                    stretch_r = reserved
                    if active > peak_a:
                        peak_a = active
                        peak_a_i = i
                        peak_a_r = reserved
            elif action == "free_completed":
                packed = live_pop(entry["addr"], None)
                if packed is None:
                    unmatched += 1
                    size = entry["size"]
                    size = (
                        (512 if size < 512 else (size + 511) & -512)
                        if rounder is None
                        else rounder(size)
                    )
                else:
                    size = packed & _SIZE_MASK
                active -= size
                frees += 1
                last_change = last_live_change = i
                if active < low_a:
                    low_a = active
                    low_i = i
                    low_r = reserved
            elif action == "free_requested":
                last_change = i
            elif action == "segment_alloc" or action == "segment_map":
                reserved += entry["size"]
                seg_allocs += 1
                last_change = i
                if reserved > peak_r:
                    peak_r = reserved
                    peak_r_i = i
                    peak_r_a = active
            elif action == "segment_free" or action == "segment_unmap":
                reserved -= entry["size"]
                seg_frees += 1
                last_change = i
            elif action == "oom":
                ooms += 1
                last_oom = (i, active, reserved, low_a, low_i, low_r)
        new_stretch = stop in sample_ends or stop == n
        if new_stretch and stop > 0:
            samples.append((stretch_i, stretch_max, stretch_r))
        start = stop
    while len(at_boundaries) < len(boundaries):
        at_boundaries.append((active, reserved))
    return _Replay(
        allocs=allocs,
        frees=frees,
        segment_allocs=seg_allocs,
        segment_frees=seg_frees,
        ooms=ooms,
        unmatched_frees=unmatched,
        peak_active=(peak_a_i, peak_a, peak_a_r),
        peak_reserved=(peak_r_i, peak_r_a, peak_r),
        end_active=active,
        end_reserved=reserved,
        samples=samples,
        at_boundaries=at_boundaries,
        last_oom=last_oom,
        low=(low_a, low_i),
        reserved_at_low=low_r,
        live=live,
        live_changed_after_oom=last_oom is not None and last_live_change > last_oom[0],
        changed_after_oom=last_oom is not None and last_change > last_oom[0],
        pattern=pattern,
    )


def _live_at(trace: list[Any], stop: int, rounder: Callable[[int], int] | None) -> dict[int, int]:
    """Live allocations (address -> packed alloc index and size) just before entry ``stop``."""
    live: dict[int, int] = {}
    for i in range(stop):
        entry = trace[i]
        action = entry["action"]
        if action == "alloc":
            size = entry["size"]
            size = (
                (512 if size < 512 else (size + 511) & -512) if rounder is None else rounder(size)
            )
            live[entry["addr"]] = (i << _PACK_SHIFT) | min(size, _SIZE_MASK)
        elif action == "free_completed":
            live.pop(entry["addr"], None)
    return live


def _malformed_entry(path: str, device: int, trace: list[Any]) -> InputError:
    """Find the first trace entry the replay could not read and describe it."""
    for index, entry in enumerate(trace):
        where = f"device_traces[{device}][{index}]"
        if type(entry) is not dict:
            return InputError(
                path,
                f"{where} is a {type(entry).__name__}, not a dict",
                "the file is corrupt or not a torch snapshot",
            )
        action = entry.get("action")
        if type(action) is not str:
            return InputError(
                path,
                f"{where} has no 'action' string",
                "the file is corrupt or not a torch snapshot",
            )
        needed = (
            ("addr", "size")
            if action in _STATE_CHANGING and action != "free_requested"
            else ("addr",)
            if action == "free_requested"
            else ()
        )
        for key in needed:
            value = entry.get(key)
            if type(value) is not int:
                what = "is missing" if value is None else f"is a {type(value).__name__}, not an int"
                return InputError(
                    path, f"{where}.{key} {what}", "the file is corrupt or not a torch snapshot"
                )
            if key == "size" and not 0 <= value <= _SIZE_MASK:
                return InputError(
                    path, f"{where}.size is out of range ({value})", "the file is corrupt"
                )
    return InputError(
        path,
        f"device_traces[{device}] could not be read",
        "the file is corrupt or not a torch snapshot",
    )


def _annotation_boundaries(
    trace: list[Any], annotations: list[tuple[int, str]]
) -> tuple[str, list[int]]:
    """Iteration starts from START annotations: (marker name, sorted trace indices).

    Only markers that come once per training step count: ``Optimizer.step#<Class>.step``
    (torch's optimizers record it by themselves) and the profiler's ``ProfilerStep#<n>``.  Other
    annotations are ``record_function`` ranges such as ``nccl:all_reduce``, which come many
    times per step or only at start-up.
    """
    if not annotations or not trace:
        return "", []
    first_time, last_time = trace[0].get("time_us"), trace[-1].get("time_us")
    if type(first_time) is not int or type(last_time) is not int:
        return "", []
    by_name: dict[str, list[int]] = {}
    for time_us, name in annotations:
        if first_time <= time_us <= last_time:
            by_name.setdefault(_marker_name(name), []).append(time_us)
    candidates = [
        (name, times)
        for name, times in by_name.items()
        if len(times) >= 2 and name.startswith(_STEP_MARKERS)
    ]
    if not candidates:
        return "", []

    def preference(item: tuple[str, list[int]]) -> tuple[int, int, str]:
        name, times = item
        return (0 if name.startswith("Optimizer.step") else 1, -len(times), name)

    marker, times = min(candidates, key=preference)
    times.sort()
    indices = []
    for time_us in times:
        index = bisect_left(trace, time_us, key=_entry_time)
        if index < len(trace):
            indices.append(index)
    return marker, indices


_STEP_MARKERS = ("Optimizer.step#", "ProfilerStep")


def _entry_time(entry: Any) -> int:
    value = entry.get("time_us") if type(entry) is dict else None
    return value if type(value) is int else 0


def _marker_name(name: str) -> str:
    """``ProfilerStep#12`` -> ``ProfilerStep``; ``Optimizer.step#Adam.step`` stays."""
    head, sep, tail = name.rpartition("#")
    return head if sep and tail.isdigit() else name


def _pattern_boundaries(
    pattern: dict[tuple[int, int], array[int]],
    samples: list[tuple[int, int, int]],
) -> tuple[str, list[int], list[tuple[int, int]]] | None:
    """Iterations from an allocation (size, stack depth) recurring at a regular interval.

    Candidates: signatures with a stack, seen at least 4 times, with gaps varying by under
    15 %; the longest period is tried first (per-layer allocations repeat faster than
    steps).  A candidate counts only if the live bytes rise *and fall back* within its
    periods, as a training step's activations do: per-layer periods inside one forward or
    backward pass (memory climbing layer after layer) would otherwise look like a leak.
    """
    candidates = []
    for signature, series in pattern.items():
        count = len(series) // 3
        if count < 4 or signature[1] <= 0:
            continue
        starts = series[0::3]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        mean = sum(gaps) / len(gaps)
        if mean <= 0 or statistics.pstdev(gaps) / mean > 0.15:
            continue
        candidates.append((int(statistics.median(gaps)), count, signature))
    for _, _, signature in sorted(candidates, reverse=True):
        series = pattern[signature]
        indices = list(series[0::3])
        values = list(zip(series[1::3], series[2::3], strict=True))
        if _rises_and_falls(indices, [active for active, _ in values], samples):
            size, depth = signature
            return f"alloc of {size} bytes, stack depth {depth}", indices, values
    return None


def _rises_and_falls(
    boundaries: list[int], at_boundaries: list[int], samples: list[tuple[int, int, int]]
) -> bool:
    """Whether, in the typical period, live bytes climb above the start and come back down
    at least half way before the next period (judged on the timeline's stretch maxima)."""
    sample_indices = [index for index, _, _ in samples]
    rises = []
    falls = []
    for period in range(len(boundaries) - 1):
        first = bisect_left(sample_indices, boundaries[period])
        last = bisect_left(sample_indices, boundaries[period + 1])
        if first >= last:
            return False  # a period shorter than the sampling step cannot be judged
        top = max(active for _, active, _ in samples[first:last])
        rises.append(top - at_boundaries[period])
        falls.append(top - at_boundaries[period + 1])
    rise, fall = statistics.median(rises), statistics.median(falls)
    return rise > 0 and fall >= rise / 2


def _iterations(
    source: str,
    marker: str,
    trace: list[Any],
    boundaries: list[int],
    at_boundaries: list[int],
    base_active: int,
    options: AnalysisOptions,
) -> Iterations:
    gaps = [b - a for a, b in zip(boundaries, boundaries[1:], strict=False)]
    times = [_time_of(trace, index) for index in boundaries]
    durations = [
        b - a for a, b in zip(times, times[1:], strict=False) if a is not None and b is not None
    ]
    keep = options.max_boundaries
    return Iterations(
        source=source,
        marker=marker,
        complete=len(boundaries) - 1,
        median_entries=int(statistics.median(gaps)) if gaps else 0,
        median_duration_us=int(statistics.median(durations)) if durations else None,
        boundary_indices=tuple(boundaries[-keep:]),
        active_at_boundaries=tuple(base_active + value for value in at_boundaries[-keep:]),
    )


class _Survivors:
    """Allocations still live at the end of the window, sorted by index, each attributed once."""

    def __init__(
        self, trace: list[Any], live: dict[int, int], first_index: int, resolver: StackResolver
    ) -> None:
        first = max(first_index, 0) << _PACK_SHIFT
        packed = sorted(value for value in live.values() if value >= first)
        self.indices = [value >> _PACK_SHIFT for value in packed]
        self.sizes = [value & _SIZE_MASK for value in packed]
        resolve = resolver.resolve
        attributions = []
        for index in self.indices:
            frames = trace[index].get("frames")
            attributions.append(resolve(frames))
        self.attributions = attributions

    def between(self, first_index: int, end_index: int) -> range:
        """Positions of the survivors allocated at indices ``first_index..end_index``."""
        return range(bisect_left(self.indices, first_index), bisect_right(self.indices, end_index))


def _growth(
    basis: str,
    start: TimelinePoint,
    end: TimelinePoint,
    first_index: int,
    survivors: _Survivors,
    options: AnalysisOptions,
) -> Growth:
    tally = _Tally()
    add = tally.add
    sizes, attributions = survivors.sizes, survivors.attributions
    for position in survivors.between(first_index, end.index):
        add(attributions[position], sizes[position])
    return Growth(
        basis=basis,
        start=start,
        end=end,
        net_bytes=end.active_bytes - start.active_bytes,
        live_new_bytes=tally.total(),
        by_site=tally.by_site(options.top_n),
        by_category=tally.by_category(),
    )


def _leak(
    boundaries: list[int],
    at_boundaries: list[int],
    survivors: _Survivors,
    options: AnalysisOptions,
) -> Leak | None:
    complete = len(boundaries) - 1
    if complete < options.min_leak_iterations:
        return None
    increments = [b - a for a, b in zip(at_boundaries, at_boundaries[1:], strict=False)]
    growing = sum(1 for value in increments if value > 0) / len(increments)
    median = int(statistics.median(increments))
    if growing < options.leak_growing_fraction or median < options.min_leak_bytes_per_iteration:
        return None
    per_site: dict[int, list[Any]] = {}  # id(attribution) -> [attribution, bytes, iterations]
    indices, sizes, attributions = survivors.indices, survivors.sizes, survivors.attributions
    iteration = 0
    for position in survivors.between(boundaries[0], boundaries[-1] - 1):
        index = indices[position]
        while boundaries[iteration + 1] <= index:  # survivors are sorted: walk the boundaries
            iteration += 1
        attribution = attributions[position]
        slot = per_site.get(id(attribution))
        if slot is None:
            per_site[id(attribution)] = [attribution, sizes[position], {iteration}]
        else:
            slot[1] += sizes[position]
            slot[2].add(iteration)
    merged: dict[CallSite | None, list[Any]] = {}
    for attribution, size, iterations in per_site.values():
        slot = merged.setdefault(attribution.site, [attribution.category, 0, set()])
        slot[1] += size
        slot[2] |= iterations
    needed = max(2, int(options.leak_growing_fraction * complete + 0.999))
    sites = [
        LeakSite(
            site=site,
            category=category,
            bytes_per_iteration=size // complete,
            iterations_with_survivors=len(iterations),
            total_bytes=size,
        )
        for site, (category, size, iterations) in merged.items()
        if len(iterations) >= needed
    ]
    if not sites:
        return None  # growth no call site explains is no evidence of a leak
    sites.sort(key=lambda item: (-item.total_bytes, _site_key(item.site)))
    return Leak(
        bytes_per_iteration=median,
        iterations=complete,
        total_growth_bytes=at_boundaries[-1] - at_boundaries[0],
        growing_fraction=growing,
        increments=tuple(increments[-options.max_boundaries :]),
        sites=tuple(sites[: options.top_n]),
    )


__all__ = [
    "NOTES",
    "AnalysisOptions",
    "allocation_size",
    "analyze_snapshot",
    "division_table",
    "pool_for",
    "round_size",
]
