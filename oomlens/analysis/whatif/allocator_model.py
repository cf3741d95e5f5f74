"""A model of PyTorch's CUDA caching allocator (``DeviceCachingAllocator``), one device.

Written from ``c10/cuda/CUDACachingAllocator.cpp`` as read at pytorch/pytorch@001074d (2024
main, about torch 2.5: no 2.11 copy of the file was available to read) and the
``AcceleratorAllocatorConfig`` parser of torch 2.9+ (``c10/core/AllocatorConfig.cpp``); held
to torch 2.11 by replaying every real 2.11 recording of the corpus (:mod:`.selfcheck`: segment
events, addresses and OOMs all agree) and by the GPU families of ``fixtures/whatif`` (25 runs
on an H200 and 28 on an H100 under torch 2.11.0: outcomes, the request each run died on and
peaks reserved agree; see docs/whatif.md).  Where 2.11 may differ from what was read: whether
``release_available_cached_blocks`` and garbage collection skip expandable blocks (the model
skips them), and ``large_segment_size_mb`` (modelled, default 20 MiB, as in the 2.13 headers).
What it does, as torch does it:

* **rounding**: a request is rounded to 512 B, or to the next power-of-2 division where
  ``roundup_power2_divisions`` asks for it (``round_size``); requests <= 1 MiB go to the small
  pool, the rest to the large pool;
* **segments**: a new segment is 2 MiB for the small pool, ``large_segment_size`` (20 MiB) for
  1-10 MiB requests, else the request rounded up to 2 MiB (``get_allocation_size``);
* **best fit** per pool and stream: the smallest free block of the request's stream that is
  large enough, lowest address among equals; a request below ``max_split_size`` never takes an
  oversize block, an oversize request only a block less than ``max_non_split_rounding`` larger;
* **splitting**: a block is split when the rest is >= 512 B (small pool, or expandable segments
  on) or when the request is below ``max_split_size`` and the rest is > 1 MiB (large pool);
  freed blocks merge with free neighbours of the same segment;
* **when nothing fits**: garbage collection (only with a memory fraction and
  ``garbage_collection_threshold``: frees whole cached large blocks older than the average age,
  age counted in free-block searches), a new segment, then releasing oversize cached blocks
  (with ``max_split_size``), then releasing every cached block that is a whole segment and
  unmapping every free page of expandable segments (``release_cached_blocks``), a last try, and
  the OOM;
* **limits**: with a memory fraction a new segment fails when reserved + the segment asked for
  (``get_allocation_size`` of the request) would exceed ``allowed``; without one it fails when
  the device has not that much free memory left (``capacity`` below).  With expandable
  segments the fraction is checked against the segment asked for, *not* the pages then mapped,
  as the ``expandable_limit`` GPU family showed on torch 2.11: 80 MiB reserved, a 30 MiB
  request under a 110 MiB fraction passes the check, maps two 20 MiB pages, and reserved ends
  at 120 MiB, above ``allowed`` (at 100 MiB it is refused).  Reserved memory can thus exceed
  the fraction by less than a page; ``peak_checked`` is the highest reserved + segment the
  fraction was checked against (the head-room is counted from it);
* **expandable segments**: one virtual range per stream and pool, mapped in 2 MiB (small) or
  ``large_segment_size`` (large) pages at the lowest address where the request fits; on the
  retry path whole free pages are unmapped; the best fit counts a free block's unmapped
  continuation as part of its size.

Simplifications (what the model leaves out, and what it does to the replay):

* cross-stream use (``record_stream``) is not modelled: a block is free again where the trace
  shows ``free_completed``, not when its events complete; ``release_cached_blocks`` therefore
  has no pending events to synchronize;
* private pools (CUDA graphs, ``MemPool``) are not modelled: their segments count as reserved
  memory nobody else can use;
* the device's free memory is one number (``capacity`` minus reserved): other processes and
  memory outside PyTorch are taken as constant, driver granularity as nil;
* ``trigger_free_memory_callbacks`` (IPC collection) frees nothing;
* where a new segment lands is the driver's choice, which no recording of another run shows
  (the self-check supplies the recorded addresses).  Addresses decide only ties: the best fit
  takes the lowest address among equal-size free blocks.  The model places each new segment at
  the top of the highest gap between the live segments that holds it, else below the lowest
  (a recorded start lies above its own), which is what the CUDA driver mostly did in the real
  recordings: of the 259,563 pairs of same-size segments in the traces of the corpus, the lab
  samples and the GPU families, the later one lies lower in 96 % (91 % leaving out the
  ``small_pool`` family's, most of them); and where released segments left a hole, the driver
  put the next segment that fits there, at its top (every release-then-allocate of the
  ``rounding_wide`` family: with ``roundup_power2_divisions:2`` many blocks tie, and placing
  below the lowest live segment instead predicts its OOM six rounds late).  Not always: the
  driver also fills a region upwards, and the transformer's ``max_split_size_mb:64`` run, the
  one other validation run where ties change the peak, is predicted 1.8 % below its real peak
  reserved (2.8 % with each new segment placed above the others).

The model reports every segment it creates, frees, maps and unmaps as a :class:`SegmentEvent`
(in torch's trace order), which the self-check compares with the recording.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass

from oomlens.analysis.whatif.alloc_conf import AllocConf
from oomlens.analysis.whatif.allocator_blocks import (
    ADDR_BITS,
    ADDR_MASK,
    SYNTHETIC_TOP,
    Block,
    Pool,
    Reservation,
    SegmentEvent,
)

MiB = 1024**2
K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
EXPANDABLE_RESERVATION = 1 << 40
"""Virtual address space of a modelled expandable segment (torch reserves 9/8 of the card)."""


AddressOracle = Callable[[str, int, int], int | None]
"""``(action, size, stream) -> address``: the recorded address of the segment the model is
about to create (``segment_alloc``) or the base of a new expandable range (``segment_map``),
or None to let the model choose."""


@dataclass(frozen=True, slots=True)
class Limit:
    """What makes a new segment fail.

    ``allowed`` is the per-process memory fraction's byte limit (None: no fraction set; then
    garbage collection never runs, as in torch).  ``capacity`` is the device memory this
    process could reserve in all (None: unknown, taken as unlimited).
    """

    allowed: int | None = None
    capacity: int | None = None


class CachingAllocatorModel:
    """The caching allocator of one device under ``conf`` and ``limit``; see the module doc.

    ``malloc(size, stream)`` returns the allocated :class:`Block` or None where torch raises
    the OOM; ``free(block)`` returns it to the cache (torch's ``free_block``);
    ``empty_cache()`` is ``torch.cuda.empty_cache()``.  Every segment change is appended to
    ``events`` (the caller drains it).  ``reserved`` is torch's ``memory_reserved()`` (with
    ``peak_reserved`` its high-water mark), ``peak_checked`` the highest reserved + segment the
    memory fraction was checked against (the reserved bytes at the start included; equal to
    ``peak_reserved`` without expandable segments), ``active`` the bytes of blocks handed out
    and not yet back in the cache.  ``oracle`` supplies recorded addresses for new segments;
    ``synthetic_top`` is where the model's own segments start (downwards); a recorded start is
    adopted ``start_shift`` bytes up (its blocks are still returned by recorded address).
    """

    def __init__(
        self,
        conf: AllocConf,
        limit: Limit,
        *,
        oracle: AddressOracle | None = None,
        synthetic_top: int = SYNTHETIC_TOP,
        start_shift: int = 0,
    ) -> None:
        self.conf = conf
        self.limit = limit
        self.oracle = oracle
        self.pools = (Pool(small=False), Pool(small=True))
        self.reservations: list[Reservation] = []
        self.reserved = 0
        self.peak_reserved = 0
        self.peak_checked = 0
        self.active = 0
        self.events: list[SegmentEvent] = []
        self.segments: set[int] = set()
        self._top = synthetic_top
        self._shift = start_shift
        self._placed: list[int] = []  # addresses of the live segments the model placed, sorted
        self._placed_sizes: dict[int, int] = {}
        self._next_addr = synthetic_top + (synthetic_top >> 1)  # expandable ranges, ascending
        self._gc_on = limit.allowed is not None and conf.garbage_collection_threshold > 0
        self._max_split = conf.max_split_size if conf.max_split_size is not None else 1 << 64
        self._divisions = conf.roundup_power2_divisions
        self._round_plain = not any(value > 1 for value in self._divisions)
        self._expandable = conf.expandable_segments

    # -------------------------------------------------------------------------- arithmetic

    def round_size(self, size: int) -> int:
        """torch's ``round_size``."""
        if size < K_MIN_BLOCK:
            return K_MIN_BLOCK
        if not self._round_plain:
            divisions = self._divisions[min(max(size.bit_length() - 21, 0), 15)]
            if divisions > 1 and size > K_MIN_BLOCK * divisions:
                if size & (size - 1) == 0:
                    return size
                floor2 = 1 << (size.bit_length() - 1)
                step = floor2 >> (divisions.bit_length() - 1)
                if step == 0:
                    return floor2 << 1
                floor = size & ~(step - 1)
                return size if floor == size else floor + step
        return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK

    def allocation_size(self, size: int) -> int:
        """torch's ``get_allocation_size``: the segment a request of ``size`` would get."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self.conf.large_segment_size
        return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE

    # -------------------------------------------------------------------------- public API

    def malloc(self, orig_size: int, stream: int) -> Block | None:
        """Serve a request of ``orig_size`` bytes on ``stream``; None where torch runs out."""
        if self._round_plain:
            size = K_MIN_BLOCK if orig_size < K_MIN_BLOCK else (orig_size + 511) & ~511
        else:
            size = self.round_size(orig_size)
        pool = self.pools[1] if size <= K_SMALL_SIZE else self.pools[0]
        block = self._get_free_block(pool, stream, size)
        if block is None:
            alloc_size = self.allocation_size(size)
            if self._gc_on:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, size, alloc_size)
            if block is None and self._release_available(pool, stream, size):
                block = self._alloc_block(pool, stream, size, alloc_size)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(pool, stream, size, alloc_size)
            if block is None:
                return None
        # torch's should_split, then alloc_found_block: the request takes the block's front.
        remaining = block.size - size
        if (
            remaining >= K_MIN_BLOCK
            if (block.small or self._expandable)
            else (size < self._max_split and remaining > K_SMALL_SIZE)
        ):
            rest = block
            block = Block(rest.addr, size, rest.stream, rest.small, rest.reservation)
            block.prev = rest.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = rest
            rest.prev = block
            rest.addr += size
            rest.size = remaining
            rest.gc_base = pool.gc_calls
            keys = pool.free.get(rest.stream)
            if keys is None:
                keys = pool.free[rest.stream] = []
            insort(keys, remaining << ADDR_BITS | rest.addr)
            pool.by_addr[rest.addr] = rest
        block.allocated = True
        block.freed = False
        block.requested = orig_size
        self.active += block.size
        return block

    def free(self, block: Block) -> None:
        """torch's ``free_block``: merge with free neighbours and cache the result."""
        block.allocated = False
        self.active -= block.size
        pool = self.pools[1] if block.small else self.pools[0]
        before = block.prev
        after = block.next
        if before is not None and not before.allocated and before.mapped == block.mapped:
            self._merge(block, before, pool)
        if after is not None and not after.allocated and after.mapped == block.mapped:
            self._merge(block, after, pool)
        block.gc_base = pool.gc_calls
        keys = pool.free.get(block.stream)
        if keys is None:
            keys = pool.free[block.stream] = []
        insort(keys, block.size << ADDR_BITS | block.addr)
        pool.by_addr[block.addr] = block

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: ``release_cached_blocks``."""
        self.release_cached_blocks()

    def release_cached_blocks(self) -> None:
        """Free every cached block that is a whole segment; unmap free expandable pages."""
        for pool in self.pools:
            to_unmap = []
            for block in pool.ordered():
                if block.reservation is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(pool, block)
            for block in to_unmap:
                self._unmap_block(pool, block)
                if block.prev is None and block.next is None and not block.mapped:
                    pool.remove_unmapped(block)
                    if block.reservation in self.reservations:
                        self.reservations.remove(block.reservation)

    # ----------------------------------------------------------------- building a start state

    def adopt_segment(
        self, addr: int, size: int, stream: int, small: bool, live: list[tuple[int, int, int]]
    ) -> dict[int, Block]:
        """Install a recorded (non-expandable) segment with its live blocks.

        ``live`` holds ``(addr, size, requested)`` of the blocks in use, in any order; the
        gaps between them become free blocks.  Returns the live blocks by address.
        """
        shift = self._shift
        if shift:
            live = [(block_addr + shift, block_size, req) for block_addr, block_size, req in live]
        pieces = self._tile(addr + shift, size, stream, small, None, live)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_checked = max(self.peak_checked, self.reserved)
        self.segments.add(addr + shift)
        return {block_addr - shift: block for block_addr, block in pieces.items()}

    def adopt_reservation(
        self,
        base: int,
        stream: int,
        small: bool,
        mapped: list[tuple[int, int]],
        live: list[tuple[int, int, int]],
    ) -> dict[int, Block]:
        """Install a recorded expandable segment: its mapped ranges ``(addr, size)`` and the
        live blocks in them; the rest of its virtual range is unmapped."""
        shift = self._shift
        if shift:
            base += shift
            mapped = [(start + shift, size) for start, size in mapped]
            live = [(block_addr + shift, block_size, req) for block_addr, block_size, req in live]
        page = K_SMALL_BUFFER if small else self.conf.large_segment_size
        reservation = Reservation(base, EXPANDABLE_RESERVATION, page, stream, small)
        self.reservations.append(reservation)
        pool = self.pools[1] if small else self.pools[0]
        live_by_range: dict[int, list[tuple[int, int, int]]] = {start: [] for start, _ in mapped}
        starts = sorted(live_by_range)
        for item in live:
            start = starts[bisect_left(starts, item[0] + 1) - 1]
            live_by_range[start].append(item)
        result: dict[int, Block] = {}
        chain: list[Block] = []
        cursor = base
        for start, size in sorted(mapped):
            if start > cursor:
                hole = Block(cursor, start - cursor, stream, small, reservation)
                hole.mapped = False
                chain.append(hole)
            pieces = self._tile(start, size, stream, small, reservation, live_by_range[start])
            result.update(pieces)
            head = self._head_of(pieces, start, pool)
            while head is not None:
                chain.append(head)
                head = head.next
            cursor = start + size
            self.reserved += size
        end = base + reservation.size
        if cursor < end:
            tail = Block(cursor, end - cursor, stream, small, reservation)
            tail.mapped = False
            chain.append(tail)
        for before, after in zip(chain, chain[1:], strict=False):
            before.next, after.prev = after, before
        for block in chain:
            if not block.mapped:
                pool.insert_unmapped(block)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_checked = max(self.peak_checked, self.reserved)
        self._bump_past(end)
        return {block_addr - shift: block for block_addr, block in result.items()}

    def adopt_opaque(self, size: int) -> None:
        """Count a segment the model does not manage (a private pool's) as reserved."""
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_checked = max(self.peak_checked, self.reserved)

    @staticmethod
    def _head_of(pieces: dict[int, Block], start: int, pool: Pool) -> Block | None:
        return pieces.get(start) or pool.by_addr.get(start)

    def _tile(
        self,
        addr: int,
        size: int,
        stream: int,
        small: bool,
        reservation: Reservation | None,
        live: list[tuple[int, int, int]],
    ) -> dict[int, Block]:
        pool = self.pools[1] if small else self.pools[0]
        blocks: list[Block] = []
        cursor = addr
        result: dict[int, Block] = {}
        for block_addr, block_size, requested in sorted(live):
            if block_addr > cursor:
                blocks.append(Block(cursor, block_addr - cursor, stream, small, reservation))
            block = Block(block_addr, block_size, stream, small, reservation)
            block.allocated = True
            block.requested = requested
            self.active += block_size
            blocks.append(block)
            result[block_addr] = block
            cursor = block_addr + block_size
        if cursor < addr + size:
            blocks.append(Block(cursor, addr + size - cursor, stream, small, reservation))
        for before, after in zip(blocks, blocks[1:], strict=False):
            before.next, after.prev = after, before
        for block in blocks:
            if not block.allocated:
                pool.insert(block)
        return result

    def _bump_past(self, end: int) -> None:
        if end >= self._next_addr:
            self._next_addr = (end + (1 << 30)) >> 21 << 21

    # -------------------------------------------------------------------------- internals

    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        if self._gc_on:
            pool.gc_calls += 1
        keys = pool.free.get(stream)
        if not keys:
            return None
        index = bisect_left(keys, size << ADDR_BITS)
        if index == len(keys):
            return None
        by_addr = pool.by_addr
        block = by_addr[keys[index] & ADDR_MASK]
        if block.reservation is not None:
            if self._expandable:
                best = self._expandable_size(block)
                while index + 1 < len(keys) and block.reservation is not None:
                    following = by_addr[keys[index + 1] & ADDR_MASK]
                    grown = self._expandable_size(following)
                    if grown >= best:
                        break
                    index += 1
                    block, best = following, grown
            else:
                index += 1
                while index < len(keys) and by_addr[keys[index] & ADDR_MASK].reservation:
                    index += 1
                if index == len(keys):
                    return None
                block = by_addr[keys[index] & ADDR_MASK]
        if size < self._max_split and block.size >= self._max_split:
            return None
        if size >= self._max_split and block.size >= size + self.conf.max_non_split_rounding:
            return None
        del keys[index]
        del by_addr[block.addr]
        return block

    @staticmethod
    def _expandable_size(block: Block) -> int:
        following = block.next
        if following is not None and not following.mapped:
            return block.size + following.size
        return block.size

    def _try_merge(self, dst: Block, src: Block | None, pool: Pool) -> None:
        if src is not None and not src.allocated and src.mapped == dst.mapped:
            self._merge(dst, src, pool)

    @staticmethod
    def _merge(dst: Block, src: Block, pool: Pool) -> None:
        """torch's ``try_merge_blocks`` once it decided to: ``dst`` takes in its free
        neighbour ``src``, which leaves the pool."""
        if src.mapped:
            keys = pool.free[src.stream]
            del keys[bisect_left(keys, src.size << ADDR_BITS | src.addr)]
            del pool.by_addr[src.addr]
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _recorded_address(self, action: str, size: int, stream: int) -> int | None:
        if self.oracle is not None:
            addr = self.oracle(action, size, stream)
            if addr is not None and addr not in self.segments:
                return addr
        return None

    def _new_address(self, size: int, stream: int) -> int | None:
        """Where a new segment goes: the oracle's address, else below the model's live ones;
        None where no room is left (only with live segments spread over more address space
        than any device has)."""
        addr = self._recorded_address("segment_alloc", size, stream)
        return addr if addr is not None else self._place_below(size)

    def _new_range_address(self, stream: int) -> int | None:
        """Where a new expandable segment's virtual range goes (above everything else); None
        once the address space is used up (only with hundreds of streams)."""
        addr = self._recorded_address("segment_map", EXPANDABLE_RESERVATION, stream)
        if addr is None:
            addr = self._next_addr
            if addr + EXPANDABLE_RESERVATION > ADDR_MASK:
                return None
            self._next_addr = (addr + EXPANDABLE_RESERVATION + (1 << 30)) >> 21 << 21
        return addr

    def _place_below(self, size: int) -> int | None:
        """A new segment at the top of the highest free gap between the live segments the
        model placed that holds it, else just below the lowest of them (the driver's habit:
        see the module docstring); None below the band."""
        placed = self._placed
        addr = -1
        above = self._top
        for start in reversed(placed):
            end = start + self._placed_sizes[start]
            candidate = (above - size) & ~(K_ROUND_LARGE - 1)
            if candidate >= end:
                addr = candidate
                break
            above = start
        if addr < 0:
            addr = (above - size) & ~(K_ROUND_LARGE - 1)
            if addr < self._top >> 1:
                return None
        insort(placed, addr)
        self._placed_sizes[addr] = size
        return addr

    def _fits(self, size: int, check_allowed: bool) -> bool:
        if check_allowed and self.limit.allowed is not None:
            if self.reserved + size > self.limit.allowed:
                return False
        return self.limit.capacity is None or self.reserved + size <= self.limit.capacity

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int) -> Block | None:
        checked = self.reserved + alloc_size
        if self.limit.allowed is not None and checked > self.limit.allowed:
            return None
        if self.conf.expandable_segments:
            block = self._allocate_expandable(pool, stream, size)
            if block is not None and checked > self.peak_checked:
                self.peak_checked = checked
            return block
        if not self._fits(alloc_size, check_allowed=False):
            return None
        addr = self._new_address(alloc_size, stream)
        if addr is None:
            return None
        if checked > self.peak_checked:
            self.peak_checked = checked
        self.reserved += alloc_size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments.add(addr)
        self.events.append(SegmentEvent("segment_alloc", addr, alloc_size, stream))
        return Block(addr, alloc_size, stream, pool.small)

    def _release_block(self, pool: Pool, block: Block) -> None:
        pool.remove(block)
        self.reserved -= block.size
        self.segments.discard(block.addr)
        if self._placed_sizes.pop(block.addr, None) is not None:
            del self._placed[bisect_left(self._placed, block.addr)]
        self.events.append(SegmentEvent("segment_free", block.addr, block.size, block.stream))

    def _release_available(self, pool: Pool, stream: int, size: int) -> bool:
        """torch's ``release_available_cached_blocks``: free oversize cached blocks."""
        if self.conf.max_split_size is None:
            return False
        key = max(size, self._max_split)
        keys = pool.free.get(stream) or []
        index = bisect_left(keys, key << ADDR_BITS)
        if index < len(keys):
            block = pool.by_addr[keys[index] & ADDR_MASK]
            if block.reservation is None:
                self._release_block(pool, block)
                return True
        released = 0
        index -= 1
        while released < key and index >= 0:
            block = pool.by_addr[keys[index] & ADDR_MASK]
            if block.size < self._max_split:
                break
            if block.reservation is None:
                released += block.size
                self._release_block(pool, block)
            index -= 1
        return released >= key

    def _garbage_collect(self) -> None:
        """torch's ``garbage_collect_cached_blocks`` (large pool, whole cached segments)."""
        allowed = self.limit.allowed or 0
        threshold = int(self.conf.garbage_collection_threshold * allowed)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.pools[0]
        candidates = [block for block in pool.ordered() if not block.is_split()]
        if not candidates:
            return
        total_age = sum(pool.gc_calls - block.gc_base for block in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for block in pool.ordered():
                if block.is_split() or block.reservation is not None:
                    continue
                age = pool.gc_calls - block.gc_base
                if age >= threshold_age:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(pool, block)

    # ----------------------------------------------------------------- expandable segments

    def _allocate_expandable(self, pool: Pool, stream: int, size: int) -> Block | None:
        candidate = self._find_expandable(pool, stream, size)
        if candidate is None:
            return None
        if not candidate.mapped:
            if not self._map(pool, candidate, min(candidate.size, size)):
                return None
        while candidate.size < size:
            following = candidate.next
            if following is None or following.mapped:
                return None  # larger than the whole virtual range
            if not self._map(pool, following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _find_expandable(self, pool: Pool, stream: int, size: int) -> Block | None:
        def usable(block: Block | None) -> bool:
            return block is not None and not block.allocated

        for addr in list(pool.unmapped.get(stream, ())):
            candidate = pool.unmapped_by_addr[addr]
            if usable(candidate.prev):
                assert candidate.prev is not None
                candidate = candidate.prev
            room = 0
            walker: Block | None = candidate
            while room < size and walker is not None and usable(walker):
                room += walker.size
                walker = walker.next
            if room >= size:
                return candidate
        page = K_SMALL_BUFFER if pool.small else self.conf.large_segment_size
        base = self._new_range_address(stream)
        if base is None:
            return None
        reservation = Reservation(base, EXPANDABLE_RESERVATION, page, stream, pool.small)
        self.reservations.append(reservation)
        block = Block(base, EXPANDABLE_RESERVATION, stream, pool.small, reservation)
        block.mapped = False
        pool.insert_unmapped(block)
        return block

    def _map(self, pool: Pool, block: Block, size: int) -> bool:
        reservation = block.reservation
        assert reservation is not None
        begin, end = reservation.pages_covering(block.addr, size)
        mapped = (end - begin) * reservation.page
        if mapped == 0 or not self._fits(mapped, check_allowed=False):
            return False
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            remaining = Block(block.addr + mapped, block.size - mapped, block.stream, block.small)
            remaining.reservation = reservation
            remaining.mapped = False
            remaining.prev, remaining.next = block, block.next
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            pool.insert_unmapped(remaining)
            block.size = mapped
        start = block.addr
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.events.append(SegmentEvent("segment_map", start, mapped, block.stream))
        return True

    def _unmap_block(self, pool: Pool, block: Block) -> None:
        reservation = block.reservation
        assert reservation is not None
        begin, end = reservation.pages_inside(block.addr, block.size)
        if begin >= end:
            return
        pool.remove(block)
        start = reservation.base + begin * reservation.page
        length = (end - begin) * reservation.page
        before = start - block.addr
        if before > 0:
            head = Block(block.addr, before, block.stream, block.small, reservation)
            head.prev, head.next = block.prev, block
            if block.prev is not None:
                block.prev.next = head
            block.prev = head
            pool.insert(head)
        after = block.size - before - length
        if after > 0:
            tail = Block(start + length, after, block.stream, block.small, reservation)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            pool.insert(tail)
        block.addr = start
        block.size = length
        block.mapped = False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert_unmapped(block)
        self.reserved -= length
        self.events.append(SegmentEvent("segment_unmap", start, length, block.stream))
