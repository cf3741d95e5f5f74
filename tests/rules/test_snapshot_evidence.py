"""Snapshot evidence strengthens, weakens or overturns diagnoses, with numbers, and a snapshot
without a log still yields one (tests on the corpus's real snapshots)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomlens.facts.run import RunFacts
from oomlens.rules.fragmentation import FragmentationRule
from oomlens.rules.thresholds import Thresholds
from oomlens.rules.uncertainty import SURE_ENOUGH
from oomlens.session import analyze, gather_facts
from tests._corpus import case_dir

SNAPSHOT_ALONE = {
    "fragmentation": "fragmentation",
    "activation_memory": "activation_memory",
    "model_states_too_large": "model_states_too_large",
    "prefetch_overshoot": "prefetch_overshoot",
}


@pytest.mark.parametrize(("case", "expected"), sorted(SNAPSHOT_ALONE.items()))
def test_a_snapshot_without_its_log_still_gives_the_diagnosis(case: str, expected: str) -> None:
    report = analyze([case_dir(case) / "snapshot_rank0.pickle"])
    assert report.verdict.value == "gpu_oom"
    assert report.top is not None and report.top.id == expected
    assert any(e.kind.value == "snapshot" for e in report.top.evidence)


@pytest.mark.parametrize("case", ["memory_leak", "other_process"])
def test_a_snapshot_that_cannot_tell_says_so(case: str) -> None:
    # A snapshot alone shows the allocator, not the run: whatever it points at is named with a
    # low confidence, and the report says what to capture (insufficient_evidence follows).
    report = analyze([case_dir(case) / "snapshot_rank0.pickle"])
    assert report.top is not None and report.top.confidence < SURE_ENOUGH
    ids = [d.id for d in report.diagnoses]
    assert "insufficient_evidence" in ids
    # the capture recipe travels with the low-confidence cause
    assert "the job's combined stdout/stderr (every rank's)" in report.top.missing


@pytest.mark.parametrize(
    ("case", "rule_id"),
    [
        ("fragmentation", "fragmentation"),
        ("prefetch_overshoot", "prefetch_overshoot"),
        ("model_states_too_large", "model_states_too_large"),
        ("memory_leak", "memory_leak"),
        ("activation_memory", "activation_memory"),
    ],
)
def test_the_snapshot_raises_confidence_over_the_log_alone(case: str, rule_id: str) -> None:
    with_snapshot = {d.id: d for d in analyze([case_dir(case)]).diagnoses}
    log_only = {d.id: d for d in analyze([case_dir(case) / "train.log"]).diagnoses}
    if rule_id == "model_states_too_large":
        log_only = {
            d.id: d for d in analyze(sorted((case_dir(case) / "rank_logs").glob("*.log"))).diagnoses
        }
    assert with_snapshot[rule_id].confidence > log_only[rule_id].confidence
    snapshot_cited = [e for e in with_snapshot[rule_id].evidence if e.kind.value == "snapshot"]
    assert snapshot_cited and any(ch.isdigit() for ch in snapshot_cited[0].text)


def _with_snapshot_oom(facts: RunFacts, **changes: object) -> RunFacts:
    snapshot = facts.snapshots[0]
    device = snapshot.devices[0]
    assert device.oom is not None
    new_device = replace(device, oom=replace(device.oom, **changes))
    return replace(facts, snapshots=(replace(snapshot, devices=(new_device,)),))


def test_a_free_block_big_enough_overturns_fragmentation() -> None:
    facts = gather_facts([case_dir("fragmentation")])
    rule, thresholds = FragmentationRule(), Thresholds()
    before = next(iter(rule.evaluate(facts, thresholds)))
    after = next(
        iter(rule.evaluate(_with_snapshot_oom(facts, fits_largest_free_block=True), thresholds))
    )
    assert after.confidence < before.confidence - 0.3
    assert any(not e.supports for e in after.evidence)


def test_expandable_segments_already_on_is_never_proposed_again() -> None:
    facts = gather_facts([case_dir("fragmentation")])
    snapshot = facts.snapshots[0]
    assert snapshot.allocator_settings is not None
    on = replace(
        snapshot.allocator_settings, expandable_segments=True, raw_config="expandable_segments:True"
    )
    facts_on = replace(facts, snapshots=(replace(snapshot, allocator_settings=on),))
    diagnosis = next(iter(FragmentationRule().evaluate(facts_on, Thresholds())))
    proposed = [f.environment.get("PYTORCH_CUDA_ALLOC_CONF") for f in diagnosis.fixes]
    assert "expandable_segments:True" not in proposed
    assert any("already on" in e.text for e in diagnosis.evidence)
    default = next(iter(FragmentationRule().evaluate(facts, Thresholds())))
    assert default.fixes[0].environment == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
