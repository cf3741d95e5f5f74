"""``PYTORCH_CUDA_ALLOC_CONF`` parsed as torch 2.11 parses it: tokens, values, the roundup
table's quirks, and torch's own refusals."""

from __future__ import annotations

import pytest

from oomlens.analysis.whatif.alloc_conf import (
    AllocConf,
    AllocConfError,
    parse_alloc_conf,
    recorded_conf,
)
from oomlens.facts.snapshot import AllocatorSettings
from oomlens.ingest.snapshot import load_snapshot

MiB = 1024**2
SAMPLES = "tests/assets/snapshots"


def test_defaults_and_the_layout_keys() -> None:
    assert parse_alloc_conf("") == AllocConf(text="")
    conf = parse_alloc_conf(
        " expandable_segments : True ,max_split_size_mb:128, garbage_collection_threshold:0.6,"
        "max_non_split_rounding_mb:64"
    )
    assert conf.expandable_segments is True
    assert conf.max_split_size == 128 * MiB
    assert conf.garbage_collection_threshold == 0.6
    assert conf.max_non_split_rounding == 64 * MiB
    assert conf.canonical() == (
        "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:64,"
        "garbage_collection_threshold:0.6"
    )
    assert parse_alloc_conf(conf.canonical()).canonical() == conf.canonical()


def test_later_keys_win_as_in_torch() -> None:
    conf = parse_alloc_conf("expandable_segments:True,expandable_segments:False")
    assert conf.expandable_segments is False


def test_roundup_single_value_fills_every_interval() -> None:
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


def test_roundup_list_first_entry_fills_below_and_gt_fills_above_the_last() -> None:
    table = parse_alloc_conf(
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
    ).roundup_power2_divisions
    # 256 MiB is interval 8: the first entry also fills 0..7; '>' fills after 1024 (index 10).
    assert table == (1,) * 9 + (2, 4) + (8,) * 5


def test_roundup_gt_first_leaves_the_first_interval_alone() -> None:
    table = parse_alloc_conf("roundup_power2_divisions:[>:2]").roundup_power2_divisions
    assert table == (0,) + (2,) * 15


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("throw_on_cudamalloc_oom:True", "Unrecognized key 'throw_on_cudamalloc_oom' in CUDA"),
        ("max_split_size_mb:10", "max_split_size_mb too small, must be >= 20"),
        ("garbage_collection_threshold:1.0", "set it in (0.0, 1.0)"),
        ("garbage_collection_threshold:0", "set it in (0.0, 1.0)"),
        ("expandable_segments:true", "Expected 'True' or 'False'"),
        ("roundup_power2_divisions:3", "has to be power of 2"),
        ("roundup_power2_divisions:[300:2]", "intervals have to be power of 2"),
        ("roundup_power2_divisions:[256:3]", "power of 2 or 0"),
        ("expandable_segments", "ends after"),
        ("max_split_size_mb:abc", "expected a number"),
        ("expandable_segments:True;max_split_size_mb:64", "Expected 'True' or 'False'"),
        ("backend:cudaMallocAsync", "replaces the caching allocator"),
        ("backend:other", "Unknown allocator backend"),
        ("per_process_memory_fraction:0.5", "--allowed"),
    ],
)
def test_what_torch_refuses_is_refused_with_its_words(text: str, message: str) -> None:
    with pytest.raises(AllocConfError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_alloc_conf(text)


def test_keys_that_do_not_move_blocks_are_accepted_and_listed() -> None:
    conf = parse_alloc_conf(
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
        "release_lock_on_cudamalloc:True,backend:native"
    )
    assert conf.canonical() == ""
    assert conf.inert == (
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "release_lock_on_cudamalloc",
    )


def test_the_recorded_table_wins_over_the_raw_string() -> None:
    settings = AllocatorSettings(
        raw_config="max_split_size_mb:128",
        expandable_segments=True,
        max_split_size=256 * MiB,
        garbage_collection_threshold=0.0,
        roundup_power2_divisions=((1, 0), (256, 4)),
        release_lock_on_cudamalloc=False,
        config_options=(),
    )
    conf, notes = recorded_conf(settings)
    assert notes == ()
    assert conf.expandable_segments is True
    assert conf.max_split_size == 256 * MiB
    assert conf.roundup_power2_divisions[8] == 4


def test_a_real_211_snapshot_records_its_settings() -> None:
    expandable = load_snapshot(f"{SAMPLES}/snapshot_t211_stacks_python_expandable_oom.pickle")
    conf, notes = recorded_conf(expandable.allocator_settings)
    assert conf.expandable_segments and conf.canonical() == "expandable_segments:True"
    plain = load_snapshot(f"{SAMPLES}/snapshot_t211_stacks_all_oom.pickle")
    assert recorded_conf(plain.allocator_settings)[0].canonical() == ""
    assert recorded_conf(None)[1]


def test_a_recorded_table_torch_would_refuse_is_set_aside_not_replayed() -> None:
    # found by the fuzzer: a damaged snapshot's table said garbage_collection_threshold 5.0,
    # and every replay built on it raised AllocConfError (an internal error in analyze)
    settings = AllocatorSettings(
        raw_config="expandable_segments:True",
        expandable_segments=True,
        max_split_size=None,
        garbage_collection_threshold=5.0,
        roundup_power2_divisions=(),
        release_lock_on_cudamalloc=False,
        config_options=(),
    )
    conf, notes = recorded_conf(settings)
    assert conf.canonical() == "expandable_segments:True"
    assert parse_alloc_conf(conf.canonical() + ",max_split_size_mb:256")
    assert any("refuses" in note and "garbage_collect" in note for note in notes)
