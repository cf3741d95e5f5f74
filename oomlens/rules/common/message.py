"""What an OOM message's own numbers say: the allocator OOM to read, its balance sheet
(``oomlens.facts.oom_balance``) against the user's thresholds, and the questions several
rules must answer the same way (was the card full, was little cached, did others hold it, did
this process' own demand fill it, is it a ZeRO-3 gather).
"""

from __future__ import annotations

from oomlens.facts.log import (
    Frame,
    OomEvent,
    OomKind,
    OomMessage,
)
from oomlens.facts.oom_balance import ROUNDING_BYTES, MessageBalance, balance
from oomlens.facts.run import RunFacts
from oomlens.rules.common.evidence import size
from oomlens.rules.thresholds import Thresholds


def allocator_oom(facts: RunFacts) -> OomEvent | None:
    """The first failure's allocator OOM (the one with numbers), else any allocator OOM."""
    first = facts.first_gpu_oom()
    if first is not None and first.message.kind is OomKind.ALLOCATOR:
        return first
    for event in facts.gpu_oom_events():
        if event.message.kind is OomKind.ALLOCATOR:
            return event
    return first


_GATHER_FRAMES = frozenset(
    {
        "fetch_sub_module",
        "_all_gather",
        "all_gather_coalesced",
        "_all_gather_params",
        "__all_gather_params",
        "_fetch_sub_module_impl",
    }
)


def near_full(n: OomMessage, thresholds: Thresholds) -> bool:
    if n.limit is None or n.allocated_by_pytorch is None:
        return False
    request = n.tried_to_allocate or 0
    return n.allocated_by_pytorch + request >= thresholds.capacity_near_full_fraction * n.limit


def little_stuck(n: OomMessage, thresholds: Thresholds) -> bool:
    if n.reserved_unallocated is None or n.limit is None:
        return True
    return n.reserved_unallocated < max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * n.limit,
    )


def in_zero3_gather(event: OomEvent) -> bool:
    return zero3_gather_frame(event) is not None


def zero3_gather_frame(event: OomEvent) -> Frame | None:
    """The innermost traceback frame of ``event`` that is a ZeRO-3 parameter gather."""
    if event.traceback is None:
        return None
    return next((f for f in reversed(event.traceback.frames) if f.function in _GATHER_FRAMES), None)


def others_dominate(n: OomMessage, thresholds: Thresholds) -> bool:
    return (
        n.other_processes_total is not None
        and n.total_capacity is not None
        and n.other_processes_total >= thresholds.others_dominate_fraction * n.total_capacity
    )


def message_balance(n: OomMessage, thresholds: Thresholds) -> MessageBalance:
    """The OOM message's balance sheet (``oomlens.facts.oom_balance``), a listed process
    counting as this job when it holds what the allocator reserved plus at most
    ``other_process_self_match_bytes``."""
    return balance(n, thresholds.other_process_self_match_bytes)


def oversized(n: OomMessage) -> bool:
    """The request alone is larger than the whole card (or a 1 EB lower bound was printed)."""
    return n.message_format == "exabyte" or balance(n, 0).oversized


def demand_exceeds_card(b: MessageBalance, thresholds: Thresholds) -> bool:
    """This process' own tensors filled what it could use: live tensors hold most of what it
    could reach, the request did not fit in the free memory plus its allocator's cached free
    blocks (or those were few: a defragmented allocator would fail too), other holders took
    little (a CUDA context's worth aside), and the request is not larger than the card."""
    shortfall, live = b.shortfall, b.live_share
    if shortfall is None or live is None or b.capacity is None or b.oversized:
        return False
    if live < thresholds.own_tensors_min_fraction:
        return False
    cached_little = b.unallocated is not None and b.unallocated < max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * (b.limit or b.capacity),
    )
    if shortfall <= 0 and not cached_little:
        return False  # the memory was there, in cached pieces: fragmentation's question
    return b.capped or _little_held_elsewhere(b, thresholds)


def _little_held_elsewhere(b: MessageBalance, thresholds: Thresholds) -> bool:
    """Other holders of the card (listed processes, memory no one accounts for beyond a CUDA
    context's worth) took little of it."""
    unlisted = b.outside_unlisted or 0
    if unlisted < thresholds.other_process_unlisted_min_bytes:
        unlisted = 0  # a CUDA context's worth
    held_elsewhere = unlisted + b.others_total
    return held_elsewhere < thresholds.other_process_unlisted_fraction * (b.capacity or 0)


def request_fills_card(b: MessageBalance, thresholds: Thresholds) -> bool:
    """This process' own demand filled what it could use, with one large request as much of
    it as the live tensors (``demand_exceeds_card`` asks the live tensors alone to fill it):
    live tensors plus the request hold most of what it could reach, the request did not fit in
    the free memory (as printed, to its rounding: a few cached blocks cannot join it), its
    allocator cached little (no fragmentation question), others took little, and the request
    is not larger than the card."""
    if (
        b.allocated is None
        or b.request is None
        or b.reserved is None
        or b.free is None
        or b.unallocated is None
        or b.capacity is None
        or b.oversized
        or b.request + ROUNDING_BYTES < b.free
        or demand_exceeds_card(b, thresholds)
    ):
        return False
    reachable = b.limit if b.capped and b.limit is not None else b.reserved + b.free
    if not reachable or (b.allocated + b.request) / reachable < thresholds.own_tensors_min_fraction:
        return False
    if b.unallocated >= max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * (b.limit or b.capacity),
    ):
        return False
    return b.capped or _little_held_elsewhere(b, thresholds)


def fullness(n: OomMessage) -> str:
    """How full the card was, in the message's own numbers (or that it printed none)."""
    if n.allocated_by_pytorch is None or n.limit is None:
        if n.tried_to_allocate is not None:
            return f"{size(n.tried_to_allocate)} more was needed"
        return "the message carries no allocator numbers"
    return (
        f"{size(n.allocated_by_pytorch)} allocated of {size(n.limit)} {n.limit_name} when "
        f"{size(n.tried_to_allocate)} more was needed"
    )
