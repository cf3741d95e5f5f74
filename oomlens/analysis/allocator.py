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

Modules: this one (the entry point, pass 1 over segments and blocks, the failing request),
:mod:`oomlens.analysis.allocator_history` (pass 2 over the trace) and
:mod:`oomlens.analysis.allocator_sizes` (the allocator's size arithmetic).
"""

from __future__ import annotations

import heapq
from typing import Any

from oomlens.analysis.allocator_common import (
    STATE_CHANGING,
    AllocatorOptions,
    Held,
    Tally,
    allocation_size,
    division_table,
    pool_for,
    round_size,
)
from oomlens.analysis.allocator_history import STEP_MARKERS, analyze_history
from oomlens.analysis.stacks import NO_PYTHON_STACK, NO_STACK, StackResolver
from oomlens.errors import InputError
from oomlens.facts.snapshot import (
    BlockInfo,
    BlockState,
    DeviceAnalysis,
    FreeSpace,
    HistoryMode,
    MemoryState,
    OomEntry,
    Pool,
    PoolUsage,
    PrivatePoolUsage,
    SegmentInfo,
    Snapshot,
    SnapshotAnalysis,
    SnapshotLayout,
    StackDepth,
)
from oomlens.gcpause import gc_paused

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


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def analyze_snapshot(
    snapshot: Snapshot, options: AllocatorOptions | None = None
) -> SnapshotAnalysis:
    """Analyze every device of ``snapshot``; see the module docstring.

    Raises ``InputError`` (naming the snapshot file) when a trace entry is malformed.
    """
    options = options or AllocatorOptions()
    python_only = snapshot.stacks is StackDepth.PYTHON
    resolver = StackResolver(NO_PYTHON_STACK if python_only else NO_STACK)
    divisions = division_table(snapshot.allocator_settings)
    raw = snapshot.raw
    devices = []
    # The collector paused for the whole walk: the tuples and lists made per block and per
    # event would otherwise trigger collections that walk the snapshot's millions of objects
    # (measured: 2.2 s of 5.3 s on a 112 MB corpus-shaped snapshot, in the grouping below).
    with gc_paused():
        segments_by_device: dict[int, list[Any]] = {}
        for segment in raw.segments:
            segments_by_device.setdefault(segment["device"], []).append(segment)
        annotations = _annotations_by_device(raw.annotations)
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
    return SnapshotAnalysis(
        source=snapshot.source,
        layout=snapshot.layout,
        history=snapshot.history,
        stacks=snapshot.stacks,
        allocator_settings=snapshot.allocator_settings,
        devices=tuple(devices),
    )


def _annotations_by_device(annotations: list[Any]) -> dict[int, list[tuple[int, str]]]:
    """START annotations per device as (time_us, name), skipping malformed records.

    Only names that can mark an iteration (``STEP_MARKERS``) are kept, the only ones
    :func:`_annotation_boundaries` uses: a long recording holds millions of other
    ``record_function`` ranges (``nccl:*``): keeping them cost 1.1 s of the 8.5 s of CPU the
    analysis of a 1.1 GB corpus-shaped snapshot takes (``bench/snapshot_bench.py``).
    """
    found: dict[int, list[tuple[int, str]]] = {}
    for record in annotations:
        if type(record) is not dict:
            continue
        name = record.get("name")
        if type(name) is not str or not name.startswith(STEP_MARKERS):
            continue
        if record.get("stage") != "START":
            continue
        device, time_us = record.get("device"), record.get("time_us")
        if type(device) is int and type(time_us) is int:
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
    options: AllocatorOptions,
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
        found = analyze_history(
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
            type(later) is dict and later.get("action") in STATE_CHANGING
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
    segments: list[Any], resolver: StackResolver, layout: SnapshotLayout, options: AllocatorOptions
) -> Held:
    legacy = layout is not SnapshotLayout.CURRENT
    tally = Tally()
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
    return Held(
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


def _oom_event(
    path: str,
    device: int,
    trace: list[Any],
    index: int,
    held: Held,
    resolver: StackResolver,
    at_snapshot: bool,
) -> OomEntry:
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
    return OomEntry(
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


__all__ = [
    "NOTES",
    "AllocatorOptions",
    "allocation_size",
    "analyze_snapshot",
    "division_table",
    "pool_for",
    "round_size",
]
