"""``oomlens check`` against the real crash corpus: given each DeepSpeed case's model, GPU
count and memory (from its manifest), it fails the configs that crashed for a config reason and
passes the ones that ran (or crashed for a reason no config check can see)."""

from __future__ import annotations

import re

import pytest

from oomlens.analysis.preflight import Preflight
from oomlens.session import check_config
from tests._corpus import CORPUS_DIR, case_dir, case_names, check_arguments, checkable, manifest

#: Diagnoses a config check can and must catch before launch.
CONFIG_DIAGNOSES = {
    "prefetch_overshoot",
    "model_states_too_large",
    "pinned_memory_exhaustion",
    "accumulation_mismatch",
    "checkpoint_save_gather",
}

CASES = [n for n in case_names() if checkable(n)] if CORPUS_DIR.is_dir() else []
pytestmark = pytest.mark.skipif(not CASES, reason="crash corpus not present")


def check_case(name: str) -> Preflight:
    arguments = check_arguments(name)
    return check_config(arguments.pop("config_path"), **arguments, validator="oomlens").preflight


@pytest.mark.parametrize("name", CASES)
def test_check_fails_exactly_the_configs_that_crashed_for_a_config_reason(name: str) -> None:
    expected = manifest(name)["expected"]
    should_fail = expected["verdict"] != "no_failure" and expected["diagnosis"] in CONFIG_DIAGNOSES
    result = check_case(name)
    assert result.failed == should_fail


def _gpu(result: Preflight):  # type: ignore[no-untyped-def]
    return next(v for v in result.verdicts if v.kind == "gpu")


def test_prefetch_overshoot_is_blamed_on_the_gathered_parameters() -> None:
    overshoot = check_case("prefetch_overshoot")
    verdict = _gpu(overshoot)
    assert verdict.overflow_component is not None
    assert verdict.overflow_component.code == "gathered_params"
    assert verdict.overflow_phase == "first forward/backward"
    assert any(
        h.code == "prefetch_overshoot" and h.severity.value == "high" for h in overshoot.hazards
    )
    assert overshoot.patches[0].summary == "gather fewer parameters ahead of use"
    # the twin with DeepSpeed's defaults fits the same 6.75 GiB, and the overshoot fits 9 GiB
    assert _gpu(check_case("prefetch_fits")).fits
    assert _gpu(check_case("prefetch_overshoot_roomy")).fits


def test_model_states_overflow_at_the_first_optimizer_step() -> None:
    verdict = _gpu(check_case("model_states_too_large"))
    assert verdict.overflow_component is not None
    assert verdict.overflow_component.code == "optimizer_states"
    assert verdict.overflow_phase == "first optimizer step"


def test_pinned_offload_exhausts_the_capped_host_and_unpinned_would_fit() -> None:
    result = check_case("pinned_memory_exhaustion")
    host = next(v for v in result.verdicts if v.kind == "host")
    assert not host.fits
    hazard = next(h for h in result.hazards if h.code == "pinned_memory_exhaustion")
    assert (
        hazard.severity.value == "high"
        and "pin_memory false" in hazard.message
        and "and fit" in hazard.message
    )
    unpin = result.patches[0]
    assert unpin.summary == "stop pinning offload buffers"
    assert unpin.host_bytes_delta is not None
    assert host.required_bytes + unpin.host_bytes_delta <= host.capacity_bytes


def test_derived_micro_batch_is_flagged_through_its_activations() -> None:
    result = check_case("accumulation_derived_micro")
    assert any(h.code == "derived_micro_batch" for h in result.hazards)
    verdict = _gpu(result)
    assert (
        verdict.overflow_component is not None and verdict.overflow_component.code == "activations"
    )
    assert result.batch is not None and result.batch.derived is not None
    assert result.batch.derived.micro_batch_per_gpu == 16
    # the config as written for 8 GPUs (micro 4, the second correction) would fit at 2
    assert result.batch.corrections[1].triple.micro_batch_per_gpu == 4


def test_accumulation_mismatch_is_invalid_with_deepspeeds_message() -> None:
    result = check_case("accumulation_mismatch")
    log = (case_dir("accumulation_mismatch") / "train.log").read_text()
    (problem,) = result.problems
    assert problem.code == "batch_mismatch"
    assert f"AssertionError: {problem.message}" in log


def test_model_states_match_the_real_oom_message() -> None:
    # GIVEN the real OOM: Adam's exp_avg of the first sub-group (4 B x ~1.01e9) could not be
    # allocated on top of the persistent states and that sub-group's fp32 gradients (same size)
    oom = manifest("model_states_too_large")["measured"]["oom_messages_by_rank"]["0"]
    budget = check_case("model_states_too_large").budget
    assert budget is not None
    states = budget.component("optimizer_states")
    assert states is not None  # created at the first step: not there yet when the OOM hit
    predicted = budget.gpu_model_states() - states.bytes + oom["tried_to_allocate"]
    # THEN the modelled persistent states account for what PyTorch had allocated, within 2%
    assert abs(predicted - oom["allocated_by_pytorch"]) / oom["allocated_by_pytorch"] < 0.02


def test_persistent_gpu_memory_matches_see_memory_usage() -> None:
    # MA printed by DeepSpeed's see_memory_usage between steps (GiB, labelled GB)
    measured = manifest("prefetch_fits")["measured"]["see_memory_usage_MA_GB"]["last"] * 2**30
    budget = check_case("prefetch_fits").budget
    assert budget is not None
    assert abs(budget.gpu_model_states() - measured) / measured < 0.05


def test_pinned_host_memory_matches_the_kernels_shmem_rss() -> None:
    # the OOM killer's report: shmem-rss (pinned buffers) of each killed rank
    kernel = (case_dir("pinned_memory_exhaustion") / "kernel.log").read_text()
    shmem = [int(kb) * 1024 for kb in re.findall(r"shmem-rss:(\d+)kB", kernel)]
    assert len(shmem) == 2
    budget = check_case("pinned_memory_exhaustion").budget
    assert budget is not None
    per_rank = budget.pinned_per_host() / budget.topology.ranks_per_host
    assert all(abs(per_rank - value) / value < 0.05 for value in shmem)


def test_capacity_from_the_real_oom_message() -> None:
    from oomlens.facts.memory_model import Capacity

    oom = manifest("prefetch_overshoot")["measured"]["oom_messages_by_rank"]["0"]
    keys = ("total_capacity", "free", "allocated_by_pytorch", "reserved_unallocated", "allowed")
    capacity = Capacity.from_oom_message(**{k: oom[k] for k in keys})
    assert capacity.gpu_bytes == oom["allowed"]  # the 6.75 GiB memory fraction, not the 140 GB card
    uncapped = Capacity.from_oom_message(**{k: oom[k] for k in keys[:4]})
    assert (
        uncapped.gpu_bytes
        == oom["free"] + oom["allocated_by_pytorch"] + oom["reserved_unallocated"]
    )


def test_pinned_requests_match_deepspeeds_pinned_memory_tracker() -> None:
    # DeepSpeed 0.19.8 logs the pinned bytes it requested ("... 3.628 GB pinned across 296
    # allocations", GiB); the model's unrounded pinned buffers must add up to it
    log = (case_dir("pinned_memory_exhaustion") / "train.log").read_text()
    totals = re.findall(r"\[pinned-memory ZeRO-3 optimizer init\] ([\d.]+) GB pinned", log)
    assert totals
    logged = float(totals[-1]) * 2**30
    budget = check_case("pinned_memory_exhaustion").budget
    assert budget is not None
    assert abs(budget.pinned_requested_per_rank() - logged) / logged < 0.001
    unpinned = check_case("offload_unpinned_uncapped").budget
    log = (case_dir("offload_unpinned_uncapped") / "train.log").read_text()
    (mib,) = set(re.findall(r"\[pinned-memory ZeRO-3 optimizer init\] ([\d.]+) MB pinned", log))
    assert unpinned is not None
    assert (
        abs(unpinned.pinned_requested_per_rank() - float(mib) * 2**20) / (float(mib) * 2**20)
        < 0.001
    )
