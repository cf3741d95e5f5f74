"""The fragmentation fix, replayed: a forecast that expandable segments fit says by how much;
one that they still run out drops the fix; an inconclusive replay says what to record."""

from __future__ import annotations

from pathlib import Path

from oomlens.rules.fragmentation import REPLAY_FROM_START
from oomlens.session import analyze
from tests._corpus import case_dir
from tests.analysis.whatif._recording import MiB, record, rounds, small_tensors, write

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_a_forecast_that_it_fits_is_in_the_fix(tmp_path: Path) -> None:
    # 30 segments of 64 MiB each hold 40 MiB and trap 24 MiB; the device has 2000 MiB.
    recorded, step = record(rounds(30), capacity=2000 * MiB)
    assert step == "final"
    write(recorded, tmp_path / "snapshot_rank0.pickle")
    report = analyze([tmp_path / "snapshot_rank0.pickle"])
    top = report.top
    assert top is not None and top.id == "fragmentation"
    fix = next(fix for fix in top.fixes if dict(fix.environment) == EXPANDABLE)
    # With expandable segments: 30 * 40 + 120 MiB in 20 MiB pages, of 2000 MiB.
    assert "replayed: fits with 680.00 MiB to spare" in fix.summary
    cited = [e for e in top.evidence if "replayed" in e.text]
    assert cited and cited[0].supports and cited[0].source is not None
    assert REPLAY_FROM_START not in top.missing


def test_a_forecast_that_it_still_runs_out_drops_the_fix(tmp_path: Path) -> None:
    # Small-pool fragmentation: no 2 MiB page is ever wholly free, expandable or not.
    recorded, step = record(small_tensors(), capacity=1024 * MiB)
    assert step == "final"
    write(recorded, tmp_path / "snapshot_rank0.pickle")
    report = analyze([tmp_path / "snapshot_rank0.pickle"])
    fragmentation = next(d for d in report.diagnoses if d.id == "fragmentation")
    assert all(dict(fix.environment) != EXPANDABLE for fix in fragmentation.fixes)
    against = [e for e in fragmentation.evidence if "replayed" in e.text]
    assert against and not against[0].supports
    assert "still runs out" in against[0].text
    assert fragmentation.confidence < 0.7


def test_a_replay_that_cannot_decide_asks_for_a_recording_from_the_start() -> None:
    report = analyze([case_dir("fragmentation")])
    top = report.top
    assert top is not None and top.id == "fragmentation"
    assert any(dict(fix.environment) == EXPANDABLE for fix in top.fixes)
    assert all("replayed" not in fix.summary for fix in top.fixes)
    assert REPLAY_FROM_START in top.missing
