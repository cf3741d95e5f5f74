"""A snapshot alone whose OOM request is larger than the card: one oversized allocation.

A snapshot's ``oom`` entry records the request and what the device had free, not the card's
size.  A request above free + reserved could mean other processes held the rest, unless no
card could hold it: a request above the card (``--gpu-memory``) or above the most memory any
accelerator has is a tensor far larger than intended, whatever others held.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from oomlens.session import AnalysisOptions, analyze
from tests._corpus import case_dir

GiB = 2**30


def _snapshot(tmp_path: Path, request: int, free: int) -> Path:
    # a real torch 2.11 snapshot (activation_memory, rank 0) whose OOM entry asks for ``request``
    data = pickle.loads((case_dir("activation_memory") / "snapshot_rank0.pickle").read_bytes())
    for trace in data["device_traces"]:
        for entry in trace:
            if entry["action"] == "oom":
                entry["size"], entry["device_free"] = request, free
    path = tmp_path / "snapshot_rank0.pickle"
    path.write_bytes(pickle.dumps(data))
    return path


def test_a_request_no_card_holds_is_oversized_not_another_process(tmp_path: Path) -> None:
    report = analyze([_snapshot(tmp_path, 3 * 2**40, 120 * GiB)])
    assert report.verdict.value == "gpu_oom"
    assert report.diagnoses[0].id == "oversized_allocation"
    assert report.diagnoses[0].confidence >= 0.6
    assert "other_process" not in [d.id for d in report.diagnoses]


def test_a_request_above_the_card_the_user_named_is_oversized(tmp_path: Path) -> None:
    options = AnalysisOptions(gpu_memory=80 * GiB)
    report = analyze([_snapshot(tmp_path, 96 * GiB, 70 * GiB)], options=options)
    assert report.diagnoses[0].id == "oversized_allocation"
    assert "other_process" not in [d.id for d in report.diagnoses]


def test_a_request_a_card_could_hold_still_suspects_another_process(tmp_path: Path) -> None:
    # 60 GiB asked, 20 GiB free: an 80 GiB card with others on it fits that reading
    report = analyze([_snapshot(tmp_path, 60 * GiB, 20 * GiB)])
    assert "oversized_allocation" not in [d.id for d in report.diagnoses]
    assert "other_process" in [d.id for d in report.diagnoses]
