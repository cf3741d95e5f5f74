"""The caching allocator model's memory, as torch's allocator keeps it: blocks (pieces of a
segment, allocated or free, chained to their neighbours), the free blocks of a pool in best-fit
order, the virtual range of an expandable segment, the segment events the model reports.

Plain data structures with no policy: what to split, merge, map or release is decided by
``allocator_model.CachingAllocatorModel``.  Free-block keys pack size and address into one int
(``ADDR_BITS``), so model addresses stay below 2**50.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentEvent:
    """A segment the model allocated, freed, mapped or unmapped (torch's trace ``action``)."""

    action: str
    addr: int
    size: int
    stream: int


class Reservation:
    """The virtual range of one expandable segment (one per stream and pool)."""

    __slots__ = ("base", "page", "size", "small", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int, small: bool) -> None:
        self.base = base
        self.size = size
        self.page = page
        self.stream = stream
        self.small = small

    def pages_covering(self, addr: int, size: int) -> tuple[int, int]:
        """Page range [begin, end) from the page holding ``addr`` to the one holding its end."""
        begin = (addr - self.base) // self.page
        end = -(-(addr + size - self.base) // self.page)
        return begin, end

    def pages_inside(self, addr: int, size: int) -> tuple[int, int]:
        """Page range [begin, end) of the pages lying wholly inside ``[addr, addr + size)``."""
        begin = -(-(addr - self.base) // self.page)
        end = (addr + size - self.base) // self.page
        return begin, end


class Block:
    """One block: a piece of a segment, allocated or free (torch's ``Block``).

    ``freed`` marks an allocated block whose tensor was freed (``free_requested``) while the
    block is not back in the cache yet: it no longer counts as allocated in torch's statistics.
    """

    __slots__ = (
        "addr",
        "allocated",
        "freed",
        "gc_base",
        "mapped",
        "next",
        "prev",
        "requested",
        "reservation",
        "size",
        "small",
        "stream",
    )

    def __init__(
        self,
        addr: int,
        size: int,
        stream: int,
        small: bool,
        reservation: Reservation | None = None,
    ) -> None:
        self.addr = addr
        self.size = size
        self.stream = stream
        self.small = small
        self.allocated = False
        self.freed = False
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped = True
        self.reservation = reservation
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


ADDR_BITS = 50
"""Free-block keys are ``size << ADDR_BITS | addr``: one int sorts as torch's (size, address)
order does, and bisects much faster than a tuple.  Model addresses stay below 2**50: recorded
ones are below 2**48 (user virtual addresses), a recorded start is shifted by
:data:`SYNTHETIC_TOP` at most, the model's own segments lie below it (see
``CachingAllocatorModel._place_below``) and its expandable ranges above the shifted start."""
ADDR_MASK = (1 << ADDR_BITS) - 1
SYNTHETIC_TOP = 1 << 49
"""New segments the model places itself go below this, down to half of it."""


class Pool:
    """Free blocks of one pool: per stream, keys in best-fit order (see :data:`ADDR_BITS`)."""

    __slots__ = ("by_addr", "free", "gc_calls", "small", "unmapped", "unmapped_by_addr")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: dict[int, list[int]] = {}
        self.by_addr: dict[int, Block] = {}
        self.unmapped: dict[int, list[int]] = {}
        self.unmapped_by_addr: dict[int, Block] = {}
        self.gc_calls = 0

    def insert(self, block: Block) -> None:
        block.gc_base = self.gc_calls
        keys = self.free.get(block.stream)
        if keys is None:
            keys = self.free[block.stream] = []
        insort(keys, block.size << ADDR_BITS | block.addr)
        self.by_addr[block.addr] = block

    def remove(self, block: Block) -> None:
        keys = self.free[block.stream]
        del keys[bisect_left(keys, block.size << ADDR_BITS | block.addr)]
        del self.by_addr[block.addr]

    def insert_unmapped(self, block: Block) -> None:
        addrs = self.unmapped.get(block.stream)
        if addrs is None:
            addrs = self.unmapped[block.stream] = []
        insort(addrs, block.addr)
        self.unmapped_by_addr[block.addr] = block

    def remove_unmapped(self, block: Block) -> None:
        addrs = self.unmapped[block.stream]
        del addrs[bisect_left(addrs, block.addr)]
        del self.unmapped_by_addr[block.addr]

    def ordered(self) -> list[Block]:
        """Free blocks in torch's set order: stream, size, address."""
        return [
            self.by_addr[key & ADDR_MASK]
            for stream in sorted(self.free)
            for key in self.free[stream]
        ]
