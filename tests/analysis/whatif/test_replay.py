"""Rewind, replay and limit inference against exact ground truth: snapshots recorded through the
allocator model (``_recording``), whose state at any event and whose behaviour under any
setting are known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.whatif import parse_alloc_conf, run_whatif
from oomlens.analysis.whatif.alloc_conf import AllocConf
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit
from oomlens.analysis.whatif.limits import infer_limit
from oomlens.analysis.whatif.rewind import rewind
from oomlens.errors import InputError
from oomlens.facts.whatif import COVERS_UP_TO_OOM, COVERS_WHOLE_RUN
from oomlens.ingest.snapshot import load_snapshot
from tests.analysis.whatif._recording import (
    MiB,
    OutOfMemory,
    RecordingMemory,
    record,
    rounds,
    small_tensors,
    write,
)


def churn(memory: Any) -> None:
    """Variable sizes in both pools, kept and freed out of order, an ``empty_cache``."""
    kept: list[int] = []
    for step in range(40):
        memory.step(f"step{step}")
        sizes = [(step * 7919) % 900_000 + 100, (step * 104_729) % (30 * MiB) + 2 * MiB]
        handles = [memory.alloc(size) for size in sizes]
        kept.append(handles[step % 2])
        memory.free(handles[1 - step % 2])
        if step % 5 == 4:
            memory.free(kept.pop(0))
        if step == 25:
            memory.empty_cache()


def state_of(memory: Any) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(segments, blocks in use) of a recorder, as (address, size) pairs."""
    segments = memory.snapshot()["segments"]
    return (
        {(segment["address"], segment["total_size"]) for segment in segments},
        {
            (block["address"], block["size"])
            for segment in segments
            for block in segment["blocks"]
            if block["state"] != "inactive"
        },
    )


@pytest.mark.parametrize("share", [0.0, 0.15, 0.5, 0.9])
def test_the_rewind_finds_the_state_at_the_first_kept_event(tmp_path: Path, share: float) -> None:
    full, _ = record(churn)
    total = len(full.trace)
    cut = int(total * share)

    class Stop(Exception):
        pass

    class Cutting(RecordingMemory):  # type: ignore[misc, valid-type]
        def _check(self) -> None:
            if len(self.trace) >= cut:
                raise Stop

        def alloc(self, *args: Any, **kwargs: Any) -> int:
            self._check()
            return int(super().alloc(*args, **kwargs))

        def free(self, handle: int) -> None:
            self._check()
            super().free(handle)

        def empty_cache(self) -> None:
            self._check()
            super().empty_cache()

    partial = Cutting(AllocConf(), Limit())
    # Cut at a call boundary: the recorder stops at the first call once ``cut`` entries exist.
    try:
        churn(partial)
    except Stop:
        pass
    kept = total - len(partial.trace)
    assert kept > 0
    truncated, _ = record(churn, max_entries=kept)
    snapshot = write(truncated, tmp_path / "cut.pickle")
    model = CachingAllocatorModel(AllocConf(), Limit())
    start = rewind(
        snapshot.raw.segments,
        snapshot.raw.device_traces[0],
        0,
        round_size=model.round_size,
        max_split_size=None,
    )
    partial.trace.clear()
    segments, in_use = state_of(partial)
    assert {(segment.addr, segment.size) for segment in start.segments} == segments
    assert {(addr, size) for segment in start.segments for addr, size, _ in segment.live} == in_use
    assert start.unplaced == 0


@pytest.mark.parametrize(
    ("workload", "limit", "settings"),
    [
        (rounds(15), 1024 * MiB, ["expandable_segments:True", "max_split_size_mb:32"]),
        (small_tensors(), 1024 * MiB, ["expandable_segments:True", "roundup_power2_divisions:4"]),
        (
            churn,
            200 * MiB,
            [
                "expandable_segments:True",
                "garbage_collection_threshold:0.5",
                "max_split_size_mb:24",
                "roundup_power2_divisions:[1:2,>:8]",
            ],
        ),
    ],
)
def test_a_replay_from_the_start_is_the_run_under_that_setting(
    tmp_path: Path, workload: Any, limit: int, settings: list[str]
) -> None:
    recorded, _ = record(workload, allowed=limit)
    snapshot = write(recorded, tmp_path / "run.pickle")
    whatif = run_whatif(snapshot, [parse_alloc_conf(text) for text in settings], allowed=limit)
    assert whatif.self_check.passed and whatif.coverage.from_process_start
    for prediction in whatif.predictions:
        direct, step = record(workload, prediction.alloc_conf, allowed=limit)
        result = prediction.result
        assert result.outcome == ("oom" if step else "fits"), prediction.alloc_conf
        assert result.peak_reserved_bytes == direct.model.peak_reserved, prediction.alloc_conf
        if step is not None:
            assert result.oom_event_index is not None
            assert snapshot.raw.device_traces[0][result.oom_event_index]["user_metadata"] == step
        assert prediction.packed_start is None
        assert prediction.conclusive == (
            result.outcome == "oom" or (result.headroom_bytes or 0) > prediction.limit.uncertainty
        )


def test_the_expandable_rescue_is_a_forecast_with_its_head_room(tmp_path: Path) -> None:
    recorded, step = record(rounds(15), allowed=1024 * MiB)
    assert step == "final"
    whatif = run_whatif(
        write(recorded, tmp_path / "r.pickle"), [parse_alloc_conf("expandable_segments:True")]
    )
    baseline, expandable = whatif.predictions
    assert baseline.baseline and baseline.result.outcome == "oom"
    assert expandable.result.outcome == "fits" and expandable.conclusive
    assert expandable.covers == COVERS_UP_TO_OOM and baseline.covers == COVERS_WHOLE_RUN
    limit = whatif.recorded_limit
    assert limit.source == "allowed" and limit.bytes is not None
    # 720 MiB reserved at the peak, but the last check counted 640 MiB reserved (600 in use, a
    # free 40 MiB tail) + the 120 MiB segment asked for: under a limit below 760 MiB the run
    # would no longer go as replayed.
    assert expandable.result.peak_reserved_bytes == 720 * MiB
    assert expandable.result.headroom_bytes == limit.bytes - 760 * MiB
    assert baseline.result.reserved_unallocated_at_recorded_oom_bytes == 960 * MiB - 600 * MiB


def test_a_limit_is_bracketed_by_the_trace(tmp_path: Path) -> None:
    allowed = 1000 * MiB + 12345
    recorded, _ = record(churn, allowed=allowed)
    recorded.step("big")
    with pytest.raises(OutOfMemory):
        recorded.alloc(1000 * MiB)
    snapshot = write(recorded, tmp_path / "l.pickle")
    model = CachingAllocatorModel(AllocConf(), Limit())
    inferred = infer_limit(
        snapshot.raw.device_traces[0],
        0,
        request_segment=lambda size: model.allocation_size(model.round_size(size)),
        gc_threshold=0.0,
    )
    assert inferred.kind == "allowed" and inferred.high is not None
    assert inferred.low <= allowed <= inferred.high


def test_a_full_device_gives_the_exact_capacity(tmp_path: Path) -> None:
    capacity = 740 * MiB
    recorded, step = record(rounds(10, final=200), capacity=capacity)
    assert step == "final"
    whatif = run_whatif(write(recorded, tmp_path / "c.pickle"), [])
    assert whatif.recorded_limit.source == "capacity"
    assert whatif.recorded_limit.bytes == capacity and whatif.recorded_limit.uncertainty == 0


def test_a_mid_run_trace_says_what_it_misses_and_tries_both_starts(tmp_path: Path) -> None:
    recorded, _ = record(rounds(15), allowed=1024 * MiB, max_entries=12)
    whatif = run_whatif(
        write(recorded, tmp_path / "m.pickle"), [parse_alloc_conf("expandable_segments:True")]
    )
    coverage = whatif.coverage
    assert not coverage.from_process_start and coverage.entries == 12
    assert coverage.reserved_at_start > 0 and coverage.live_blocks_at_start > 0
    assert whatif.self_check.passed
    expandable = whatif.predictions[1]
    assert expandable.packed_start is not None
    # Laid out as recorded, the old segments still trap their remainders; packed afresh, the
    # kept tensors fit: the part of the run before the recording decides.
    assert (expandable.result.outcome, expandable.packed_start.outcome) == ("oom", "fits")
    assert not expandable.conclusive
    assert any("before the recording decides" in note for note in expandable.notes)


def test_a_tampered_recording_fails_the_self_check(tmp_path: Path) -> None:
    recorded, _ = record(rounds(6), allowed=1024 * MiB)
    data = recorded.snapshot()
    trace = data["device_traces"][0]
    moved = next(index for index, entry in enumerate(trace) if entry["action"] == "alloc")
    trace[moved + 3]["addr"] += 512  # a block address torch would not have chosen
    path = tmp_path / "t.pickle"
    import pickle

    path.write_bytes(pickle.dumps(data))
    check = run_whatif(load_snapshot(path), []).self_check
    assert not check.passed and check.first_mismatch is not None


def test_a_state_only_snapshot_cannot_be_replayed() -> None:
    snapshot = load_snapshot("tests/assets/snapshots/snapshot_t211_enabled_state.pickle")
    with pytest.raises(InputError, match="no allocation history"):
        run_whatif(snapshot, [])


def growing_buffers(memory: Any) -> None:
    """Buffers that each outgrow the cached ones (30, 34, ... MiB), freed after use, beside a
    kept 12 MiB tensor a round: every round needs a new segment."""
    kept = []
    for index in range(14):
        memory.step(f"round{index}")
        buffer = memory.alloc((30 + 4 * index) * MiB + 4096)
        kept.append(memory.alloc(12 * MiB))
        memory.free(buffer)


def test_garbage_collection_that_fired_brackets_the_fraction(tmp_path: Path) -> None:
    # The collection releases cached segments with no failure (the run fits), which only a
    # memory fraction allows: its releases and the new segments got without one bracket it,
    # so the self-check runs the collection as torch did.
    allowed = 500 * MiB + 777
    conf = "garbage_collection_threshold:0.5"
    recorded, step = record(growing_buffers, conf, allowed=allowed)
    assert step is None
    snapshot = write(recorded, tmp_path / "gc.pickle")
    releases = [e for e in snapshot.raw.device_traces[0] if e["action"] == "segment_free"]
    assert releases  # the collection fired
    whatif = run_whatif(snapshot, [])
    limit = whatif.recorded_limit
    assert limit.fraction and limit.bytes is not None
    assert limit.bytes - limit.uncertainty <= allowed <= limit.bytes + limit.uncertainty
    assert whatif.self_check.passed, whatif.self_check.first_mismatch
