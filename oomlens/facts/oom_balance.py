"""What an OOM message's own numbers say about where the card's memory was.

A torch OOM message is a small balance sheet of the device at the moment the allocator gave
up: its capacity, what was free, what this process' caching allocator held (allocated plus
reserved-but-unallocated), and in 2.2+ what this process held in all and every other process
NVML listed.  ``balance(message, ...)`` reads it the way an engineer does:

* ``capacity - reserved - free`` is memory on the card that this process' allocator does not
  hold: the CUDA context and other libraries of this process, and every other process.
* A listed ``Process N has X memory in use`` with no ``this process has`` clause, where X holds
  what this process' allocator reserved (plus at most a context's worth), is this very job seen
  from a container under its host pid, not another process.  Other listed processes are others.
* With a per-process cap (``allowed``), a device with enough free memory for the request means
  the cap, not the card, was the limit.
* A request larger than the whole card is a shape, index or dtype bug: no setting serves it.

Pure arithmetic on facts; the judgement of what it means for a diagnosis is the rules'.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.facts.log import OomMessage, ProcessMemory

ROUNDING_BYTES = 16 * 1024**2
"""Sizes are printed with two decimals (10 MiB at GiB scale): sums may be off by this much."""

LARGEST_DEVICE_BYTES = 288 * 1024**3
"""The most memory one accelerator has (NVIDIA B300, AMD MI355X: 288 GB of HBM3e): a single
request above it is larger than any card, whoever else held memory."""


@dataclass(frozen=True, slots=True)
class MessageBalance:
    """The balance sheet of one OOM message (every size in bytes; None when not printed).

    ``others`` are the listed processes that are not this job; ``self_listed`` the listed
    process that is this job under another pid namespace (containers), if any.
    ``outside_allocator`` is ``capacity - reserved - free``: memory this process' allocator
    does not hold.  ``outside_unlisted`` is what of it neither ``this process has`` nor the
    listed others account for (for messages that list nothing: all of it).
    """

    message: OomMessage
    request: int | None
    capacity: int | None
    limit: int | None
    free: int | None
    allocated: int | None
    unallocated: int | None
    """Reserved by PyTorch but unallocated (torch 1.0-1.3's ``cached`` figure is this)."""
    reserved: int | None
    in_use_self: int | None
    """What this process held in all: ``this process has X``, or the listed process that is
    this job (containers)."""
    self_listed: ProcessMemory | None
    others: tuple[ProcessMemory, ...]
    outside_allocator: int | None
    outside_unlisted: int | None

    @property
    def others_total(self) -> int:
        return sum(process.bytes for process in self.others)

    @property
    def non_pytorch_self(self) -> int | None:
        """This process' memory outside its caching allocator (context, NCCL, libraries)."""
        if self.in_use_self is None or self.reserved is None:
            return None
        return max(0, self.in_use_self - self.reserved)

    @property
    def oversized(self) -> bool:
        """The request alone is larger than the whole card."""
        return (
            self.request is not None
            and self.capacity is not None
            and self.request > self.capacity + ROUNDING_BYTES
        )

    @property
    def request_share(self) -> float | None:
        """The request as a fraction of the card."""
        if self.request is None or not self.capacity:
            return None
        return self.request / self.capacity

    @property
    def capped(self) -> bool:
        """A per-process cap (``allowed``) was in force and the device had room for the
        request: the cap, not the card, stopped the allocation."""
        return (
            self.message.allowed is not None
            and self.free is not None
            and self.request is not None
            and self.free >= self.request
        )

    @property
    def shortfall(self) -> int | None:
        """How much the request exceeded everything this process could have used for it: the
        free device memory plus its allocator's cached free blocks (negative: it was there, in
        pieces).  Under a cap, the cap's headroom replaces the device's free memory."""
        if self.request is None or self.free is None or self.unallocated is None:
            return None
        room = self.free
        if self.capped and self.limit is not None and self.reserved is not None:
            room = max(0, self.limit - self.reserved)
        return self.request - room - self.unallocated

    @property
    def live_share(self) -> float | None:
        """The live tensors (allocated) as a fraction of what this process could use at most:
        its allocator's holdings plus the free memory (or its cap's headroom)."""
        if self.allocated is None or self.reserved is None or self.free is None:
            return None
        reachable = self.reserved + self.free
        if self.capped and self.limit is not None:
            reachable = self.limit
        return self.allocated / reachable if reachable else None


def balance(message: OomMessage, self_slack_bytes: int) -> MessageBalance:
    """The balance sheet of ``message``.  ``self_slack_bytes``: how much a listed process may
    hold above what this process' allocator reserved and still be this process (its CUDA
    context, NCCL buffers and libraries)."""
    allocated, unallocated = message.allocated_by_pytorch, message.reserved_unallocated
    if message.message_format == "cached" and message.reserved_total is not None:
        # torch 1.0-1.3 printed ``amount_cached - amount_allocated`` as "cached": the reserved
        # but unallocated bytes themselves, not the reserved total.
        unallocated = message.reserved_total
    reserved = None if allocated is None or unallocated is None else allocated + unallocated
    listed = message.other_processes
    self_listed: ProcessMemory | None = message.listed_self
    others: tuple[ProcessMemory, ...] = listed
    in_use = message.process_in_use
    if in_use is None and self_listed is None and listed and reserved is not None:
        fits = [
            p for p in listed if reserved - ROUNDING_BYTES <= p.bytes <= reserved + self_slack_bytes
        ]
        if fits:
            self_listed = min(fits, key=lambda p: p.bytes - reserved)
            others = tuple(p for p in listed if p is not self_listed)
            in_use = self_listed.bytes
    capacity = message.total_capacity
    free = message.free
    outside = None
    if capacity is not None and reserved is not None and free is not None:
        outside = max(0, capacity - reserved - free)
    unlisted = None
    if outside is not None:
        accounted = sum(p.bytes for p in others)
        if in_use is not None and reserved is not None:
            accounted += max(0, in_use - reserved)
        unlisted = max(0, outside - accounted)
    return MessageBalance(
        message=message,
        request=message.tried_to_allocate,
        capacity=capacity,
        limit=message.limit,
        free=free,
        allocated=allocated,
        unallocated=unallocated,
        reserved=reserved,
        in_use_self=in_use,
        self_listed=self_listed,
        others=others,
        outside_allocator=outside,
        outside_unlisted=unlisted,
    )
