"""The self-check on every real torch 2.11 snapshot of the corpus and the lab samples: replayed
under the setting and limit it was recorded with, the model reproduces every segment event,
block address, reserved total and OOM.  Also what each recording covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.analysis.whatif import run_whatif
from oomlens.ingest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted((ROOT / "fixtures" / "crash_logs").glob("*/snapshot_rank*.pickle"))
SAMPLES = sorted(
    path
    for path in (ROOT / "tests" / "assets" / "snapshots").glob("snapshot_t211_*.pickle")
    if "enabled_state" not in path.name
)
FROM_START = {"activation_memory"}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", CORPUS + SAMPLES, ids=[_name(p) for p in CORPUS + SAMPLES])
def test_the_model_reproduces_the_recording(path: Path) -> None:
    whatif = run_whatif(load_snapshot(path), [])
    check = whatif.self_check
    assert check.passed, check.first_mismatch
    assert check.segment_events_matched == check.segment_events
    assert check.addresses_matched == check.allocations > 0
    assert check.replayed_ooms == check.recorded_ooms != ()
    assert whatif.coverage.unplaced_blocks == 0


@pytest.mark.parametrize("path", CORPUS, ids=[_name(p) for p in CORPUS])
def test_the_coverage_and_the_limit_of_each_corpus_recording(path: Path) -> None:
    whatif = run_whatif(load_snapshot(path), [])
    case = json.loads((path.parent / "case.json").read_text())
    message = next(iter(case["measured"]["oom_messages_by_rank"].values()))
    coverage = whatif.coverage
    assert coverage.ends_at_oom
    assert coverage.from_process_start == (path.parent.name in FROM_START)
    if not coverage.from_process_start:
        assert coverage.reserved_at_start > 0 and coverage.live_blocks_at_start > 0
    limit = whatif.recorded_limit
    if message.get("allowed") is not None:
        # The message prints the limit to 2 decimals of a GiB; the trace brackets it.
        assert limit.source == "allowed" and limit.bytes is not None
        assert abs(limit.bytes - message["allowed"]) <= limit.uncertainty + 6 * 2**20
    else:
        assert limit.source == "capacity"  # another process filled the card
    recorded = whatif.recorded
    assert recorded.outcome == "oom" and recorded.oom_event_index == coverage.entries - 1
    assert recorded.reserved_unallocated_at_recorded_oom_bytes is not None
    stuck = message["reserved_unallocated"]
    assert abs(recorded.reserved_unallocated_at_recorded_oom_bytes - stuck) <= 6 * 2**20


def test_the_expandable_sample_replays_its_maps_and_unmaps() -> None:
    path = ROOT / "tests/assets/snapshots/snapshot_t211_stacks_python_expandable_oom.pickle"
    snapshot = load_snapshot(path)
    actions = {entry["action"] for entry in snapshot.raw.device_traces[0]}
    assert {"segment_map", "segment_unmap"} <= actions
    whatif = run_whatif(snapshot, [])
    assert whatif.recorded_alloc_conf == "expandable_segments:True"
    assert whatif.self_check.passed and whatif.coverage.from_process_start
