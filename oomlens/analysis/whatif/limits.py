"""The memory limit a recording shows, inferred from its trace.

A new segment fails when reserved + its size would exceed the limit: the per-process memory
fraction's ``allowed`` bytes, or what the device still had free.  The trace shows both sides
of that test:

* every segment the allocator got proves the limit was at least the reserved bytes before it
  plus the size checked: the segment's own size, or with expandable segments the segment the
  request asked for (``get_allocation_size``), which the fraction is checked against rather
  than the pages then mapped (the ``expandable_limit`` GPU family: reserved ends above
  ``allowed`` when the pages are larger than the request);
* every time the allocator had to release cached segments before getting a new one (or ran
  out), its first attempt failed: the limit was below the reserved bytes at that moment plus
  the segment it asked for;
* the ``oom`` entry records the device's free memory: when that is less than the segment asked
  for, the device itself was full and the limit is exactly reserved + free (no fraction
  needed); otherwise a fraction was in force and the evidence above brackets it.

With ``garbage_collection_threshold`` (only in force with a fraction) the allocator also
releases segments without failing first: before every new segment (and every OOM) it runs
``garbage_collect_cached_blocks``, which releases whole cached large segments when reserved
exceeds ``threshold * allowed``, and releases at least one whenever there is one (the oldest is
always at least as old as the average).  So releases before a new segment prove that either
the collection fired or the first attempt failed (the limit was below the larger of the two
bounds), and a new segment got with no release while a whole cached large segment was there
proves the collection did not fire (``allowed >= reserved / threshold``).

The log's OOM message, when it is the same process's, says more (:func:`narrow`): its
``X allowed`` is the fraction itself, printed to two decimals of GiB (+-5.12 MiB) or MiB; its
absence in a 2.1+ message says that no fraction was set.  Where the trace's bracket is wider
than the printed figure's rounding, the two together narrow it.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oomlens.analysis.whatif.replay import external_releases
from oomlens.facts.whatif import LoggedLimit
from oomlens.units import format_size

_RELEASES = frozenset({"segment_free", "segment_unmap"})
_SMALL_SEGMENT = 2 * 1024**2
"""The small pool's segments (``kSmallBuffer``); the large pool's are larger."""


@dataclass(frozen=True, slots=True)
class InferredLimit:
    """``kind``: ``allowed`` (a memory fraction), ``capacity`` (the device's capacity: no
    fraction below it) or ``unknown`` (nothing in the trace bounds it).  ``low``..``high`` is
    the range the evidence allows; ``value`` the one the replay uses (the middle of the
    range)."""

    kind: str
    low: int
    high: int | None
    value: int | None
    basis: str
    from_log: bool = False
    """The range is narrowed by the log's OOM message (:func:`narrow`)."""

    @property
    def uncertainty(self) -> int:
        """Half the width of the range (0 when exact or unknown)."""
        if self.high is None or self.value is None:
            return 0
        return max(self.high - self.value, self.value - self.low, 0)


def infer_limit(
    trace: list[Any],
    start_reserved: int,
    *,
    request_segment: Callable[[int], int],
    gc_threshold: float,
    releases: dict[int, int] | None = None,
) -> InferredLimit:
    """Bracket the recording's limit; see the module docstring.

    ``request_segment(size)`` is the segment size the recorded setting asks for a request of
    ``size`` bytes (rounding, then ``get_allocation_size``); ``gc_threshold`` the recorded
    ``garbage_collection_threshold`` (0: off).
    """
    gc_enabled = gc_threshold > 0
    cached = _WholeSegments()
    reserved = start_reserved
    low = reserved
    high: int | None = None
    failures = 0
    external = external_releases(trace) if releases is None else releases
    attempt_reserved: int | None = None
    count = len(trace)
    index = 0
    capacity: int | None = None
    next_request = _NextRequest(trace)
    while index < count:
        entry = trace[index]
        action = entry["action"]
        if action in _RELEASES:
            if index in external:
                for inner in range(index, external[index]):
                    if trace[inner]["action"] in _RELEASES:
                        reserved -= trace[inner]["size"]
                index = external[index]
                continue
            if attempt_reserved is None:
                attempt_reserved = reserved
            reserved -= entry["size"]
            cached.remove(entry["addr"])
        elif action in ("segment_alloc", "segment_map"):
            checked = entry["size"]
            if action == "segment_map":
                checked = request_segment(next_request.after(index))
            if attempt_reserved is not None and not gc_enabled:
                high = _lower(high, attempt_reserved + checked - 1)
                failures += 1
            elif gc_enabled:
                collected = _collection_bounds(
                    attempt_reserved, reserved, checked, gc_threshold, cached.whole
                )
                low, high, failures = _apply(collected, low, high, failures)
            attempt_reserved = None
            low = max(low, reserved + checked)
            reserved += entry["size"]
            if action == "segment_alloc":
                cached.add(entry["addr"], entry["size"])
        elif action == "oom":
            segment = request_segment(entry["size"])
            before = attempt_reserved if attempt_reserved is not None else reserved
            free = entry.get("device_free")
            if isinstance(free, int) and free < segment:
                capacity = reserved + free
            elif not gc_enabled or attempt_reserved is None:
                high = _lower(high, min(before, reserved) + segment - 1)
                failures += 1
            if gc_enabled and attempt_reserved is None and cached.whole:
                low = max(low, _ceil_div(reserved, gc_threshold))
            attempt_reserved = None
        elif action == "alloc":
            attempt_reserved = None
            cached.use(entry["addr"])
        elif action == "free_completed":
            cached.release(entry["addr"])
        index += 1
    if capacity is not None:
        return InferredLimit(
            "capacity",
            capacity,
            capacity,
            capacity,
            "the device's free memory at the OOM plus what PyTorch had reserved",
        )
    if high is None:
        return InferredLimit("unknown", low, None, None, "the recording never hit its limit")
    high = max(high, low)
    return InferredLimit(
        "allowed",
        low,
        high,
        (low + high) // 2,
        f"a memory fraction, bracketed by {failures} failed and every successful segment "
        "request in the trace",
    )


def _lower(current: int | None, value: int) -> int:
    return value if current is None else min(current, value)


def _ceil_div(reserved: int, threshold: float) -> int:
    return int(-(-reserved // threshold))


def _collection_bounds(
    attempt_reserved: int | None, reserved: int, checked: int, threshold: float, whole: int
) -> tuple[int | None, int | None]:
    """What one new segment under garbage collection says of the limit, as (at least, below):
    releases before it (``attempt_reserved`` set) mean the collection fired or the first
    attempt failed; none while ``whole`` cached segments were there, that it did not fire."""
    if attempt_reserved is not None:
        fired = _ceil_div(attempt_reserved, threshold)
        return None, max(fired, attempt_reserved + checked) - 1
    if whole:
        return _ceil_div(reserved, threshold), None
    return None, None


def _apply(
    bounds: tuple[int | None, int | None], low: int, high: int | None, failures: int
) -> tuple[int, int | None, int]:
    at_least, below = bounds
    if at_least is not None:
        low = max(low, at_least)
    if below is not None:
        high = _lower(high, below)
        failures += 1
    return low, high, failures


class _WholeSegments:
    """The recorded (non-expandable) segments of the large pool and the blocks in use in each:
    ``whole`` counts those with none, the whole cached segments garbage collection can
    release.  Blocks of segments the trace did not create (before the recording) are ignored."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._sizes: dict[int, int] = {}
        self._in_use: dict[int, int] = {}
        self._block_segment: dict[int, int] = {}
        self.whole = 0

    def add(self, addr: int, size: int) -> None:
        if size <= _SMALL_SEGMENT or addr in self._sizes:
            return
        insort(self._starts, addr)
        self._sizes[addr] = size
        self._in_use[addr] = 0
        self.whole += 1

    def remove(self, addr: int) -> None:
        if addr not in self._sizes:
            return
        del self._starts[bisect_right(self._starts, addr) - 1]
        del self._sizes[addr]
        if self._in_use.pop(addr) == 0:
            self.whole -= 1

    def use(self, addr: int) -> None:
        position = bisect_right(self._starts, addr) - 1
        if position < 0:
            return
        start = self._starts[position]
        if addr >= start + self._sizes[start]:
            return
        self._block_segment[addr] = start
        if self._in_use[start] == 0:
            self.whole -= 1
        self._in_use[start] += 1

    def release(self, addr: int) -> None:
        start = self._block_segment.pop(addr, None)
        if start is None or start not in self._in_use:
            return
        self._in_use[start] -= 1
        if self._in_use[start] == 0:
            self.whole += 1


class _NextRequest:
    """The size of the first request (``alloc`` or ``oom``) after an index: one forward scan
    per run of map events, not one per event (a trace may map 100,000 pages in a row)."""

    def __init__(self, trace: list[Any]) -> None:
        self._trace = trace
        self._found_at = -1  # the index of the request last found (-1: none yet, len: none left)

    def after(self, index: int) -> int:
        trace = self._trace
        if self._found_at <= index:
            at = index + 1
            while at < len(trace) and trace[at]["action"] not in ("alloc", "oom"):
                at += 1
            self._found_at = at
        return int(trace[self._found_at]["size"]) if self._found_at < len(trace) else 0


def narrow(inferred: InferredLimit, logged: LoggedLimit | None) -> InferredLimit:
    """``inferred`` narrowed by the limit the log's OOM message printed for this process.

    The printed figure (+- its rounding) and the trace's bracket must overlap; their overlap is
    the new range.  When they do not, the message is not this recording's (or the trace is
    not what it seems) and ``inferred`` stands, its basis saying so.  A full device (``capacity``)
    is already exact; a message without ``allowed`` (no fraction) makes a trace that never
    showed the device's free memory a ``capacity`` limit.
    """
    if logged is None or inferred.kind == "capacity":
        return inferred
    kind = "allowed" if logged.fraction else "capacity"
    printed_low, printed_high = logged.bytes - logged.error, logged.bytes + logged.error
    low = max(inferred.low, printed_low)
    high = printed_high if inferred.high is None else min(inferred.high, printed_high)
    where = logged.source.describe()
    figure = f"{format_size(logged.bytes)} " + (
        "allowed" if logged.fraction else "reserved + free, no memory fraction"
    )
    if low > high:
        return InferredLimit(
            inferred.kind,
            inferred.low,
            inferred.high,
            inferred.value,
            f"{inferred.basis} (the OOM message at {where} prints {figure}, which the trace "
            "contradicts: not used)",
        )
    return InferredLimit(
        kind,
        low,
        high,
        (low + high) // 2,
        f"the OOM message at {where}: {figure} (printed to +-{format_size(logged.error)}), "
        "within what the trace shows",
        from_log=True,
    )
