"""The allocator model follows torch's rules (``CUDACachingAllocator.cpp``): rounding, segment
sizes, best fit, splitting, ``max_split_size``, the OOM retry, limits, garbage collection and
expandable segments.  Expected values are the ones torch's code gives (worked out in each test's
comment); the model's agreement with real torch 2.11 recordings is checked in
``test_selfcheck_corpus.py``."""

from __future__ import annotations

from oomlens.analysis.whatif.alloc_conf import parse_alloc_conf
from oomlens.analysis.whatif.allocator_blocks import SYNTHETIC_TOP, Block
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit

MiB = 1024**2


def model(conf: str = "", **limit: int) -> CachingAllocatorModel:
    return CachingAllocatorModel(parse_alloc_conf(conf), Limit(**limit))


def served(allocator: CachingAllocatorModel, size: int, stream: int = 0) -> Block:
    block = allocator.malloc(size, stream)
    assert block is not None
    return block


def actions(allocator: CachingAllocatorModel) -> list[tuple[str, int]]:
    found = [(event.action, event.size) for event in allocator.events]
    allocator.events.clear()
    return found


def test_rounding_and_segment_sizes() -> None:
    plain = model()
    assert [plain.round_size(n) for n in (1, 512, 513, 1200)] == [512, 512, 1024, 1536]
    divided = model("roundup_power2_divisions:4")
    # 4 divisions between 1 MiB and 2 MiB: steps of 256 KiB.
    assert divided.round_size(1_200_000) == 1_310_720
    assert divided.round_size(2**20) == 2**20
    # round_size divides only sizes above 512 * divisions: 1200 B still rounds to 512 B steps.
    assert divided.round_size(1200) == 1536
    assert [plain.allocation_size(n) for n in (512, MiB, MiB + 512, 10 * MiB, 11 * MiB + 1)] == [
        2 * MiB,
        2 * MiB,
        20 * MiB,
        10 * MiB,
        12 * MiB,
    ]


def test_small_requests_share_a_2mib_segment_and_large_ones_get_their_own() -> None:
    allocator = model()
    first = served(allocator, 1000)
    second = served(allocator, 1000)
    assert actions(allocator) == [("segment_alloc", 2 * MiB)]
    assert second.addr == first.addr + 1024
    served(allocator, 3 * MiB)
    assert actions(allocator) == [("segment_alloc", 20 * MiB)]
    assert allocator.reserved == 22 * MiB


def test_a_large_remainder_over_1mib_is_split_off_and_one_under_is_not() -> None:
    allocator = model()
    block = served(allocator, 30 * MiB)
    allocator.free(block)
    taken = served(allocator, 29 * MiB + 512 * 1024)  # 0.5 MiB left: not split
    assert taken.size == 30 * MiB and taken.next is None
    allocator.free(taken)
    part = served(allocator, 20 * MiB)  # 10 MiB left: split
    assert part.size == 20 * MiB and part.next is not None and part.next.size == 10 * MiB
    assert actions(allocator) == [("segment_alloc", 30 * MiB)]


def test_best_fit_takes_the_smallest_block_that_fits_on_the_same_stream() -> None:
    allocator = model()
    blocks = [served(allocator, size * MiB) for size in (40, 24, 32)]
    addresses = [block.addr for block in blocks]
    for block in blocks:
        allocator.free(block)
    assert served(allocator, 25 * MiB).addr == addresses[2]  # the 32 MiB block
    allocator.events.clear()
    served(allocator, 24 * MiB, stream=7)  # another stream: a new segment
    assert actions(allocator) == [("segment_alloc", 24 * MiB)]


def test_among_equal_free_blocks_the_later_segment_is_taken() -> None:
    # Equal sizes: torch takes the lowest address, and the driver mostly gives a later segment
    # a lower address, so the model places each new segment below the live ones.
    allocator = model()
    first, second, third = (served(allocator, 30 * MiB) for _ in range(3))
    assert first.addr > second.addr > third.addr
    allocator.free(first)
    allocator.free(third)
    assert served(allocator, 30 * MiB).addr == third.addr
    # A released segment's place is used again: 60 + 40 > 70 MiB, the retry releases the
    # cached 30 MiB one, and the 40 MiB segment goes right below the one still alive.
    allocator = model(allowed=70 * MiB)
    kept, spare = served(allocator, 30 * MiB), served(allocator, 30 * MiB)
    allocator.free(spare)
    assert served(allocator, 40 * MiB).addr == kept.addr - 40 * MiB == spare.addr - 10 * MiB


def test_a_new_segment_takes_the_top_of_the_highest_gap_that_holds_it() -> None:
    # The driver's placement seen in every GPU family (rounding_wide: 768 MiB lands at the top
    # of the hole released segments left, not below the lowest live one): top-down first fit.
    allocator = model(allowed=200 * MiB)
    top, middle, low = (served(allocator, size * MiB) for size in (50, 60, 40))
    assert top.addr - 60 * MiB == middle.addr and middle.addr - 40 * MiB == low.addr
    allocator.free(middle)
    allocator.empty_cache()
    # 44 MiB fits the 60 MiB hole: at its top, right below the top segment.
    fitted = served(allocator, 44 * MiB)
    assert fitted.addr == top.addr - 44 * MiB
    # 30 MiB fits only below the lowest segment (16 MiB are left in the hole).
    assert served(allocator, 30 * MiB).addr == low.addr - 30 * MiB


def test_a_recorded_start_lies_above_the_segments_the_model_adds() -> None:
    # Predicting from a mid-run trace: the start's segments were there first, so the driver
    # would have put the new ones below them; the start's blocks still answer to their
    # recorded addresses.
    allocator = CachingAllocatorModel(parse_alloc_conf(""), Limit(), start_shift=SYNTHETIC_TOP)
    recorded = 0x7F0000000000
    live = allocator.adopt_segment(recorded, 30 * MiB, 0, False, [(recorded, 30 * MiB, 30 * MiB)])
    assert list(live) == [recorded] and live[recorded].addr == recorded + SYNTHETIC_TOP
    added = served(allocator, 30 * MiB)
    assert added.addr < recorded + SYNTHETIC_TOP
    allocator.free(added)
    allocator.free(live[recorded])
    assert served(allocator, 30 * MiB).addr == added.addr  # the tie goes to the later one


def test_no_address_room_is_an_oom_not_a_crash() -> None:
    # A band of 32 MiB for the model's own segments: the second 20 MiB one has no room.
    allocator = CachingAllocatorModel(parse_alloc_conf(""), Limit(), synthetic_top=64 * MiB)
    served(allocator, 20 * MiB)
    assert allocator.malloc(20 * MiB, 0) is None
    # Nor does a request larger than any device, with no limit known.
    assert model().malloc(1 << 60, 0) is None
    # Expandable segments on hundreds of streams: a virtual range each, until none is left.
    expandable = model("expandable_segments:True")
    outcomes = [expandable.malloc(20 * MiB, stream) is not None for stream in range(400)]
    assert outcomes[:200] == [True] * 200 and outcomes[-1] is False


def test_freed_neighbours_merge_back_into_one_block() -> None:
    allocator = model()
    whole = served(allocator, 60 * MiB)
    allocator.free(whole)
    parts = [served(allocator, 20 * MiB) for _ in range(3)]
    for part in parts:
        allocator.free(part)
    merged = served(allocator, 60 * MiB)
    assert merged.addr == whole.addr and merged.prev is None and merged.next is None


def test_max_split_size_keeps_oversize_blocks_whole_and_away_from_small_requests() -> None:
    allocator = model("max_split_size_mb:64")
    big = served(allocator, 100 * MiB)
    allocator.free(big)
    allocator.events.clear()
    small = served(allocator, 30 * MiB)  # may not take the oversize cached block
    assert small.addr != big.addr
    assert actions(allocator) == [("segment_alloc", 30 * MiB)]
    again = served(allocator, 90 * MiB)  # an oversize request accepts it, unsplit (< +20 MiB)
    assert again.addr == big.addr and again.size == 100 * MiB
    allocator.free(again)
    allocator.events.clear()
    served(allocator, 70 * MiB)  # 100 MiB >= 70 + 20: not accepted
    assert actions(allocator) == [("segment_alloc", 70 * MiB)]


def test_the_fraction_check_uses_the_whole_segment_size() -> None:
    # 2 MiB of room left, a 4 MiB request asks for a 20 MiB segment: torch refuses.
    allocator = model(allowed=22 * MiB)
    served(allocator, 20 * MiB)
    assert allocator.peak_checked == allocator.peak_reserved == 20 * MiB
    assert allocator.malloc(4 * MiB, 0) is None
    # Without a fraction, the device's free memory decides the same way.
    assert model(capacity=10 * MiB).malloc(4 * MiB, 0) is None


def test_the_oom_retry_frees_whole_cached_segments_but_not_split_ones() -> None:
    allocator = model(allowed=100 * MiB)
    whole = served(allocator, 40 * MiB)
    host = served(allocator, 40 * MiB)
    allocator.free(whole)
    allocator.free(host)
    pinned = served(allocator, 10 * MiB)  # carved from a cached 40 MiB segment: split
    allocator.events.clear()
    served(allocator, 60 * MiB)  # 80 + 60 > 100: release the whole one, then fit
    assert actions(allocator) == [("segment_free", 40 * MiB), ("segment_alloc", 60 * MiB)]
    assert pinned.next is not None and not pinned.next.allocated
    assert allocator.malloc(35 * MiB, 0) is None  # 30 MiB stuck after the pinned block
    assert allocator.reserved == 100 * MiB


def test_expandable_segments_map_pages_and_cure_the_split_pattern() -> None:
    def pattern(allocator: CachingAllocatorModel) -> Block | None:
        for _ in range(15):
            allocator.free(served(allocator, 64 * MiB))
            served(allocator, 40 * MiB)
        return allocator.malloc(120 * MiB, 0)

    plain = model(allowed=1024 * MiB)
    assert pattern(plain) is None
    assert plain.reserved == 15 * 64 * MiB
    expandable = model("expandable_segments:True", allowed=1024 * MiB)
    assert pattern(expandable) is not None
    # Pages of 20 MiB: 15 * 40 + 120 = 720 MiB in use, mapped to the page.
    assert expandable.reserved == 720 * MiB
    assert {event.action for event in expandable.events} == {"segment_map"}


def test_expandable_retry_unmaps_free_pages() -> None:
    allocator = model("expandable_segments:True", allowed=110 * MiB)
    blocks = [served(allocator, 20 * MiB) for _ in range(5)]
    allocator.free(blocks[1])
    allocator.events.clear()
    # 100 MiB mapped, one 20 MiB page free in the middle.  A 30 MiB request fits nowhere and
    # 100 + its 30 MiB segment passes the 110 MiB limit: the free page is unmapped (80 + 30
    # passes the check), then two pages are mapped after the last block, the hole being too
    # small.  The check counts the 30 MiB segment, the mapping takes 40: reserved ends above
    # the limit.  So did torch 2.11 on the H200 (fixtures/whatif/expandable_limit, run 01:
    # max_memory_reserved 120 MiB under a 110 MiB fraction; run 02: the OOM at 100 MiB).
    block = allocator.malloc(30 * MiB, 0)
    assert block is not None and block.addr == blocks[4].addr + 20 * MiB
    assert actions(allocator) == [("segment_unmap", 20 * MiB), ("segment_map", 40 * MiB)]
    assert allocator.reserved == allocator.peak_reserved == 120 * MiB
    assert allocator.peak_checked == 110 * MiB  # nothing to spare under the fraction
    # At a 100 MiB limit even the retry fails the check: the OOM.
    tight = model("expandable_segments:True", allowed=100 * MiB)
    kept = [served(tight, 20 * MiB) for _ in range(5)]
    tight.free(kept[1])
    assert tight.malloc(30 * MiB, 0) is None and tight.reserved == 80 * MiB


def test_garbage_collection_frees_old_cached_segments_above_the_threshold() -> None:
    allocator = model("garbage_collection_threshold:0.5", allowed=200 * MiB)
    old = served(allocator, 60 * MiB)
    allocator.free(old)
    for _ in range(3):  # searches age the cached block
        allocator.free(served(allocator, 2 * MiB))
    allocator.events.clear()
    served(allocator, 50 * MiB)  # takes the cached 60 MiB: no new segment, no GC
    assert actions(allocator) == []
    allocator.events.clear()
    served(allocator, 45 * MiB)  # new segment needed; 80 MiB reserved < 100: no GC yet
    kinds = [action for action, _ in actions(allocator)]
    assert kinds == ["segment_alloc"]
    blocks = [served(allocator, 30 * MiB) for _ in range(2)]
    for block in blocks:
        allocator.free(block)
    allocator.events.clear()
    served(allocator, 40 * MiB)  # above the threshold: the cached whole 30 MiB ones go first
    kinds = [action for action, _ in actions(allocator)]
    assert kinds[:2] == ["segment_free", "segment_free"] and kinds[-1] == "segment_alloc"
