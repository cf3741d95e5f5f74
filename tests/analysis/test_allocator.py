"""Allocator analytics on real torch 2.11 snapshots, their derived layouts, and synthetic histories.

Expected numbers come from torch itself wherever it recorded them: the per-segment
``allocated_size``/``active_size``/``requested_size`` fields, the ``snapshot`` trace marker
(total active bytes), and the OOM observer's arguments printed in the lab log.
"""

from __future__ import annotations

import copy
import importlib.util
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.allocator import (
    AllocatorOptions,
    allocation_size,
    analyze_snapshot,
    division_table,
    pool_for,
    round_size,
)
from oomlens.errors import InputError
from oomlens.facts import SourceRef
from oomlens.facts.snapshot import (
    AllocatorSettings,
    DeviceAnalysis,
    HistoryMode,
    MemoryCategory,
    Pool,
    SnapshotAnalysis,
    StackDepth,
)
from oomlens.ingest.snapshot import load_snapshot
from oomlens.ingest.snapshot.layout import build_snapshot
from tests.assets.snapshots import make_variants as variants

MiB = 1024**2

# lab_log_torch2.11_h200.txt, C1_snap_all:
#   "OOM OBSERVER args: 0 1099511627776 150109880320 149060452352"
# = (device, alloc_size, total, device_free); its message: "Tried to allocate 1024.00 GiB".
OBSERVER_ALLOC_SIZE = 1099511627776
OBSERVER_DEVICE_FREE = 149060452352
# C2_snap_py_expandable: "OOM OBSERVER args: 0 1099511627776 150109880320 149014315008"
EXPANDABLE_DEVICE_FREE = 149014315008


def _analyze(
    data: Any, path: str = "snapshot.pickle", options: AllocatorOptions | None = None
) -> SnapshotAnalysis:
    snapshot = build_snapshot(
        data, source=SourceRef(path), protocol=4, compressed=False, file_bytes=0, pickle_bytes=0
    )
    return analyze_snapshot(snapshot, options)


def _only(analysis: SnapshotAnalysis) -> DeviceAnalysis:
    assert len(analysis.devices) == 1
    return analysis.devices[0]


def _live_blocks(data: Any, device: int = 0) -> list[dict[str, Any]]:
    return [
        block
        for segment in data["segments"]
        if segment["device"] == device
        for block in segment["blocks"]
        if block["state"] != "inactive"
    ]


def _frames_named(block: dict[str, Any], name: str) -> bool:
    return any(frame["name"] == name for frame in block["frames"])


# ---- state at the snapshot: torch's own per-segment numbers ------------------------------


@pytest.mark.parametrize("name", sorted(variants.REAL))
def test_state_matches_torchs_segment_fields(name: str) -> None:
    data = variants.load_real(name)
    state = _only(analyze_snapshot(load_snapshot(variants.REAL[name]))).state
    segments = data["segments"]

    assert state.reserved_bytes == sum(s["total_size"] for s in segments)
    assert state.allocated_bytes == sum(s["allocated_size"] for s in segments)
    assert state.active_bytes == sum(s["active_size"] for s in segments)
    assert state.requested_bytes == sum(s["requested_size"] for s in segments)
    assert state.segments == len(segments)
    # Free space inside a segment that still holds a live block cannot be released.
    pinned = [s for s in segments if s["active_size"] and not s["is_expandable"]]
    assert state.unreleasable_free_bytes == sum(s["total_size"] - s["active_size"] for s in pinned)
    assert state.expandable_free_bytes == sum(
        s["total_size"] - s["active_size"] for s in segments if s["is_expandable"]
    )
    # The identities documented on MemoryState.
    assert (
        state.reserved_bytes == state.allocated_bytes + state.pending_free_bytes + state.free_bytes
    )
    assert (
        state.free_bytes
        == state.unreleasable_free_bytes + state.expandable_free_bytes + state.releasable_free_bytes
    )
    assert (
        state.reserved_unallocated_bytes
        == state.reserved_bytes - state.allocated_bytes - state.private_pool_free_bytes
    )


@pytest.mark.parametrize("name", ["stacks_all", "python_expandable", "state"])
def test_active_bytes_equal_torchs_snapshot_marker(name: str) -> None:
    data = variants.load_real(name)
    marker = next(e for e in data["device_traces"][0] if e["action"] == "snapshot")

    assert _only(_analyze(data)).state.active_bytes == marker["size"]


def test_observer_snapshot_numbers() -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL["observer"])))
    state = device.state

    assert (
        state.reserved_bytes == 188743680
    )  # 180.0MiB: `_memory_viz stats` total_reserved in the lab log
    assert state.unreleasable_free_bytes == 4 * MiB + (
        2 * MiB - 82432
    )  # a 20 MiB and a 2 MiB segment
    assert state.unreleasable_segments == 2
    assert state.releasable_free_bytes == 0  # the OOM retry released every whole free segment
    assert state.split_segments == 3
    assert state.largest_free_block == 4 * MiB
    assert {pool.pool: pool.segments for pool in state.pools} == {Pool.LARGE: 9, Pool.SMALL: 2}
    assert state.expandable_segments == 0 and state.private_pools == ()


def test_oom_request_matches_the_oom_observer() -> None:
    oom = _only(analyze_snapshot(load_snapshot(variants.REAL["observer"]))).oom

    assert oom is not None
    assert oom.request_bytes == 2**40  # torch.empty(2**40 bytes)
    assert oom.alloc_size_bytes == OBSERVER_ALLOC_SIZE
    assert oom.device_free_bytes == OBSERVER_DEVICE_FREE
    assert oom.pool is Pool.LARGE and oom.stream == 0
    assert oom.snapshot_at_oom
    assert oom.largest_free_block == 4 * MiB
    assert not oom.fits_largest_free_block
    assert oom.site is not None and oom.site.is_user_code
    assert oom.site.filename.endswith("C1_snap_all.py")


def test_expandable_snapshot() -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL["python_expandable"])))

    assert device.state.expandable_segments == 4
    assert device.state.unreleasable_free_bytes == 0
    assert device.state.expandable_free_bytes == device.state.free_bytes > 0
    assert device.oom is not None and device.oom.device_free_bytes == EXPANDABLE_DEVICE_FREE


# ---- who holds the memory -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(variants.REAL))
def test_attribution_accounts_for_every_live_byte(name: str) -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL[name])))

    assert sum(item.bytes for item in device.live_by_site) == device.state.active_bytes
    assert sum(item.bytes for item in device.live_by_category) == device.state.active_bytes
    assert sum(item.blocks for item in device.live_by_category) == device.state.live_blocks


@pytest.mark.parametrize("name", ["stacks_all", "python_expandable", "state"])
def test_optimizer_state_is_what_adam_init_group_allocated(name: str) -> None:
    data = variants.load_real(name)
    expected = sum(b["size"] for b in _live_blocks(data) if _frames_named(b, "_init_group"))

    categories = {item.category: item for item in _only(_analyze(data)).live_by_category}

    optimizer = categories[MemoryCategory.OPTIMIZER_STATE]
    assert optimizer.bytes == expected > 0
    assert "_init_group" in optimizer.evidence
    parameters = categories[MemoryCategory.PARAMETERS]
    assert parameters.bytes == sum(
        b["size"] for b in _live_blocks(data) if _frames_named(b, "_apply")
    )


def test_cublas_workspaces_with_native_stacks() -> None:
    data = variants.load_real("stacks_all")
    # setWorkspaceForHandle (cuBLAS, 32 MiB on Hopper) and getCUDABlasLtWorkspace (cuBLASLt).
    workspaces = [
        b
        for b in _live_blocks(data)
        if any(
            frame["name"].startswith(
                ("at::cuda::setWorkspaceForHandle", "at::cuda::getCUDABlasLtWorkspace")
            )
            for frame in b["frames"]
        )
    ]
    device = _only(_analyze(data))

    workspace = next(
        item for item in device.live_by_category if item.category is MemoryCategory.WORKSPACE
    )
    assert workspace.bytes == sum(b["size"] for b in workspaces) == 2 * 32 * MiB + MiB
    # The one allocated on the autograd thread has no Python frame: its site is the node.
    backward = next(
        item for item in device.live_by_site if item.site is not None and item.site.is_native
    )
    assert backward.site is not None
    assert backward.site.describe() == "AddmmBackward0::apply (native)"
    assert backward.category is MemoryCategory.WORKSPACE


def test_python_stacks_leave_backward_allocations_without_a_site() -> None:
    data = variants.load_real("python_expandable")
    expected = sum(b["size"] for b in _live_blocks(data) if not b["frames"])

    device = _only(_analyze(data))

    no_stack = next(item for item in device.live_by_site if item.site is None)
    assert no_stack.bytes == expected > 0
    assert no_stack.category is MemoryCategory.UNKNOWN
    unknown = next(
        item for item in device.live_by_category if item.category is MemoryCategory.UNKNOWN
    )
    assert unknown.bytes >= expected
    assert "autograd (backward) thread" in unknown.evidence


def test_sites_are_user_frames() -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL["stacks_all"])))

    python_sites = [
        item.site
        for item in device.live_by_site
        if item.site is not None and not item.site.is_native
    ]
    assert python_sites and all(site.is_user_code for site in python_sites)
    assert all(site.filename == "/tmp/oomlab/C1_snap_all.py" for site in python_sites)
    top = device.top_blocks[0]
    assert top.size == 32 * MiB and top.site is not None


# ---- history --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["stacks_all", "observer", "python_expandable"])
def test_replayed_history_ends_where_the_segments_are(name: str) -> None:
    # The lab scripts recorded from before their first CUDA allocation, so replaying every
    # event from zero must land exactly on the snapshot's reserved and active bytes.
    device = _only(analyze_snapshot(load_snapshot(variants.REAL[name])))
    timeline = device.timeline

    assert timeline is not None
    assert timeline.baseline_reserved_bytes == 0
    assert timeline.baseline_active_bytes == 0
    assert timeline.unmatched_frees == 0
    assert timeline.end.active_bytes == device.state.active_bytes
    assert timeline.peak_active.active_bytes >= timeline.end.active_bytes
    assert timeline.peak_reserved.reserved_bytes >= device.state.reserved_bytes
    assert all(
        sample.active_bytes <= timeline.peak_active.active_bytes for sample in timeline.samples
    )
    assert timeline.ooms == 1


def test_history_counts_of_the_observer_snapshot() -> None:
    timeline = _only(analyze_snapshot(load_snapshot(variants.REAL["observer"]))).timeline

    assert timeline is not None
    # lab log C5: actions {'segment_alloc': 17, 'alloc': 67, 'free_requested': 44,
    # 'free_completed': 44, 'segment_free': 6, 'oom': 1}
    assert (timeline.allocs, timeline.frees, timeline.segment_allocs, timeline.segment_frees) == (
        67,
        44,
        17,
        6,
    )
    assert timeline.entries == 179
    assert timeline.first_time_us == 1796014722452564


def test_iterations_from_optimizer_step_annotations() -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL["stacks_all"])))

    assert device.iterations is not None
    assert device.iterations.source == "annotations"
    assert device.iterations.marker == "Optimizer.step#Adam.step"
    assert device.iterations.complete == 1
    assert device.leak is None  # one iteration proves nothing
    assert device.iteration_growth is not None
    assert device.iteration_growth.basis == "last_iteration"
    assert device.growth is not None and device.growth.basis == "since_lowest_point"
    assert (
        device.growth.live_new_bytes == device.state.active_bytes
    )  # everything grew since the start


def test_state_only_snapshot_has_no_timeline() -> None:
    device = _only(analyze_snapshot(load_snapshot(variants.REAL["state"])))

    assert device.history is HistoryMode.STATE_ONLY
    assert device.timeline is None and device.growth is None and device.leak is None
    assert "state_only" in device.notes
    assert device.oom is None


def test_observer_dump_in_state_mode_keeps_its_one_oom_entry() -> None:
    # enabled='state' from an OOM observer: the one-entry ring buffer holds the oom entry.
    data = variants.load_real("state")
    oom_entry = copy.deepcopy(
        next(e for e in variants.load_real("observer")["device_traces"][0] if e["action"] == "oom")
    )
    data["device_traces"] = [[oom_entry], []]

    device = _only(_analyze(data))

    assert device.history is HistoryMode.STATE_ONLY
    assert device.oom is not None and device.oom.snapshot_at_oom
    assert device.oom.alloc_size_bytes == OBSERVER_ALLOC_SIZE


# ---- every layout gives the same facts -----------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_protocols_give_identical_analyses(protocol: int, tmp_path: Path) -> None:
    data = variants.load_real("stacks_all")
    reference = analyze_snapshot(load_snapshot(variants.REAL["stacks_all"]))
    path = variants.redump(data, tmp_path / "p.pickle", protocol=protocol)

    analysis = analyze_snapshot(load_snapshot(path))

    assert analysis.devices[0].state == reference.devices[0].state
    assert analysis.devices[0].live_by_site == reference.devices[0].live_by_site
    assert analysis.devices[0].timeline == reference.devices[0].timeline


def test_torch20_layout_gives_the_same_state_and_holders() -> None:
    data = variants.load_real("stacks_all")
    current = _only(_analyze(data))

    legacy = _only(_analyze(variants.to_torch20(data)))

    assert legacy.state == current.state
    assert legacy.live_by_site == current.live_by_site
    assert legacy.live_by_category == current.live_by_category
    assert legacy.oom is not None and legacy.oom.alloc_size_bytes == OBSERVER_ALLOC_SIZE
    assert legacy.timeline is not None and legacy.timeline.first_time_us is None
    assert legacy.timeline.baseline_active_bytes == 0
    assert "no_timestamps" in legacy.notes


@pytest.mark.parametrize("make", [variants.to_segment_list, variants.to_torch113])
def test_segment_lists_give_the_same_state(make: Any) -> None:
    data = variants.load_real("stacks_all")
    current = _only(_analyze(data))

    device = _only(_analyze(make(data)))

    assert device.state == current.state
    assert device.live_by_site == current.live_by_site
    assert device.history is HistoryMode.NONE and device.timeline is None
    assert "no_history" in device.notes


def test_two_devices_are_analyzed_separately() -> None:
    first, second = variants.load_real("stacks_all"), variants.load_real("python_expandable")

    analysis = _analyze(variants.merge_devices(first, second))

    assert [device.device for device in analysis.devices] == [0, 1]
    for index, single in enumerate((_only(_analyze(first)), _only(_analyze(second)))):
        merged = analysis.device(index)
        assert merged is not None
        assert merged.state == single.state
        assert merged.live_by_site == single.live_by_site
        assert merged.oom == single.oom
        assert merged.timeline == single.timeline
        assert merged.iterations == single.iterations
    assert analysis.device(2) is None


# ---- states made from real ones by code ------------------------------------------------------


def test_pending_free_block() -> None:
    data = variants.load_real("observer")
    side_stream = next(s for s in data["segments"] if s["stream"] != 0)
    side_stream["blocks"][0]["state"] = "active_pending_free"  # freed, waiting on record_stream
    size = side_stream["blocks"][0]["size"]
    before = _only(_analyze(variants.load_real("observer"))).state

    device = _only(_analyze(data))

    assert device.state.pending_free_bytes == size == 12 * MiB
    assert device.state.pending_free_blocks == 1
    assert device.state.allocated_bytes == before.allocated_bytes - size
    assert device.state.active_bytes == before.active_bytes
    assert device.state.reserved_unallocated_bytes == before.reserved_unallocated_bytes + size
    assert "pending_frees" in device.notes


def test_private_pool_segment() -> None:
    data = variants.load_real("observer")
    split = next(s for s in data["segments"] if s["total_size"] == 20 * MiB)
    split["segment_pool_id"] = (1, 0)  # a CUDA graph's pool
    before = _only(_analyze(variants.load_real("observer"))).state

    device = _only(_analyze(data))

    assert device.state.private_pool_free_bytes == 4 * MiB
    assert device.state.reserved_unallocated_bytes == before.reserved_unallocated_bytes - 4 * MiB
    (pool,) = device.state.private_pools
    assert (pool.pool_id, pool.segments, pool.reserved_bytes, pool.free_bytes) == (
        (1, 0),
        1,
        20 * MiB,
        4 * MiB,
    )
    # A default-pool request cannot use the graph pool's free block.
    assert device.oom is not None and device.oom.largest_free_block == 0


def test_request_that_fits_a_free_block() -> None:
    data = variants.load_real("observer")
    oom = next(e for e in data["device_traces"][0] if e["action"] == "oom")
    oom["size"] = MiB  # a small-pool request: the 1049088-byte free block could hold it

    device = _only(_analyze(data))

    assert device.oom is not None
    assert device.oom.pool is Pool.SMALL
    assert device.oom.alloc_size_bytes == 2 * MiB
    assert device.oom.largest_free_block == 1049088
    assert device.oom.fits_largest_free_block


def test_events_after_the_oom() -> None:
    data = variants.load_real("observer")
    trace = data["device_traces"][0]
    last_alloc = next(e for e in reversed(trace) if e["action"] == "alloc")
    later = dict(last_alloc, addr=last_alloc["addr"] + 4096, time_us=trace[-1]["time_us"] + 5)
    trace.append(later)

    device = _only(_analyze(data))

    assert device.oom is not None and not device.oom.snapshot_at_oom
    assert "oom_not_at_snapshot" in device.notes
    assert device.growth is not None and device.growth.end.index == device.oom.trace_index


def test_several_ooms() -> None:
    data = variants.load_real("observer")
    trace = data["device_traces"][0]
    oom = next(e for e in trace if e["action"] == "oom")
    trace.insert(100, dict(oom, size=64 * MiB))

    device = _only(_analyze(data))

    assert device.earlier_ooms == 1
    assert device.oom is not None and device.oom.request_bytes == 2**40


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda trace: trace[5].__setitem__("size", "4096"),
            r"device_traces\[0\]\[5\]\.size is a str",
        ),
        (lambda trace: trace[7].pop("addr"), r"device_traces\[0\]\[7\]\.addr is missing"),
        (lambda trace: trace[9].pop("action"), r"device_traces\[0\]\[9\] has no 'action'"),
    ],
)
def test_malformed_trace_entries(mutate: Any, message: str) -> None:
    data = variants.load_real("observer")
    mutate(data["device_traces"][0])

    with pytest.raises(InputError, match=message) as caught:
        _analyze(data, path="rank0.pickle")

    assert str(caught.value).startswith("rank0.pickle: ")


# ---- allocator arithmetic --------------------------------------------------------------------


def test_round_size() -> None:
    assert round_size(1) == 512
    assert round_size(4) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(4000) == 4096
    no_divisions = division_table(None)
    assert round_size(1258291, no_divisions) == 1258496  # plain 512 multiple
    four = division_table(_settings(((1, 4),)))
    assert round_size(1258291, four) == 1310720  # 1 MiB + 2 * 256 KiB: the next quarter step
    assert round_size(2 * MiB, four) == 2 * MiB  # powers of two stay
    assert round_size(1200, four) == 1536  # below 512 * divisions: plain rounding


def _settings(divisions: tuple[tuple[int, int], ...]) -> AllocatorSettings:
    return AllocatorSettings("", None, None, None, divisions, None, ())


def test_allocation_size_is_what_the_oom_message_prints() -> None:
    assert allocation_size(round_size(64 * 64 * 4)) == 2 * MiB  # lab: "Tried to allocate 2.00 MiB"
    assert (
        allocation_size(round_size(3 * MiB)) == 20 * MiB
    )  # lab: a small cuDNN workspace, "20.00 MiB"
    assert allocation_size(round_size(int(1.5 * 2**30))) == int(1.5 * 2**30)  # lab B2: "1.50 GiB"
    assert allocation_size(11 * MiB + 1) == 12 * MiB
    assert pool_for(MiB) is Pool.SMALL and pool_for(MiB + 512) is Pool.LARGE


# ---- synthetic histories with known ground truth ---------------------------------------------


def _bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "snapshot_bench.py"
    spec = importlib.util.spec_from_file_location("snapshot_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["snapshot_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> Any:
    return _bench()


@pytest.mark.parametrize("stacks", ["all", "python"])
def test_leak_found_from_annotations(bench: Any, stacks: str) -> None:
    data = bench.generate_snapshot(3 * MiB, stacks=stacks, leak_per_iteration=40)

    device = _only(_analyze(data, options=AllocatorOptions(top_n=500)))

    assert device.iterations is not None and device.iterations.source == "annotations"
    assert device.leak is not None
    assert device.leak.bytes_per_iteration == 40 * 512
    assert device.leak.growing_fraction == 1.0
    top = device.leak.sites[0]
    assert top.site is not None
    assert (top.site.filename, top.site.line, top.site.name) == bench.LEAK_SITE
    assert top.bytes_per_iteration == 40 * 512
    assert top.iterations_with_survivors == device.leak.iterations
    # The snapshot state alone shows the pile-up too: one site, many equal small blocks.
    holder = next(item for item in device.live_by_site if item.site == top.site)
    assert holder.common_size == 512
    assert holder.common_size_blocks >= 40 * device.leak.iterations
    assert "history_wrapped" in device.notes  # the ring buffer dropped the oldest events


def test_leak_found_from_the_allocation_pattern(bench: Any) -> None:
    data = bench.generate_snapshot(3 * MiB, leak_per_iteration=40)
    data["external_annotations"] = []

    device = _only(_analyze(data))

    assert device.iterations is not None and device.iterations.source == "alloc_pattern"
    assert device.leak is not None and device.leak.bytes_per_iteration == 40 * 512


def test_no_leak_without_one(bench: Any) -> None:
    data = bench.generate_snapshot(3 * MiB, leak_per_iteration=0)

    device = _only(_analyze(data))

    assert device.iterations is not None and device.iterations.complete >= 3
    assert device.leak is None
    assert set(device.iterations.active_at_boundaries) == {
        device.iterations.active_at_boundaries[0]
    }


def test_synthetic_snapshot_round_trips_through_the_loader(bench: Any, tmp_path: Path) -> None:
    data = bench.generate_snapshot(2 * MiB)
    path = tmp_path / "synthetic_rank1.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))

    analysis = analyze_snapshot(load_snapshot(path), AllocatorOptions(top_n=5))

    device = analysis.devices[0]
    assert analysis.source.rank == 1
    assert len(device.live_by_site) <= 5 and len(device.top_blocks) <= 5
    assert device.timeline is not None and len(device.timeline.samples) <= 257
    assert device.timeline.end.active_bytes == device.state.active_bytes


def test_corpus_shaped_bench_snapshot_is_a_valid_deep_stack_recording(
    bench: Any, tmp_path: Path
) -> None:
    # The issue-15 benchmark input: copies of the corpus's real recordings with real native
    # unwinds in front of their stacks.  It must pass every check of the loader (no object
    # repeated, every field typed as torch writes it) and read as a stacks='all' recording.
    data = bench.generate_corpus_snapshot(2 * MiB, stacks="all")
    path = tmp_path / "corpus_shaped_rank0.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))

    snapshot = load_snapshot(path)
    analysis = analyze_snapshot(snapshot)

    assert snapshot.stacks is StackDepth.PYTHON_AND_NATIVE
    assert snapshot.devices == (0,)
    assert 1 * MiB < snapshot.pickle_bytes < 4 * MiB
    assert snapshot.trace_entry_count > 3 * snapshot.block_count > 0
    device = analysis.devices[0]
    assert device.oom is not None and device.earlier_ooms == 0  # only the last copy keeps its OOM
    assert device.timeline is not None and device.timeline.allocs > 1000
