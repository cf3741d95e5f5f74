"""Loading real torch 2.11 snapshots and every layout derived from them."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import pytest

from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts.snapshot import HistoryMode, SnapshotLayout, StackDepth
from oomlens.ingest.layout import rank_from_name
from oomlens.ingest.snapshot import SnapshotLimits, load_snapshot, looks_like_snapshot_pickle
from oomlens.ingest.snapshot.layout import split_alloc_conf
from tests.assets.snapshots import make_variants as variants

REAL = variants.REAL


@pytest.mark.parametrize(
    ("name", "history", "stacks", "segments", "blocks", "entries"),
    [
        # Counts read off the lab run (torch-memory-reference §3, lab log C5): 11 segments,
        # 26 blocks; traces [180, 1] with the snapshot marker, [179, 0] from the observer.
        ("stacks_all", HistoryMode.ALLOC_HISTORY, StackDepth.PYTHON_AND_NATIVE, 11, 26, 181),
        ("observer", HistoryMode.ALLOC_HISTORY, StackDepth.PYTHON_AND_NATIVE, 11, 26, 179),
        ("python_expandable", HistoryMode.ALLOC_HISTORY, StackDepth.PYTHON, 4, 30, 177),
        ("state", HistoryMode.STATE_ONLY, StackDepth.PYTHON, 11, 26, 2),
    ],
)
def test_real_snapshots_load_with_their_recording_mode(
    name: str, history: HistoryMode, stacks: StackDepth, segments: int, blocks: int, entries: int
) -> None:
    # WHEN
    snapshot = load_snapshot(REAL[name])

    # THEN
    assert snapshot.layout is SnapshotLayout.CURRENT
    assert snapshot.history is history
    assert snapshot.stacks is stacks
    assert snapshot.pickle_protocol == 4
    assert not snapshot.compressed
    assert (snapshot.segment_count, snapshot.block_count, snapshot.trace_entry_count) == (
        segments,
        blocks,
        entries,
    )
    assert snapshot.devices == (0,)
    assert snapshot.device_count == 2  # the lab host had two GPUs; device 1 was unused
    assert snapshot.file_bytes == REAL[name].stat().st_size == snapshot.pickle_bytes
    assert snapshot.source.path == str(REAL[name])


def test_allocator_settings_are_read_from_the_snapshot() -> None:
    expandable = load_snapshot(REAL["python_expandable"]).allocator_settings
    default = load_snapshot(REAL["stacks_all"]).allocator_settings

    assert expandable is not None and default is not None
    assert expandable.raw_config == "expandable_segments:True"
    assert expandable.expandable_segments is True
    assert expandable.config_options == (("expandable_segments", "True"),)
    assert default.raw_config == ""
    assert default.expandable_segments is False
    assert default.max_split_size is None  # torch records -1 for unlimited
    assert default.garbage_collection_threshold == 0.0
    assert len(default.roundup_power2_divisions) == 16
    assert all(divisions == 0 for _, divisions in default.roundup_power2_divisions)
    assert ("graph_capture_record_stream_reuse", "False") in default.other


def test_alloc_conf_is_split_as_torch_splits_it() -> None:
    assert split_alloc_conf("expandable_segments:True,max_split_size_mb:512") == (
        ("expandable_segments", "True"),
        ("max_split_size_mb", "512"),
    )
    assert split_alloc_conf(
        "roundup_power2_divisions:[256:1,512:2,>:8] garbage_collection_threshold:0.6"
    ) == (
        ("roundup_power2_divisions", "[256:1,512:2,>:8]"),
        ("garbage_collection_threshold", "0.6"),
    )
    assert split_alloc_conf("") == ()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", sorted(REAL))
def test_every_protocol_gives_the_same_snapshot(name: str, protocol: int, tmp_path: Path) -> None:
    # GIVEN the real snapshot re-dumped at another protocol
    original = load_snapshot(REAL[name])
    path = variants.redump(
        variants.load_real(name), tmp_path / f"p{protocol}.pickle", protocol=protocol
    )

    # WHEN
    redumped = load_snapshot(path)

    # THEN only the protocol and sizes differ
    assert redumped.pickle_protocol == protocol
    for field in (
        "layout",
        "history",
        "stacks",
        "devices",
        "segment_count",
        "block_count",
        "trace_entry_count",
    ):
        assert getattr(redumped, field) == getattr(original, field), field
    assert redumped.allocator_settings == original.allocator_settings


def test_gzipped_snapshot_loads(tmp_path: Path) -> None:
    path = variants.redump(
        variants.load_real("stacks_all"), tmp_path / "s.pickle.gz", protocol=4, compress=True
    )

    snapshot = load_snapshot(path)

    assert snapshot.compressed
    assert snapshot.pickle_bytes == REAL["stacks_all"].stat().st_size
    assert snapshot.file_bytes == path.stat().st_size < snapshot.pickle_bytes
    assert snapshot.block_count == 26


def test_torch20_block_history_layout(tmp_path: Path) -> None:
    path = variants.redump(
        variants.to_torch20(variants.load_real("stacks_all")), tmp_path / "t20.pickle", protocol=2
    )

    snapshot = load_snapshot(path)

    assert snapshot.layout is SnapshotLayout.BLOCK_HISTORY
    assert snapshot.history is HistoryMode.ALLOC_HISTORY
    assert snapshot.stacks is StackDepth.PYTHON_AND_NATIVE  # frames come from the history
    assert snapshot.allocator_settings is None
    assert snapshot.block_count == 26


@pytest.mark.parametrize("make", [variants.to_segment_list, variants.to_torch113])
def test_bare_segment_lists(make: object, tmp_path: Path) -> None:
    assert callable(make)
    path = variants.redump(
        make(variants.load_real("stacks_all")), tmp_path / "list.pickle", protocol=4
    )

    snapshot = load_snapshot(path)

    assert snapshot.layout is SnapshotLayout.SEGMENT_LIST
    assert snapshot.history is HistoryMode.NONE
    assert snapshot.segment_count == 11
    assert snapshot.trace_entry_count == 0


def test_several_devices(tmp_path: Path) -> None:
    merged = variants.merge_devices(
        variants.load_real("stacks_all"), variants.load_real("python_expandable")
    )
    path = variants.redump(merged, tmp_path / "two.pickle", protocol=4)

    snapshot = load_snapshot(path)

    assert snapshot.devices == (0, 1)
    assert snapshot.segment_count == 11 + 4
    assert snapshot.device_count == 2


def test_rank_comes_from_the_file_name_unless_given(tmp_path: Path) -> None:
    path = tmp_path / "snapshot_rank3.pickle"
    path.write_bytes(REAL["state"].read_bytes())

    assert load_snapshot(path).source.rank == 3
    assert load_snapshot(path, rank=7, host="node-a").source.rank == 7
    assert load_snapshot(path, host="node-a").source.host == "node-a"
    assert rank_from_name("/x/iteration_2_exit/rank12_memory_snapshot.pickle") == 12
    assert rank_from_name("/ranked/snapshot.pickle") is None


def test_looks_like_snapshot_pickle() -> None:
    for path in REAL.values():
        assert looks_like_snapshot_pickle(path.read_bytes()[:16])
    assert looks_like_snapshot_pickle(gzip.compress(REAL["state"].read_bytes())[:512])
    assert looks_like_snapshot_pickle(
        gzip.compress(REAL["state"].read_bytes())[:12]
    )  # too short to tell
    assert not looks_like_snapshot_pickle(gzip.compress(b"[rank0]: Traceback " * 50)[:512])
    assert looks_like_snapshot_pickle(pickle.dumps({"segments": []}, protocol=2)[:8])
    assert looks_like_snapshot_pickle(pickle.dumps({"segments": []}, protocol=5)[:8])
    assert not looks_like_snapshot_pickle(pickle.dumps({"segments": []}, protocol=0)[:8])
    assert not looks_like_snapshot_pickle(b'{"segments": []}')
    assert not looks_like_snapshot_pickle(b"[rank0]: Traceback (most recent call last):")
    assert not looks_like_snapshot_pickle(b"")
    assert not looks_like_snapshot_pickle(b"\x80")
    assert not looks_like_snapshot_pickle(b"\x1f\x8bnot really gzip")


# ---- shapes torch never writes ----------------------------------------------------------


def _dump(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("segments"), "no 'segments' list"),
        (lambda d: d.__setitem__("segments", {"a": 1}), "a dict as 'segments'"),
        (
            lambda d: d["segments"][2]["blocks"][0].__setitem__("size", "16777216"),
            "segments[2].blocks[0].size",
        ),
        (
            lambda d: d["segments"][3]["blocks"][0].__setitem__("state", "exploded"),
            "segments[3].blocks[0].state is 'exploded'",
        ),
        (
            lambda d: d["segments"][0].__setitem__("total_size", -1),
            "segments[0].total_size is negative",
        ),
        (
            lambda d: d["segments"][0].__setitem__("segment_type", "huge"),
            "segments[0].segment_type",
        ),
        (lambda d: d["segments"][0].__setitem__("blocks", None), "segments[0].blocks is missing"),
        # found by the fuzzer: the what-if replay adds a block's address to its size
        (
            lambda d: d["segments"][2]["blocks"][0].__setitem__("address", [1]),
            "segments[2].blocks[0].address is a list, not an int",
        ),
        (lambda d: d["segments"].__setitem__(1, [1, 2]), "segments[1] is a list, not a dict"),
        (lambda d: d.__setitem__("device_traces", "none"), "'device_traces' is a str"),
        (lambda d: d["device_traces"][0].__setitem__(0, 42), "device_traces[0][0] is a int"),
        # found by the fuzzer: an entry after the first event was read unchecked
        (lambda d: d["device_traces"][0].append(42), "device_traces[0][180] is a int"),
    ],
)
def test_wrong_shapes_are_one_clear_input_error(
    mutate: object, message: str, tmp_path: Path
) -> None:
    data = variants.load_real("stacks_all")
    assert callable(mutate)
    mutate(data)
    path = _dump(tmp_path, data)

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_plain_data_that_is_not_a_snapshot_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="holds a str, not a snapshot"):
        load_snapshot(_dump(tmp_path, "hello"))


# ---- limits -------------------------------------------------------------------------------


def test_input_size_limit(tmp_path: Path) -> None:
    with pytest.raises(ResourceLimitError, match="over the input limit"):
        load_snapshot(REAL["stacks_all"], limits=SnapshotLimits(max_input_bytes=10_000))


def test_input_size_limit_applies_after_gunzip(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pickle.gz"
    # 64 MiB of one string, a few hundred KiB compressed.
    path.write_bytes(
        gzip.compress(pickle.dumps({"segments": ["x" * (64 * 1024 * 1024)]}, protocol=4))
    )

    with pytest.raises(ResourceLimitError) as caught:
        load_snapshot(
            path, limits=SnapshotLimits(max_input_bytes=8 * 1024 * 1024, max_item_bytes=1024 * 1024)
        )

    assert str(caught.value).startswith(str(path))


def test_memory_limit_refuses_up_front_what_cannot_fit() -> None:
    with pytest.raises(ResourceLimitError, match="needs at least"):
        load_snapshot(REAL["stacks_all"], limits=SnapshotLimits(max_memory_bytes=50_000))


def test_memory_limit_stops_a_growing_load(tmp_path: Path) -> None:
    # 600k small dicts: ~6 MB of pickle that unpickle into well over 100 MB.
    path = _dump(tmp_path, {"segments": [{"a": i} for i in range(600_000)]})

    with pytest.raises(ResourceLimitError, match="more than the .* of memory allowed"):
        load_snapshot(
            path,
            limits=SnapshotLimits(
                max_memory_bytes=40 * 1024 * 1024, available_memory_fraction=None
            ),
        )


def test_time_limit(tmp_path: Path) -> None:
    path = _dump(tmp_path, {"segments": [{"a": i} for i in range(2_000_000)]})

    with pytest.raises(ResourceLimitError, match="longer than the 0.001 s limit"):
        load_snapshot(path, limits=SnapshotLimits(max_seconds=0.001))


def test_missing_and_directory_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_snapshot(tmp_path / "absent.pickle")
    with pytest.raises(InputError, match="is a directory"):
        load_snapshot(tmp_path)


def test_loaded_objects_are_frozen_out_of_the_cyclic_collector() -> None:
    import gc

    gc.unfreeze()
    try:
        load_snapshot(REAL["state"], freeze_gc=False)
        assert gc.get_freeze_count() == 0
        snapshot = load_snapshot(REAL["state"])
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
        assert snapshot.block_count == 26
    finally:
        gc.unfreeze()


def test_unfrozen_objects_go_to_the_oldest_generation_without_a_walk() -> None:
    import gc

    gc.unfreeze()
    try:
        # WHEN nothing else is frozen: the loaded lists sit in the oldest generation, where
        # young collections do not walk them, and stay collectable
        snapshot = load_snapshot(REAL["stacks_all"], freeze_gc=False)
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        assert any(item is snapshot.raw.segments for item in gc.get_objects(generation=2))

        # WHEN a forked worker's parent froze its objects: they stay frozen, untouched
        gc.freeze()
        frozen = gc.get_freeze_count()
        again = load_snapshot(REAL["stacks_all"], freeze_gc=False)
        assert gc.get_freeze_count() == frozen
        assert again.block_count == snapshot.block_count
    finally:
        gc.unfreeze()


# What a fresh process holds after importing the snapshot path, and after loading and analyzing
# a real snapshot: at 1 MB the imports are a third of the peak RSS (bench/snapshot_bench.py).
_STARTUP_PROBE = """
import sys
from oomlens.ingest.snapshot import load_snapshot
from oomlens.analysis.allocator import analyze_snapshot
analyze_snapshot(load_snapshot(sys.argv[1]))
print(" ".join(sorted(sys.modules)))
"""


def test_loading_a_snapshot_imports_nothing_only_other_inputs_need() -> None:
    import subprocess
    import sys

    # WHEN a fresh process loads and analyzes a real snapshot
    done = subprocess.run(
        [sys.executable, "-c", _STARTUP_PROBE, str(REAL["stacks_all"])],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    loaded = set(done.stdout.split())

    # THEN it never imported the log reader's pattern engine, the stream spooling, the
    # opcode lister for refusals, or any reader of logs or configs
    assert "oomlens.analysis.allocator" in loaded
    assert not loaded & {"regex", "tempfile", "shutil", "pickletools"}
    assert not {name for name in loaded if name.startswith(("oomlens.ingest.log", "pandas"))}
