"""Rewind a snapshot's segments through its trace to the state at the trace's first event.

The snapshot's ``segments`` are the allocator at the end of the recording; its trace holds the
events that led there.  Walking the trace backwards and undoing each event, as torch's
MemoryViz does for its allocator-state timeline, gives what the allocator held just before the
first recorded event:

* ``alloc`` / ``free_completed``: the block was not / was still in use before it;
* ``segment_alloc`` / ``segment_free``: the segment did not / did exist before it;
* ``segment_map`` / ``segment_unmap``: the pages were unmapped / mapped before it.

A block still in use at the start but freed during the trace is known only by its address and
requested size.  Its block size is inferred from where the next block in use (or the segment's
end) begins: in the large pool a free remainder of 1 MiB or less is never split off
(``should_split``), so a gap that small after the block belongs to it; a larger gap is a free
block after it, except for an oversize block (``max_split_size``), which is always its whole
segment.  Small-pool and expandable blocks are always split to their rounded size.

When the first event is the process' first (nothing reserved at the start), the trace covers the
whole run; otherwise the replay starts from the layout the recorded setting left behind, and the
report says how much was already reserved and in use.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MiB = 1024**2
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
DEFAULT_POOL = (0, 0)


@dataclass(slots=True)
class StartSegment:
    """A non-expandable segment at the start, with its blocks in use ``(addr, size, requested)``."""

    addr: int
    size: int
    stream: int
    small: bool
    live: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class StartReservation:
    """An expandable segment at the start: its mapped ranges and their blocks in use."""

    base: int
    stream: int
    small: bool
    mapped: list[tuple[int, int]] = field(default_factory=list)
    live: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class StartState:
    """What the allocator held before the trace's first event (see the module docstring).

    ``opaque_bytes`` are private-pool segments (CUDA graphs), reserved but not modelled.
    ``inferred_sizes`` counts blocks whose size had to be inferred; ``unplaced`` blocks in use
    that no segment at the start contains (a trace the rewind cannot explain).
    """

    segments: list[StartSegment]
    reservations: list[StartReservation]
    opaque_bytes: int = 0
    inferred_sizes: int = 0
    unplaced: int = 0

    @property
    def reserved(self) -> int:
        return (
            sum(segment.size for segment in self.segments)
            + sum(size for reservation in self.reservations for _, size in reservation.mapped)
            + self.opaque_bytes
        )

    @property
    def live_bytes(self) -> int:
        return sum(size for segment in self.segments for _, size, _ in segment.live) + sum(
            size for reservation in self.reservations for _, size, _ in reservation.live
        )

    @property
    def live_blocks(self) -> int:
        return sum(len(segment.live) for segment in self.segments) + sum(
            len(reservation.live) for reservation in self.reservations
        )

    @property
    def empty(self) -> bool:
        return self.reserved == 0 and self.live_blocks == 0


class _Ranges:
    """Disjoint address ranges (mapped pages of one expandable segment), merged when adjacent."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}

    def add(self, addr: int, size: int) -> None:
        end = addr + size
        index = bisect_right(self.starts, addr)
        if index > 0 and self.ends[self.starts[index - 1]] >= addr:
            index -= 1
            addr = self.starts[index]
            end = max(end, self.ends[addr])
        while index < len(self.starts) and self.starts[index] <= end:
            start = self.starts.pop(index)
            end = max(end, self.ends.pop(start))
        self.ends.pop(addr, None)
        self.starts.insert(index, addr)
        self.ends[addr] = end

    def remove(self, addr: int, size: int) -> None:
        end = addr + size
        index = bisect_right(self.starts, addr) - 1
        if index < 0:
            return
        start = self.starts[index]
        stop = self.ends[start]
        if stop <= addr:
            return
        del self.starts[index]
        del self.ends[start]
        pieces = [(start, addr), (end, stop)]
        for piece_start, piece_end in pieces:
            if piece_end > piece_start:
                self.add(piece_start, piece_end - piece_start)

    def contains(self, addr: int) -> bool:
        index = bisect_right(self.starts, addr) - 1
        return index >= 0 and self.ends[self.starts[index]] > addr

    def items(self) -> list[tuple[int, int]]:
        return [(start, self.ends[start] - start) for start in self.starts]


def _expandable_pool(size: int) -> bool:
    """Whether a ``segment_map`` of ``size`` bytes was the small pool's (always one 2 MiB page)."""
    return size == K_SMALL_BUFFER


def rewind(
    segments: list[Any],
    trace: list[Any],
    device: int,
    *,
    round_size: Callable[[int], int],
    max_split_size: int | None,
) -> StartState:
    """The allocator state before ``trace[0]``; see the module docstring.

    ``segments`` are the snapshot's (every device; only ``device``'s are used); ``round_size``
    is the recorded setting's rounding, ``max_split_size`` its oversize threshold.
    """
    plain: dict[int, list[Any]] = {}  # addr -> [size, stream, small]
    ranges: dict[tuple[int, bool], _Ranges] = {}
    live: dict[int, list[Any]] = {}  # addr -> [size or None, requested, stream]
    opaque = 0
    for segment in segments:
        if segment.get("device", device) != device:
            continue
        size = segment["total_size"]
        pool_id = tuple(segment.get("segment_pool_id", DEFAULT_POOL))
        if pool_id != DEFAULT_POOL:
            opaque += size
            continue
        addr = segment.get("address", 0)
        stream = segment.get("stream", 0)
        small = segment.get("segment_type", "large") == "small"
        if segment.get("is_expandable"):
            ranges.setdefault((stream, small), _Ranges()).add(addr, size)
        else:
            plain[addr] = [size, stream, small]
        cursor = addr
        for block in segment["blocks"]:
            block_addr = block.get("address", cursor)
            cursor = block_addr + block["size"]
            if block["state"] != "inactive":
                requested = block.get("requested_size", block["size"])
                live[block_addr] = [block["size"], requested, stream]

    known = _anchors(ranges, trace)
    anchors = _AnchorIndex(known)
    for entry in reversed(trace):
        action = entry["action"]
        if action == "alloc":
            live.pop(entry["addr"], None)
        elif action == "free_completed":
            addr = entry["addr"]
            if addr not in live:
                live[addr] = [None, entry["size"], entry["stream"]]
        elif action == "segment_alloc":
            plain.pop(entry["addr"], None)
        elif action == "segment_free":
            size = entry["size"]
            plain[entry["addr"]] = [size, entry["stream"], size <= K_SMALL_BUFFER]
        elif action == "segment_map":
            key = _owner(ranges, anchors, entry["addr"], entry["stream"], entry["size"])
            ranges.setdefault(key, _Ranges()).remove(entry["addr"], entry["size"])
        elif action == "segment_unmap":
            key = _owner(ranges, anchors, entry["addr"], entry["stream"], entry["size"])
            ranges.setdefault(key, _Ranges()).add(entry["addr"], entry["size"])

    state = StartState(segments=[], reservations=[], opaque_bytes=opaque)
    by_addr = sorted(plain)
    start_segments = {
        addr: StartSegment(addr, size, stream, small)
        for addr, (size, stream, small) in plain.items()
    }
    reservations: dict[tuple[int, bool], StartReservation] = {}
    for key, mapped in ranges.items():
        items = mapped.items()
        if not items:
            continue
        base = min([start for start, _ in items] + known.get(key, []))
        reservations[key] = StartReservation(base, key[0], key[1], items)
    for addr, (size, requested, stream) in live.items():
        index = bisect_right(by_addr, addr) - 1
        if index >= 0:
            segment = start_segments[by_addr[index]]
            if addr < segment.addr + segment.size:
                segment.live.append((addr, size if size is not None else -1, requested))
                continue
        owner = next(
            (
                reservation
                for (res_stream, _), reservation in reservations.items()
                if res_stream == stream and _inside(reservation.mapped, addr)
            ),
            None,
        )
        if owner is not None:
            owner.live.append((addr, size if size is not None else -1, requested))
        else:
            state.unplaced += 1
    for segment in start_segments.values():
        state.inferred_sizes += _infer_sizes(
            segment.live,
            segment.addr + segment.size,
            segment.small,
            round_size,
            max_split_size,
        )
        state.segments.append(segment)
    for reservation in reservations.values():
        for start, size in reservation.mapped:
            inside = [item for item in reservation.live if start <= item[0] < start + size]
            state.inferred_sizes += _infer_sizes(inside, start + size, True, round_size, None)
            rest = [item for item in reservation.live if not start <= item[0] < start + size]
            reservation.live = rest + inside
        state.reservations.append(reservation)
    state.segments.sort(key=lambda segment: segment.addr)
    return state


def _inside(mapped: list[tuple[int, int]], addr: int) -> bool:
    return any(start <= addr < start + size for start, size in mapped)


def _anchors(
    ranges: dict[tuple[int, bool], _Ranges], trace: list[Any]
) -> dict[tuple[int, bool], list[int]]:
    """Addresses known to belong to each expandable (stream, pool): mapped ranges at the end and
    every ``segment_map`` (a 2 MiB map is the small pool's, larger ones the large pool's)."""
    anchors: dict[tuple[int, bool], list[int]] = {}
    for key, mapped in ranges.items():
        anchors.setdefault(key, []).extend(start for start, _ in mapped.items())
    for entry in trace:
        if entry["action"] == "segment_map":
            key = (entry["stream"], _expandable_pool(entry["size"]))
            anchors.setdefault(key, []).append(entry["addr"])
    return anchors


class _AnchorIndex:
    """Each stream's known expandable-segment addresses, sorted, for the nearest one to an
    address in O(log n) (a trace may hold millions of map events and anchors)."""

    def __init__(self, anchors: dict[tuple[int, bool], list[int]]) -> None:
        by_stream: dict[int, list[tuple[int, tuple[int, bool]]]] = {}
        for key, addresses in anchors.items():
            by_stream.setdefault(key[0], []).extend((address, key) for address in addresses)
        self._addresses: dict[int, list[int]] = {}
        self._keys: dict[int, list[tuple[int, bool]]] = {}
        for stream, listed in by_stream.items():
            pairs = sorted(set(listed))  # a trace may repeat one address many times
            self._addresses[stream] = [address for address, _ in pairs]
            self._keys[stream] = [key for _, key in pairs]

    def nearest(self, stream: int, addr: int) -> tuple[int, bool] | None:
        """The key of the anchor nearest ``addr`` on ``stream`` (the smallest key among equally
        near ones), else None."""
        addresses = self._addresses.get(stream)
        if not addresses:
            return None
        at = bisect_left(addresses, addr)
        distance = min(abs(addresses[i] - addr) for i in (at - 1, at) if 0 <= i < len(addresses))
        low = bisect_left(addresses, addr - distance)
        high = bisect_right(addresses, addr + distance)
        keys = self._keys[stream]
        return min(keys[i] for i in range(low, high) if abs(addresses[i] - addr) == distance)


def _owner(
    ranges: dict[tuple[int, bool], _Ranges],
    anchors: _AnchorIndex,
    addr: int,
    stream: int,
    size: int,
) -> tuple[int, bool]:
    """The (stream, pool) whose expandable segment holds ``addr``: the one with a mapped range
    containing it, else the one with the nearest known address on that stream."""
    for key, mapped in ranges.items():
        if key[0] == stream and mapped.contains(addr):
            return key
    nearest = anchors.nearest(stream, addr)
    if nearest is not None:
        return nearest
    return (stream, _expandable_pool(size))


def _infer_sizes(
    live: list[tuple[int, int, int]],
    end: int,
    split_always: bool,
    round_size: Callable[[int], int],
    max_split_size: int | None,
) -> int:
    """Fill in the sizes (-1) of ``live`` blocks in one segment or mapped range; returns how
    many were inferred.  ``live`` is rewritten in address order."""
    live.sort()
    inferred = 0
    for index, (addr, size, requested) in enumerate(live):
        if size >= 0:
            continue
        inferred += 1
        boundary = live[index + 1][0] if index + 1 < len(live) else end
        gap = max(boundary - addr, 0)
        rounded = round_size(requested)
        if split_always:
            block = rounded
        elif max_split_size is not None and rounded >= max_split_size:
            block = gap  # never split: the whole segment
        else:
            block = gap if gap - rounded <= K_SMALL_SIZE else rounded
        live[index] = (addr, min(block, gap) if gap else block, requested)
    return inferred
