"""Pass 2 of the allocator analytics: a device's trace replayed event by event, for the timeline
(live and reserved bytes, the peaks, what grew before the OOM), the iterations (annotations, else
a recurring allocation) and a leak (live bytes growing about the same every iteration, with the
call sites whose allocations survive)."""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from oomlens.analysis.allocator_common import (
    STATE_CHANGING,
    AllocatorOptions,
    Held,
    Tally,
    round_size,
    site_key,
)
from oomlens.analysis.stacks import StackResolver
from oomlens.errors import InputError
from oomlens.facts.snapshot import (
    CallSite,
    Growth,
    Iterations,
    Leak,
    LeakSite,
    Timeline,
    TimelinePoint,
)


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


def analyze_history(
    path: str,
    device: int,
    trace: list[Any],
    held: Held,
    annotations: list[tuple[int, str]],
    resolver: StackResolver,
    divisions: tuple[int, ...],
    options: AllocatorOptions,
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
            if action in STATE_CHANGING and action != "free_requested"
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
        if len(times) >= 2 and name.startswith(STEP_MARKERS)
    ]
    if not candidates:
        return "", []

    def preference(item: tuple[str, list[int]]) -> tuple[int, int, str]:
        name, times = item
        return (0 if name.startswith("Optimizer.step") else 1, -len(times), name)

    marker, times = min(candidates, key=preference)
    times.sort()
    try:
        # Every entry holds an int time_us here (the layout check refuses any other type):
        # the key runs at C speed, some 20 entries per boundary, thousands of boundaries.
        indices = _trace_positions(trace, times, itemgetter("time_us"))
    except (KeyError, TypeError):  # an entry without time_us: read as 0, as torch 2.0's
        indices = _trace_positions(trace, times, _entry_time)
    return marker, indices


def _trace_positions(trace: list[Any], times: list[int], key: Callable[[Any], int]) -> list[int]:
    """Where each of ``times`` falls in ``trace`` (sorted by time), past its end left out."""
    indices = []
    for time_us in times:
        index = bisect_left(trace, time_us, key=key)
        if index < len(trace):
            indices.append(index)
    return indices


STEP_MARKERS = ("Optimizer.step#", "ProfilerStep")


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
    options: AllocatorOptions,
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
    options: AllocatorOptions,
) -> Growth:
    tally = Tally()
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
    options: AllocatorOptions,
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
    sites.sort(key=lambda item: (-item.total_bytes, site_key(item.site)))
    return Leak(
        bytes_per_iteration=median,
        iterations=complete,
        total_growth_bytes=at_boundaries[-1] - at_boundaries[0],
        growing_fraction=growing,
        increments=tuple(increments[-options.max_boundaries :]),
        sites=tuple(sites[: options.top_n]),
    )
