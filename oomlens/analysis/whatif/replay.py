"""Feed a recorded trace's requests to the allocator model, under any setting.

The requests are the trace's ``alloc`` entries (their unrounded size and stream), its
``free_completed`` entries (the block goes back to the cache there: the model does not model
cross-stream events) and its ``oom`` entries (the request that failed, already rounded).
``free_requested`` only lowers the allocated-bytes statistic, as in torch.  A run of
``segment_free`` / ``segment_unmap`` entries that no new segment and no OOM follows was an
``empty_cache()`` call of the program: the model empties its cache there too.  Other segment
entries are what the allocator did on its own; the model decides those itself, and in checking
mode (:mod:`.selfcheck`) its decisions are compared with them.

Two starts are possible when the trace begins mid-run: the layout the recording shows at its
first event (``recorded``), or the blocks in use at that point allocated afresh, in address
order, under the setting replayed (``packed``), as if the part of the run before the recording
had left no cached memory behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oomlens.analysis.whatif.alloc_conf import AllocConf
from oomlens.analysis.whatif.allocator_blocks import SYNTHETIC_TOP, Block, SegmentEvent
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit
from oomlens.analysis.whatif.rewind import StartState
from oomlens.gcpause import gc_paused

_SEGMENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})
_RELEASES = frozenset({"segment_free", "segment_unmap"})
_AFTER_MALLOC_RELEASE = frozenset({"segment_alloc", "segment_map", "oom"})


@dataclass(slots=True)
class Agreement:
    """Checking mode: how the model's decisions compare with the recording's."""

    segment_events: int = 0
    segment_matched: int = 0
    allocations: int = 0
    addresses_matched: int = 0
    reserved_checks: int = 0
    reserved_matched: int = 0
    first_mismatch: str | None = None

    def mismatch(self, text: str) -> None:
        if self.first_mismatch is None:
            self.first_mismatch = text


@dataclass(slots=True)
class ReplayRun:
    """What one replay found.  Indices are trace indices; ``-1`` means before the first entry
    (the memory in use at the start did not fit under the setting)."""

    outcome: str = "fits"
    oom_index: int | None = None
    oom_request: int | None = None
    oom_stream: int | None = None
    peak_reserved: int = 0
    peak_checked: int = 0
    peak_allocated: int = 0
    reserved_at_start: int = 0
    unallocated_at_recorded_oom: int | None = None
    shortfall: int | None = None
    live_too_large: bool | None = None
    survived_recorded_oom: bool = False
    continued_after_oom: bool = False
    unknown_frees: int = 0
    recorded_ooms_replayed: list[int] = field(default_factory=list)
    agreement: Agreement | None = None


def external_releases(trace: list[Any]) -> dict[int, int]:
    """Runs of ``segment_free``/``segment_unmap`` made by ``empty_cache()``: start -> end index
    (exclusive).  A run the allocator made inside a request is followed by a new segment or
    by the OOM."""
    runs: dict[int, int] = {}
    index = 0
    count = len(trace)
    while index < count:
        if trace[index]["action"] not in _RELEASES:
            index += 1
            continue
        end = index
        while end < count and trace[end]["action"] in _RELEASES | {"free_completed"}:
            end += 1
        following = trace[end]["action"] if end < count else None
        if following not in _AFTER_MALLOC_RELEASE:
            runs[index] = end
        index = end
    return runs


def _start_model(
    model: CachingAllocatorModel, start: StartState, packed: bool
) -> tuple[dict[int, Block], int | None]:
    """Install the start state; returns the blocks in use by recorded address, and the stream
    of a block that did not fit when packing (else None)."""
    blocks: dict[int, Block] = {}
    model.adopt_opaque(start.opaque_bytes)
    if not packed:
        for segment in start.segments:
            blocks.update(
                model.adopt_segment(
                    segment.addr, segment.size, segment.stream, segment.small, segment.live
                )
            )
        for reservation in start.reservations:
            blocks.update(
                model.adopt_reservation(
                    reservation.base,
                    reservation.stream,
                    reservation.small,
                    reservation.mapped,
                    reservation.live,
                )
            )
        return blocks, None
    in_use = [
        (addr, requested, segment.stream)
        for segment in start.segments
        for addr, _, requested in segment.live
    ]
    in_use += [
        (addr, requested, reservation.stream)
        for reservation in start.reservations
        for addr, _, requested in reservation.live
    ]
    for addr, requested, stream in sorted(in_use):
        block = model.malloc(requested, stream)
        if block is None:
            return blocks, stream
        blocks[addr] = block
    model.events.clear()
    return blocks, None


def replay(
    trace: list[Any],
    start: StartState,
    conf: AllocConf,
    limit: Limit,
    *,
    check: bool = False,
    packed: bool = False,
    releases: dict[int, int] | None = None,
) -> ReplayRun:
    """Replay ``trace`` from ``start`` under ``conf`` and ``limit``; see the module docstring.

    The replay stops where the model runs out serving a request the recording served (the run
    would have died there), or at a recorded OOM the model runs out on too when nothing but
    markers follows it (the recorded run died there).  An OOM the program caught and survived
    is replayed through.  ``check``: compare every decision with the recording (segment events,
    block addresses, reserved bytes, the OOMs), using the recorded addresses for new segments.
    ``releases``: :func:`external_releases` of the trace, when the caller has it already.
    """
    # The cyclic collector would walk the whole snapshot each time the model's blocks (linked
    # both ways) trigger a collection; they are dropped as a whole afterwards.
    with gc_paused():
        try:
            return _replay(trace, start, conf, limit, check=check, packed=packed, releases=releases)
        except (KeyError, IndexError) as err:
            # torch never writes such a trace: a damaged or crafted file
            raise InconsistentTraceError(
                f"the recorded events contradict each other ({type(err).__name__} {err})"
            ) from None


class InconsistentTraceError(ValueError):
    """The trace cannot be followed by any allocator (a block freed twice, an address
    reused while live, ...): it was damaged or crafted."""


def _replay(
    trace: list[Any],
    start: StartState,
    conf: AllocConf,
    limit: Limit,
    *,
    check: bool = False,
    packed: bool = False,
    releases: dict[int, int] | None = None,
) -> ReplayRun:
    agreement = Agreement() if check else None
    pending: list[dict[str, Any]] = []
    used: set[int] = set()

    def oracle(action: str, size: int, stream: int) -> int | None:
        for position, entry in enumerate(pending):
            if position in used or entry["action"] != action or entry["stream"] != stream:
                continue
            if action == "segment_alloc":
                if entry["size"] != size:
                    continue
                used.add(position)
            return int(entry["addr"])
        return None

    # Checking, the model's addresses must be the recorded ones; predicting, the start goes
    # above the segments the model will place (the driver places later segments lower).
    model = CachingAllocatorModel(
        conf,
        limit,
        oracle=oracle if check else None,
        start_shift=0 if check else SYNTHETIC_TOP,
    )
    run = ReplayRun(agreement=agreement)
    blocks, failed_stream = _start_model(model, start, packed)
    run.reserved_at_start = model.reserved
    allocated = model.active
    if failed_stream is not None:
        run.outcome, run.oom_index, run.oom_stream = "oom", -1, failed_stream
        run.peak_reserved, run.peak_allocated = model.peak_reserved, allocated
        run.peak_checked = model.peak_checked
        return run
    peak_allocated = allocated
    if releases is None:
        releases = external_releases(trace)
    last_event = len(trace) - 1
    while last_event >= 0 and trace[last_event]["action"] == "snapshot":
        last_event -= 1
    recorded_reserved = start.reserved
    malloc = model.malloc
    free = model.free
    events = model.events

    def completed(addr: int) -> None:
        nonlocal allocated
        found = blocks.pop(addr, None)
        if found is None:
            run.unknown_frees += 1
            return
        if not found.freed:
            allocated -= found.size
        free(found)

    def settle(index: int) -> None:
        nonlocal recorded_reserved
        if agreement is not None:
            recorded_reserved = _compare(
                agreement, index, pending, events, model.reserved, recorded_reserved
            )
            pending.clear()
            used.clear()
        events.clear()

    skip_until = -1
    for index, entry in enumerate(trace):
        action = entry["action"]
        if action == "alloc":
            block = malloc(entry["size"], entry["stream"])
            if events or agreement is not None:
                settle(index)
            if block is None:
                _ran_out(run, model, index, entry, allocated)
                if agreement is not None:
                    agreement.mismatch(
                        f"event {index}: the model runs out serving a {entry['size']}-byte "
                        "request the recording served"
                    )
                break
            addr = entry["addr"]
            if agreement is not None:
                agreement.allocations += 1
                if block.addr == addr:
                    agreement.addresses_matched += 1
                else:
                    agreement.mismatch(
                        f"event {index}: the model places a {entry['size']}-byte request at "
                        f"{block.addr:#x}, the recording at {addr:#x}"
                    )
            blocks[addr] = block
            allocated += block.size
            if allocated > peak_allocated:
                peak_allocated = allocated
        elif action == "free_requested":
            found = blocks.get(entry["addr"])
            if found is not None and not found.freed:
                found.freed = True
                allocated -= found.size
        elif action == "free_completed":
            if index < skip_until:
                continue
            found = blocks.pop(entry["addr"], None)
            if found is None:
                run.unknown_frees += 1
                continue
            if not found.freed:
                allocated -= found.size
            free(found)
        elif action == "oom":
            first = run.unallocated_at_recorded_oom is None
            block = malloc(entry["size"], entry["stream"])
            settle(index)
            if first:
                run.unallocated_at_recorded_oom = model.reserved - allocated
            if block is None:
                run.recorded_ooms_replayed.append(index)
                if index >= last_event:
                    _ran_out(run, model, index, entry, allocated)
                    break
                continue
            if agreement is not None:
                agreement.mismatch(
                    f"event {index}: the model serves the {entry['size']}-byte request the "
                    "recording ran out on"
                )
            run.survived_recorded_oom = True
            if index < last_event:
                run.continued_after_oom = True
            free(block)
        elif action in _SEGMENT_ACTIONS:
            if index < skip_until:
                continue
            end = releases.get(index)
            if end is None:
                if agreement is not None:
                    pending.append(entry)
                continue
            for inner in range(index, end):
                if trace[inner]["action"] == "free_completed":
                    completed(trace[inner]["addr"])
                elif agreement is not None:
                    pending.append(trace[inner])
            model.empty_cache()
            settle(index)
            skip_until = end
    run.peak_reserved = model.peak_reserved
    run.peak_checked = model.peak_checked
    run.peak_allocated = peak_allocated
    return run


def _ran_out(
    run: ReplayRun, model: CachingAllocatorModel, index: int, entry: dict[str, Any], allocated: int
) -> None:
    request = model.round_size(entry["size"])
    run.outcome = "oom"
    run.oom_index = index
    run.oom_request = entry["size"]
    run.oom_stream = entry["stream"]
    limit = model.limit.allowed if model.limit.allowed is not None else model.limit.capacity
    if limit is not None:
        run.shortfall = model.reserved + model.allocation_size(request) - limit
        run.live_too_large = allocated + request > limit


def _compare(
    agreement: Agreement,
    index: int,
    recorded: list[dict[str, Any]],
    modelled: list[SegmentEvent],
    model_reserved: int,
    recorded_reserved: int,
) -> int:
    """Compare the segment events of one request; returns the recorded reserved bytes after."""
    for entry in recorded:
        delta = (
            entry["size"] if entry["action"] in ("segment_alloc", "segment_map") else -entry["size"]
        )
        recorded_reserved += delta
    agreement.segment_events += len(recorded)
    for position, entry in enumerate(recorded):
        if position < len(modelled):
            event = modelled[position]
            if (event.action, event.addr, event.size) == (
                entry["action"],
                entry["addr"],
                entry["size"],
            ):
                agreement.segment_matched += 1
                continue
            agreement.mismatch(
                f"before event {index}: the recording has {entry['action']} of {entry['size']} "
                f"bytes at {entry['addr']:#x}, the model {event.action} of {event.size} bytes at "
                f"{event.addr:#x}"
            )
        else:
            agreement.mismatch(
                f"before event {index}: the recording has {entry['action']} of {entry['size']} "
                f"bytes at {entry['addr']:#x}, the model nothing"
            )
    for event in modelled[len(recorded) :]:
        agreement.mismatch(
            f"before event {index}: the model makes {event.action} of {event.size} bytes at "
            f"{event.addr:#x}, the recording nothing"
        )
        agreement.segment_events += 1
    if recorded or modelled:
        agreement.reserved_checks += 1
        if recorded_reserved == model_reserved:
            agreement.reserved_matched += 1
        else:
            agreement.mismatch(
                f"at event {index}: reserved {model_reserved} bytes in the model, "
                f"{recorded_reserved} in the recording"
            )
    return recorded_reserved
