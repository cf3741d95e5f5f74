"""What both passes of the allocator analytics share: the options, the tallies of live memory by
attribution, the events that change the allocator's state, and the caching allocator's size
arithmetic restated from c10/cuda/CUDACachingAllocator.cpp (how a request is rounded, which pool
serves it, how large a segment it asks the driver for: the OOM message's "Tried to allocate")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomlens.analysis.stacks import Attribution
from oomlens.facts.snapshot import (
    AllocatorSettings,
    BlockInfo,
    CallSite,
    CategoryBytes,
    FreeSpace,
    MemoryCategory,
    MemoryState,
    Pool,
    SegmentInfo,
    SiteBytes,
)

MiB = 1024**2

# Caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp).
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_LARGE_BUFFER = 20 * MiB
K_ROUND_LARGE = 2 * MiB
_DIVISION_INTERVALS = 16  # roundup_power2_divisions buckets: [1 MiB, 2 MiB), ... [32 GiB, inf)


def division_table(settings: AllocatorSettings | None) -> tuple[int, ...]:
    """The 16 ``roundup_power2_divisions`` values by interval (all 0 when unset or unknown)."""
    table = [0] * _DIVISION_INTERVALS
    if settings is not None:
        for lower_mib, divisions in settings.roundup_power2_divisions:
            if lower_mib > 0 and divisions > 0:
                index = lower_mib.bit_length() - 1
                if 0 <= index < _DIVISION_INTERVALS:
                    table[index] = divisions
    return tuple(table)


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """The block size the allocator carves for a ``size``-byte request (torch's ``round_size``).

    At least 512 bytes, a multiple of 512, or the next power-of-2 division when
    ``roundup_power2_divisions`` is set for the size's interval (``divisions`` as from
    :func:`division_table`).
    """
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions:
        index = min(max(size.bit_length() - 1 - 20, 0), _DIVISION_INTERVALS - 1)
        count = divisions[index]
        if count > 1 and size > K_MIN_BLOCK_SIZE * count:
            return _roundup_power2_next_division(size, count)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def allocation_size(rounded_size: int) -> int:
    """The segment size torch cudaMallocs for a request (``get_allocation_size``).

    This is the "Tried to allocate" figure of the OOM message: 2 MiB for requests up to
    1 MiB, 20 MiB below 10 MiB, else the request rounded up to a multiple of 2 MiB.
    """
    if rounded_size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded_size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded_size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def pool_for(rounded_size: int) -> Pool:
    """Which pool a request is served from (small: <= 1 MiB)."""
    return Pool.SMALL if rounded_size <= K_SMALL_SIZE else Pool.LARGE


@dataclass(frozen=True, slots=True)
class AllocatorOptions:
    """Knobs of the analysis; the defaults suit reports.

    ``top_n`` bounds every list (sites, blocks, segments, leak sites); ``timeline_points``
    the downsampled curve.  A leak needs ``min_leak_iterations`` complete iterations, a share
    ``leak_growing_fraction`` of them growing, a median growth of at least
    ``min_leak_bytes_per_iteration``, and at least one call site with survivors in that same
    share of the iterations.
    """

    top_n: int = 20
    timeline_points: int = 256
    min_leak_iterations: int = 3
    leak_growing_fraction: float = 0.75
    min_leak_bytes_per_iteration: int = 512
    max_boundaries: int = 64


class Tally:
    """Bytes and blocks per attribution, folded into sites and categories at the end."""

    def __init__(self) -> None:
        self.by_attribution: dict[int, list[Any]] = {}

    def add(self, attribution: Attribution, size: int) -> None:
        slot = self.by_attribution.get(id(attribution))
        if slot is None:
            self.by_attribution[id(attribution)] = [attribution, size, 1, {size: 1}]
        else:
            slot[1] += size
            slot[2] += 1
            sizes = slot[3]
            sizes[size] = sizes.get(size, 0) + 1

    def total(self) -> int:
        return sum(slot[1] for slot in self.by_attribution.values())

    def by_site(self, top_n: int) -> tuple[SiteBytes, ...]:
        sites: dict[CallSite | None, list[Any]] = {}
        for attribution, size, blocks, block_sizes in self.by_attribution.values():
            slot = sites.setdefault(attribution.site, [0, 0, {}, {}])
            slot[0] += size
            slot[1] += blocks
            slot[2][attribution.category] = slot[2].get(attribution.category, 0) + size
            for block_size, count in block_sizes.items():
                slot[3][block_size] = slot[3].get(block_size, 0) + count
        ranked = sorted(sites.items(), key=lambda item: (-item[1][0], site_key(item[0])))
        result = []
        for site, (size, blocks, categories, block_sizes) in ranked[:top_n]:
            category = max(categories.items(), key=lambda kv: (kv[1], kv[0].value))[0]
            common_size, common_count = max(block_sizes.items(), key=lambda kv: (kv[1], kv[0]))
            result.append(SiteBytes(site, size, blocks, category, common_size, common_count))
        return tuple(result)

    def by_category(self) -> tuple[CategoryBytes, ...]:
        categories: dict[MemoryCategory, list[Any]] = {}
        for attribution, size, blocks, _ in self.by_attribution.values():
            slot = categories.setdefault(attribution.category, [0, 0, {}])
            slot[0] += size
            slot[1] += blocks
            key = (attribution.evidence, attribution.confidence)
            slot[2][key] = slot[2].get(key, 0) + size
        result = []
        for category, (size, blocks, evidence) in categories.items():
            (text, confidence), _ = max(evidence.items(), key=lambda kv: (kv[1], kv[0][0]))
            result.append(CategoryBytes(category, size, blocks, confidence, text))
        result.sort(key=lambda item: (-item.bytes, item.category.value))
        return tuple(result)


def site_key(site: CallSite | None) -> tuple[str, int, str]:
    return ("", 0, "") if site is None else (site.filename, site.line, site.name)


@dataclass(slots=True)
class Held:
    state: MemoryState
    by_site: tuple[SiteBytes, ...]
    by_category: tuple[CategoryBytes, ...]
    top_blocks: tuple[BlockInfo, ...]
    pinned_segments: tuple[SegmentInfo, ...]
    free_space: dict[tuple[Pool, int, tuple[int, int]], FreeSpace]
    size_mismatch: bool


STATE_CHANGING = frozenset(
    {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    }
)
