"""A recording's allocator settings table as torch writes it, and damaged (fuzz finding
snapshot-155 of campaign G: an infinite division count made the whole snapshot unreadable)."""

from __future__ import annotations

import math

from oomlens.ingest.snapshot.layout import parse_allocator_settings


def test_division_counts_that_are_no_integers_are_left_out() -> None:
    settings = parse_allocator_settings(
        {
            "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:4,>:1]",
            "roundup_power2_divisions": {256: math.inf, 512: math.nan, 1024: "x", 2048: 4},
        }
    )
    assert settings.roundup_power2_divisions == ((2048, 4),)


def test_a_threshold_too_large_for_a_float_is_left_out() -> None:
    """Fuzz finding snapshot-416 of campaign H: an integer threshold past a float's range."""
    assert (
        parse_allocator_settings(
            {"garbage_collection_threshold": 10**400}
        ).garbage_collection_threshold
        is None
    )
    assert (
        parse_allocator_settings({"garbage_collection_threshold": 0.6}).garbage_collection_threshold
        == 0.6
    )
