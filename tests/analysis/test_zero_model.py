"""The ZeRO memory model: component sizes from DeepSpeed's allocations, DeepSpeed's estimators,
capacity verdicts, and config patches with their predicted effect."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from oomlens.analysis.ds_resolve import resolve_effective_config
from oomlens.analysis.ds_validation import validate_with_oomlens
from oomlens.analysis.zero_model import (
    POW2_ROUNDING_FACTOR,
    build_budget,
    candidate_patches,
    compare_with_capacity,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    gpu_phase_totals,
    memory_hazards,
    patch_offload_optimizer,
    patch_prefetch,
    patch_unpin,
    pinned_allocation,
    sub_group_sizes,
)
from oomlens.facts.config import ConfigSeverity
from oomlens.facts.memory_model import (
    DEFAULT_PROCESS_BASELINE_BYTES,
    ActivationShape,
    Basis,
    BudgetPhase,
    Capacity,
    Device,
    ModelSize,
    Topology,
)
from oomlens.ingest.ds_config import document_from_mapping

P7B = 7_000_000_000
LARGEST = 131_072_000  # a 32000 x 4096 embedding
MODEL = ModelSize(P7B, largest_layer_params=LARGEST, hidden_size=4096)
EIGHT = Topology(world_size=8, gpus_per_node=8)
PART = P7B // 8  # 875e6 elements per rank


def _eff(zero: dict[str, Any], **top: Any):
    data = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        **top,
    }
    return resolve_effective_config(document_from_mapping(data))


def _bytes(budget, code: str) -> int:
    comp = budget.component(code)
    return 0 if comp is None else comp.bytes


# -- DeepSpeed's estimators ----------------------------------------------------------------------

GRID = list(
    itertools.product(
        [1_000_000, 2851e6, P7B, 70_000_000_000],
        [0, 32e6, 1_250_000_000],
        [1, 8],
        [1, 4],
        [True, False],
        [True, False],
        [True, False],
        [1.5, 1.0],
    )
)


@pytest.mark.deepspeed
def test_zero3_estimator_is_deepspeeds() -> None:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    for total, largest, gpn, nodes, offload, offload_params, zero_init, factor in GRID:
        kwargs = {
            "num_gpus_per_node": gpn,
            "num_nodes": nodes,
            "cpu_offload": offload,
            "cpu_offload_params": offload_params,
            "zero_init": zero_init,
            "additional_buffer_factor": factor,
        }
        assert deepspeed_zero3_estimate(
            total, largest, **kwargs
        ) == stage3.estimate_zero3_model_states_mem_needs(total, largest, **kwargs)


@pytest.mark.deepspeed
def test_zero2_estimator_is_deepspeeds() -> None:
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    for total, _, gpn, nodes, offload, _, _, factor in GRID:
        kwargs = {
            "num_gpus_per_node": gpn,
            "num_nodes": nodes,
            "cpu_offload": offload,
            "additional_buffer_factor": factor,
        }
        assert deepspeed_zero2_estimate(
            total, **kwargs
        ) == stage2.estimate_zero2_model_states_mem_needs(total, **kwargs)


def test_zero3_estimator_reproduces_the_docs_table() -> None:
    # DeepSpeed's memory.rst: 2851e6 params, 32e6 largest layer, 1 node with 8 GPUs
    rows = [
        (True, True, True, "71.69GB | 0.12GB"),
        (True, True, False, "127.45GB | 0.12GB"),
        (True, False, True, "63.72GB | 0.78GB"),
        (True, False, False, "127.45GB | 0.78GB"),
        (False, False, True, "1.43GB | 6.09GB"),
        (False, False, False, "127.45GB | 6.09GB"),
    ]
    for offload, offload_params, zero_init, printed in rows:
        cpu, gpu, _ = deepspeed_zero3_estimate(
            2851e6, 32e6, 8, 1, offload, offload_params, zero_init
        )  # type: ignore[arg-type]
        assert f"{cpu / 2**30:.2f}GB | {gpu / 2**30:.2f}GB" == printed


def test_budget_carries_the_estimator_for_its_case() -> None:
    budget = build_budget(_eff({"stage": 3, "offload_optimizer": {"device": "cpu"}}), MODEL, EIGHT)
    assert budget.estimator is not None
    cpu, gpu, _ = deepspeed_zero3_estimate(P7B, LARGEST, 8, 1, True, False)
    assert (budget.estimator.host_bytes, budget.estimator.gpu_bytes) == (cpu, gpu)


# -- components ----------------------------------------------------------------------------------


def test_zero3_bf16_without_offload_component_by_component() -> None:
    budget = build_budget(_eff({"stage": 3}), MODEL, EIGHT)
    expected = {
        "param_partition": 2 * PART,  # lp_param_buffer
        "fp32_master": 4 * PART,  # fp32_partitioned_groups_flat
        "grad_partition": 2 * PART,  # grad_partitions_flat_buffer (bf16)
        "ipg_bucket": 2 * 500_000_000,  # torch.empty(reduce_bucket_size)
        "optimizer_states": 8 * PART,  # Adam exp_avg + exp_avg_sq, fp32
        "step_fp32_grads": (2 + 4)
        * PART,  # flatten(bf16) then .to(fp32), one sub-group (1e9 > 875e6)
        "init_fp32_grad_buffer": 4 * PART,
        "gathered_params": 2 * (500_000_000 + 50_000_000 + LARGEST),  # reuse/2 + prefetch + current
        "module_grads": 2 * LARGEST,
        "reduce_scatter_buffer": 2 * 500_000_000,
        "reduce_in_flight": 2 * 500_000_000,
        "host_defragment": 2 * PART,
        "host_process_baseline": DEFAULT_PROCESS_BASELINE_BYTES,
    }
    assert {c.code: c.bytes for c in budget.components} == expected
    assert budget.component("gathered_params").basis is Basis.BOUND
    # timeline: persistent 8e9 (+3.5e9 init), states at the first step with the step transient
    assert gpu_phase_totals(budget) == {
        "engine init": 11_500_000_000,
        "forward/backward": 15_000_000_000 + 2 * (681_072_000 + LARGEST + 1_000_000_000),
        "optimizer step": 20_250_000_000,
    }
    assert budget.gpu_peak_bytes == 20_250_000_000
    assert budget.gpu_model_states() == 15_000_000_000
    assert budget.pinned_per_host() == 0


def test_fp32_training_keeps_no_separate_master_copy() -> None:
    data = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    budget = build_budget(resolve_effective_config(document_from_mapping(data)), MODEL, EIGHT)
    assert budget.component("fp32_master") is None  # stage3.py reuses the fp32 partitions
    assert _bytes(budget, "param_partition") == 4 * PART
    assert _bytes(budget, "step_fp32_grads") == 4 * PART  # .to(fp32) of fp32 grads is no copy


def test_optimizer_offload_moves_states_to_pinned_and_pageable_host_memory() -> None:
    budget = build_budget(_eff({"stage": 3, "offload_optimizer": {"device": "cpu"}}), MODEL, EIGHT)
    gpu = {c.code for c in budget.on(Device.GPU)}
    assert {"fp32_master", "optimizer_states", "grad_partition", "step_fp32_grads"}.isdisjoint(gpu)
    host = {c.code: c for c in budget.on(Device.HOST)}
    assert (
        host["host_optimizer_states"].bytes == 8 * PART and not host["host_optimizer_states"].pinned
    )
    assert host["host_fp32_grads"].pinned and host["host_grad_partition"].pinned
    # torch's pinned allocator rounds each buffer up to a power of two:
    # 3.5e9 -> 4 GiB, 1.75e9 -> 2 GiB
    assert (
        host["host_fp32_grads"].bytes == 4 * 2**30
        and host["host_grad_partition"].bytes == 2 * 2**30
    )
    assert budget.pinned_per_host() == 8 * 6 * 2**30
    unpinned = build_budget(
        _eff({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}}),
        MODEL,
        EIGHT,
    )
    assert unpinned.pinned_per_host() == 0
    assert budget.host_peak_bytes - unpinned.host_peak_bytes == 8 * (6 * 2**30 - 6 * PART)


def test_partial_offload_ratio_splits_master_and_states() -> None:
    budget = build_budget(
        _eff({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.25}}), MODEL, EIGHT
    )
    assert _bytes(budget, "optimizer_states") == int(8 * PART * 0.75)
    assert _bytes(budget, "host_optimizer_states") == int(8 * PART * 0.25)
    # self.device is the CPU for all of it (pinned: rounded up to 2 GiB)
    assert _bytes(budget, "host_grad_partition") == 2 * 2**30
    assert _bytes(budget, "host_fp32_grads") == 2**30  # pow2(4 B x 875e6 x 0.25)


def test_param_offload_flat_buffer_is_pinned_whatever_pin_memory_says() -> None:
    zero = {
        "stage": 3,
        "offload_param": {"device": "cpu", "pin_memory": False},
        "offload_optimizer": {"device": "cpu"},
    }
    budget = build_budget(
        _eff(zero), ModelSize(P7B, trainable_params=P7B // 2, largest_layer_params=LARGEST), EIGHT
    )
    flat = budget.component("host_param_flat")
    assert flat.pinned and flat.bytes == 2**30  # pow2(2 B x 437.5e6)
    init_copy = budget.component("host_param_init_copy")
    assert init_copy.phase is BudgetPhase.INIT and not init_copy.pinned
    frozen = budget.component("host_frozen_params")
    assert not frozen.pinned and frozen.bytes == 2 * (P7B // 8 - P7B // 2 // 8)
    assert budget.component("param_partition") is None


def test_nvme_swap_buffers_scale_with_sub_group_size() -> None:
    zero = {
        "stage": 3,
        "sub_group_size": 1e8,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
        "offload_param": {"device": "nvme", "nvme_path": "/nvme"},
    }
    budget = build_budget(_eff(zero), MODEL, EIGHT)
    largest_sub_group = 100_000_000 + LARGEST // 8
    assert _bytes(budget, "nvme_optimizer_swap_buffers") == 4 * largest_sub_group * 4
    assert _bytes(budget, "nvme_param_swap_buffers") == 5 * 100_000_000 * 2
    assert _bytes(budget, "host_param_flat") == 2 * 2**30  # pow2(2 B x 875e6), max_in_cpu 1e9 above


def test_prefetch_overshoot_gathers_up_to_the_whole_model() -> None:
    huge = {
        "stage": 3,
        "stage3_prefetch_bucket_size": 1e10,
        "stage3_max_live_parameters": 1e10,
        "stage3_max_reuse_distance": 1e10,
    }
    assert _bytes(build_budget(_eff(huge), MODEL, EIGHT), "gathered_params") == 2 * P7B
    no_prefetch = {"stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
    assert _bytes(build_budget(_eff(no_prefetch), MODEL, EIGHT), "gathered_params") == 2 * LARGEST
    sequential = {**huge, "stage3_allgather_sequential": True, "stage3_max_reuse_distance": 0}
    assert _bytes(build_budget(_eff(sequential), MODEL, EIGHT), "gathered_params") == 2 * (
        1 + LARGEST
    )


def test_stage2_counts_full_parameters_and_double_buckets() -> None:
    budget = build_budget(_eff({"stage": 2, "overlap_comm": True}), MODEL, EIGHT)
    assert _bytes(budget, "param_full") == 2 * P7B
    assert _bytes(budget, "grads") == 2 * PART
    assert _bytes(budget, "ipg_bucket") == 2 * 500_000_000 * 2
    assert budget.component("ipg_bucket").basis is Basis.CODE


def test_checkpoint_save_needs_the_16bit_model_on_one_host() -> None:
    budget = build_budget(
        _eff({"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}), MODEL, EIGHT
    )
    save = budget.component("save_16bit_state_dict")
    assert save.per_host and save.bytes == 2 * P7B and save.phase is BudgetPhase.CHECKPOINT_SAVE


# -- capacity ------------------------------------------------------------------------------------


def test_overflow_names_the_component_and_the_shortfall() -> None:
    budget = build_budget(_eff({"stage": 3}), MODEL, EIGHT)
    (gpu,) = compare_with_capacity(
        budget, Capacity(gpu_bytes=12_000_000_000, gpu_source="--gpu-memory")
    )
    assert not gpu.fits
    assert gpu.overflow_component.code == "optimizer_states"
    assert gpu.overflow_phase == "first optimizer step"
    assert gpu.overflow_bytes == 20_250_000_000 - 12_000_000_000
    assert gpu.required_bytes == 20_250_000_000 and gpu.peak_phase == "first optimizer step"
    (roomy,) = compare_with_capacity(budget, Capacity(gpu_bytes=80 * 2**30))
    assert (
        roomy.fits
        and roomy.headroom_bytes == 80 * 2**30 - 20_250_000_000
        and roomy.overflow_component is None
    )


def test_host_and_pinned_verdicts() -> None:
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    budget = build_budget(_eff(zero), MODEL, EIGHT)
    verdicts = {v.kind: v for v in compare_with_capacity(budget, Capacity(host_bytes=64 * 2**30))}
    assert not verdicts["host"].fits and not verdicts["pinned"].fits
    assert verdicts["pinned"].required_bytes == budget.pinned_per_host()
    hazards = {h.code: h for h in memory_hazards(_eff(zero), budget, verdicts.values())}
    assert hazards["pinned_memory_exhaustion"].severity is ConfigSeverity.HIGH
    assert "exit code -9" in hazards["host_memory_exhaustion"].message


def test_memory_hazards_for_overshoot_and_model_states() -> None:
    huge = {
        "stage": 3,
        "stage3_prefetch_bucket_size": 1e10,
        "stage3_max_live_parameters": 1e10,
        "stage3_max_reuse_distance": 1e10,
        "offload_optimizer": {"device": "cpu"},
    }
    eff = _eff(huge)
    budget = build_budget(eff, MODEL, EIGHT)
    verdicts = compare_with_capacity(budget, Capacity(gpu_bytes=12 * 2**30))
    hazards = {h.code: h for h in memory_hazards(eff, budget, verdicts)}
    assert hazards["prefetch_overshoot"].severity is ConfigSeverity.HIGH
    assert (
        "zero_optimization.stage3_prefetch_bucket_size" in hazards["prefetch_overshoot"].key_paths
    )
    assert hazards["gpu_overflow"].severity is ConfigSeverity.HIGH
    assert "model_states_too_large" not in hazards
    # without a capacity the knobs far above their defaults are still worth a word
    assert memory_hazards(eff, budget)[0].code == "prefetch_overshoot"
    small_card = compare_with_capacity(
        build_budget(_eff({"stage": 3}), MODEL, EIGHT), Capacity(gpu_bytes=8 * 2**30)
    )
    codes = {
        h.code
        for h in memory_hazards(
            _eff({"stage": 3}), build_budget(_eff({"stage": 3}), MODEL, EIGHT), small_card
        )
    }
    assert "model_states_too_large" in codes


# -- patches -------------------------------------------------------------------------------------


def _raw(zero: dict[str, Any]) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }


@pytest.mark.parametrize(
    "zero",
    [
        {"stage": 3},
        {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1e10,
            "stage3_max_live_parameters": 1e10,
            "stage3_max_reuse_distance": 1e10,
            "offload_optimizer": {"device": "cpu"},
        },
        {"stage": 3, "prefetch_bucket_size": 2e9, "offload_param": {"device": "cpu"}},
        {"stage": 2, "cpu_offload": True},
        {"stage": 1, "reduce_bucket_size": 5e8},
    ],
)
def test_patches_are_valid_and_their_savings_are_what_the_patched_config_gives(
    zero: dict[str, Any],
) -> None:
    raw = _raw(zero)
    eff = resolve_effective_config(document_from_mapping(raw))
    before = build_budget(eff, MODEL, EIGHT)
    patches = candidate_patches(eff, MODEL, EIGHT)
    assert patches
    for patch in patches:
        patched = patch.apply_to(raw)
        # DeepSpeed accepts the patched config (no alias next to its name, no deprecated key next
        # to its replacement)
        assert validate_with_oomlens(document_from_mapping(patched), world_size=8) == [], (
            patch.summary
        )
        after = build_budget(resolve_effective_config(document_from_mapping(patched)), MODEL, EIGHT)
        assert patch.gpu_bytes_saved == before.gpu_peak_bytes - after.gpu_peak_bytes, patch.summary
        assert patch.host_bytes_delta == after.host_peak_bytes - before.host_peak_bytes
        assert patch.pinned_bytes_delta == after.pinned_per_host() - before.pinned_per_host()
        for change in patch.changes:
            assert change.new != change.old  # never re-proposes a value in force


def test_no_patch_re_proposes_what_is_in_force() -> None:
    eff = _eff({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}})
    before = build_budget(eff, MODEL, EIGHT)
    assert patch_offload_optimizer(eff, MODEL, EIGHT, before) is None
    assert patch_unpin(eff, MODEL, EIGHT, before) is None
    defaults = _eff({"stage": 3, "stage3_prefetch_bucket_size": 5e7})
    assert (
        patch_prefetch(
            defaults,
            ModelSize(P7B, largest_layer_params=LARGEST),
            EIGHT,
            build_budget(defaults, MODEL, EIGHT),
        )
        is None
    )


def test_patch_keeps_the_alias_spelling_and_drops_the_deprecated_key() -> None:
    eff = _eff({"stage": 3, "prefetch_bucket_size": 2e9})
    patch = patch_prefetch(eff, MODEL, EIGHT, build_budget(eff, MODEL, EIGHT))
    assert patch is not None
    assert "prefetch_bucket_size" in patch.merge_patch()["zero_optimization"]
    assert "stage3_prefetch_bucket_size" not in patch.merge_patch()["zero_optimization"]
    deprecated = _eff({"stage": 2, "cpu_offload": True})
    unpin = patch_unpin(deprecated, MODEL, EIGHT, build_budget(deprecated, MODEL, EIGHT))
    assert unpin is not None
    assert unpin.merge_patch() == {
        "zero_optimization": {
            "cpu_offload": None,
            "offload_optimizer": {"device": "cpu", "pin_memory": False},
        }
    }


def test_overshoot_patches_fit_the_card_and_come_first() -> None:
    # GIVEN the overshoot config on 24 GiB cards, where the gathered working set overflows
    eff = _eff(
        {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1e10,
            "stage3_max_live_parameters": 1e10,
            "stage3_max_reuse_distance": 1e10,
            "offload_optimizer": {"device": "cpu"},
        }
    )
    budget = build_budget(eff, MODEL, EIGHT)
    capacity = Capacity(gpu_bytes=12 * 2**30)
    verdicts = compare_with_capacity(budget, capacity)
    assert verdicts[0].overflow_component.code == "gathered_params"
    # WHEN patches are asked for that verdict
    patches = candidate_patches(eff, MODEL, EIGHT, capacity, verdicts=verdicts)
    # THEN the first shrinks the prefetch knobs, and the patched config fits
    first = patches[0]
    assert first.summary == "gather fewer parameters ahead of use"
    patched = resolve_effective_config(
        document_from_mapping(
            first.apply_to(
                _raw(
                    {
                        "stage": 3,
                        "stage3_prefetch_bucket_size": 1e10,
                        "stage3_max_live_parameters": 1e10,
                        "stage3_max_reuse_distance": 1e10,
                        "offload_optimizer": {"device": "cpu"},
                    }
                )
            )
        )
    )
    (after,) = compare_with_capacity(build_budget(patched, MODEL, EIGHT), capacity)
    assert after.fits
    assert all((p.gpu_bytes_saved or 0) > 0 for p in patches)


def test_host_overflow_patches_reduce_host_or_pinned_memory() -> None:
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    eff = _eff(zero)
    budget = build_budget(eff, MODEL, EIGHT)
    capacity = Capacity(host_bytes=64 * 2**30)
    patches = candidate_patches(
        eff, MODEL, EIGHT, capacity, verdicts=compare_with_capacity(budget, capacity)
    )
    summaries = {p.summary for p in patches}
    assert "stop pinning offload buffers" in summaries
    assert "keep the parameters on the GPU (offload the optimizer only)" in summaries
    for patch in patches:
        assert (patch.host_bytes_delta or 0) < 0 or (patch.pinned_bytes_delta or 0) < 0


def test_topology_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Topology(0, 8)
    assert Topology(16, 8).nodes == 2 and Topology(4, 8).ranks_per_host == 4


def test_pinned_zero_init_partitions_stay_in_torchs_pinned_cache() -> None:
    zero = {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    budget = build_budget(_eff(zero), MODEL, EIGHT)
    init_copy = budget.component("host_param_init_copy")
    assert init_copy.pinned and init_copy.phase is BudgetPhase.PERSISTENT
    assert init_copy.basis is Basis.ESTIMATE
    unpinned = {
        "stage": 3,
        "offload_param": {"device": "cpu", "pin_memory": False},
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
    }
    pinned_peak = budget.host_peak_bytes
    unpinned_peak = build_budget(_eff(unpinned), MODEL, EIGHT).host_peak_bytes
    # pinning costs the cached zero.Init partitions plus the power-of-two rounding
    rounding = (2**32 - 4 * PART) + (2**31 - 2 * PART)
    assert pinned_peak - unpinned_peak == 8 * (int(2 * PART * POW2_ROUNDING_FACTOR) + rounding)


@pytest.mark.parametrize(
    ("size", "pinned"),
    [(0, 0), (1, 1), (3, 4), (4096, 4096), (4097, 8192), (1_750_000_000, 2**31)],
)
def test_pinned_allocation_rounds_up_to_a_power_of_two(size: int, pinned: int) -> None:
    assert pinned_allocation(size) == pinned


def test_sub_group_sizes() -> None:
    assert sub_group_sizes(875, 1000) == [875]
    assert sub_group_sizes(875, 300) == [300, 300, 275]
    assert sub_group_sizes(900, 300) == [300, 300, 300]
    assert sub_group_sizes(875, 0) == [875]
    assert sub_group_sizes(0, 10) == []


def test_activation_estimate_follows_korthikanti_and_is_optional() -> None:
    eff = _eff({"stage": 3})
    shape = ActivationShape(
        micro_batch=2, seq_len=4096, hidden_size=4096, layers=32, vocab_size=32000
    )
    budget = build_budget(eff, MODEL, EIGHT, shape)
    act = budget.component("activations")
    assert act.bytes == 34 * 4096 * 2 * 4096 * 32 and act.basis is Basis.ESTIMATE
    assert budget.component("logits").bytes == 2 * 4096 * 32000 * (2 + 4 + 4)
    checkpointed = build_budget(eff, MODEL, EIGHT, replace(shape, checkpointing=True))
    assert _bytes(checkpointed, "activations") == (2 * 32 + 34) * 4096 * 2 * 4096
    no_flash = build_budget(eff, MODEL, EIGHT, replace(shape, flash_attention=False, heads=32))
    assert _bytes(no_flash, "activations") == int(
        4096 * 2 * 4096 * (34 + 5 * 32 * 4096 / 4096) * 32
    )
    assert build_budget(eff, MODEL, EIGHT).component("activations") is None
    # patches are predicted with the same activations
    (gpu,) = compare_with_capacity(budget, Capacity(gpu_bytes=40 * 2**30))
    for patch in candidate_patches(eff, MODEL, EIGHT, verdicts=[gpu], activations=shape):
        assert (patch.gpu_bytes_saved or 0) > 0


def test_pinned_hazard_says_whether_unpinned_would_fit() -> None:
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    eff = _eff(zero)
    budget = build_budget(eff, MODEL, EIGHT)
    unpinned = build_budget(
        _eff(
            {
                "stage": 3,
                "offload_optimizer": {"device": "cpu", "pin_memory": False},
                "offload_param": {"device": "cpu", "pin_memory": False},
            }
        ),
        MODEL,
        EIGHT,
    )
    # GIVEN a host between the unpinned and the pinned peaks
    cap = (budget.host_peak_bytes + unpinned.host_peak_bytes) // 2
    verdicts = compare_with_capacity(budget, Capacity(host_bytes=cap))
    hazard = next(
        h for h in memory_hazards(eff, budget, verdicts) if h.code == "pinned_memory_exhaustion"
    )
    assert hazard.severity is ConfigSeverity.HIGH
    assert (
        "with pin_memory false the host would peak at" in hazard.message
        and "and fit" in hazard.message
    )
    # the first patch for that host is the unpinning one
    patches = candidate_patches(eff, MODEL, EIGHT, Capacity(host_bytes=cap), verdicts=verdicts)
    assert any(p.summary == "stop pinning offload buffers" for p in patches)


def test_process_baseline_is_a_host_component_per_rank() -> None:
    eff = _eff({"stage": 3})
    with_baseline = build_budget(eff, MODEL, EIGHT)
    without = build_budget(eff, MODEL, EIGHT, process_baseline_bytes=0)
    assert (
        with_baseline.host_peak_bytes - without.host_peak_bytes
        == 8 * DEFAULT_PROCESS_BASELINE_BYTES
    )
    assert without.component("host_process_baseline") is None


def test_patches_for_the_blamed_component_come_first() -> None:
    # GIVEN the overshoot settings where the default 5e8 reduce bucket would save more
    eff = _eff(
        {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1e10,
            "stage3_max_live_parameters": 1e10,
            "stage3_max_reuse_distance": 1e10,
            "offload_optimizer": {"device": "cpu"},
        }
    )
    budget = build_budget(eff, MODEL, EIGHT)
    capacity = Capacity(gpu_bytes=12 * 2**30)
    verdicts = compare_with_capacity(budget, capacity)
    patches = candidate_patches(eff, MODEL, EIGHT, capacity, verdicts=verdicts)
    summaries = [p.summary for p in patches]
    assert summaries.index("gather fewer parameters ahead of use") < summaries.index(
        "reduce gradients in smaller buckets"
    )


# -- what the settings keep whole on every GPU ---------------------------------------------------


def test_persistence_above_the_largest_parameter_keeps_the_whole_model_on_every_gpu() -> None:
    # every parameter of at most stage3_param_persistence_threshold elements is never
    # partitioned (parameter_offload.py mark_persistent_parameters): above the largest, all are
    raised = {"stage": 3, "stage3_param_persistence_threshold": LARGEST}
    budget = build_budget(_eff(raised), MODEL, EIGHT)
    comp = budget.component("persistent_params")
    assert comp is not None and comp.bytes == 2 * P7B
    assert comp.device is Device.GPU and comp.phase is BudgetPhase.PERSISTENT
    assert "zero_optimization.stage3_param_persistence_threshold" in comp.key_paths
    # nothing is left to gather: the working set holds only what is not persistent
    assert _bytes(budget, "gathered_params") == 0
    cap = Capacity(gpu_bytes=24 * 2**30, gpu_source="--gpu-memory")
    gpu = next(v for v in compare_with_capacity(budget, cap) if v.kind == "gpu")
    assert not gpu.fits and gpu.overflow_component is not None
    # a threshold above the whole model says as much without knowing the largest layer
    unknown = ModelSize(P7B)
    whole = {"stage": 3, "stage3_param_persistence_threshold": 1e10}
    assert _bytes(build_budget(_eff(whole), unknown, EIGHT), "persistent_params") == 2 * P7B


def test_model_persistence_threshold_caps_what_persists() -> None:
    capped = {
        "stage": 3,
        "stage3_param_persistence_threshold": 1e10,
        "stage3_model_persistence_threshold": 1e9,
    }
    budget = build_budget(_eff(capped), MODEL, EIGHT)
    assert _bytes(budget, "persistent_params") == 2 * 1_000_000_000


def test_persistence_that_cannot_be_sized_is_an_assumption_not_silence() -> None:
    raised = {"stage": 3, "stage3_param_persistence_threshold": 1e7}  # below the largest
    budget = build_budget(_eff(raised), MODEL, EIGHT)
    assert budget.component("persistent_params") is None
    assert any("stage3_param_persistence_threshold" in a for a in budget.assumptions)
    default = build_budget(_eff({"stage": 3}), MODEL, EIGHT)
    assert default.component("persistent_params") is None
    assert not any("persistence" in a for a in default.assumptions)


def test_hpz_secondary_partition_is_counted() -> None:
    hpz = build_budget(_eff({"stage": 3, "zero_hpz_partition_size": 8}), MODEL, EIGHT)
    assert _bytes(hpz, "hpz_secondary") == 2 * P7B // 8


def test_stage2_offloading_the_optimizer_keeps_no_gradient_partition_on_the_gpu() -> None:
    # DeepSpeed 0.19.8's copy_grads_in_partition returns before allocating grads_in_partition
    # when the optimizer is offloaded: each reduced gradient goes to the CPU fp32 buffer.  The
    # budget counted 2 B x params / n on the GPU anyway: 12.55 GiB for 6.74B on one 24 GiB card,
    # "CANNOT FIT" and exit 4, where DeepSpeed's own estimate is half that.
    offloaded = build_budget(
        _eff({"stage": 2, "offload_optimizer": {"device": "cpu"}}), MODEL, EIGHT
    )
    assert _bytes(offloaded, "grads") == 0
    on_gpu = build_budget(_eff({"stage": 2}), MODEL, EIGHT)
    assert _bytes(on_gpu, "grads") == 2 * PART
    # an fp32 grad_accum_dtype under bf16 keeps the compact fp32 partition on the GPU, offloaded
    # or not (_use_compact_grad_partition_buffer)
    compact = build_budget(
        _eff(
            {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            data_types={"grad_accum_dtype": "fp32"},
        ),
        MODEL,
        EIGHT,
    )
    assert _bytes(compact, "grads") == 4 * PART


def test_an_overflow_with_activations_counted_does_not_say_before_any_activation() -> None:
    # The overflow sentence said "before any activation memory" also when the budget counted
    # the activations (--seq-len ...), and even when it overflowed at them.
    eff = _eff({"stage": 3})
    shape = ActivationShape(
        micro_batch=2, seq_len=4096, hidden_size=4096, layers=32, vocab_size=32000
    )
    for activations, said in ((None, "before any activation memory"), (shape, "included")):
        budget = build_budget(eff, MODEL, EIGHT, activations)
        (gpu,) = compare_with_capacity(budget, Capacity(gpu_bytes=8 * 2**30))
        [overflow] = [h for h in memory_hazards(eff, budget, [gpu]) if h.code == "gpu_overflow"]
        assert overflow.message.endswith(said), overflow.message


def test_offloading_the_optimizer_allows_the_clients_own_optimizer_deepspeed_would_refuse() -> None:
    """DeepSpeed 0.19.8's engine raises ZeRORuntimeException ("You are using ZeRO-Offload with
    a client provided optimizer") for a torch optimizer with the optimizer offloaded unless
    zero_force_ds_cpu_optimizer is false: a config without an optimizer section (Lightning,
    scripts passing their own) gets that key with the offload, one with DeepSpeed's own does
    not."""
    client = _eff({"stage": 3})
    patch = patch_offload_optimizer(client, MODEL, EIGHT, build_budget(client, MODEL, EIGHT))
    assert patch is not None
    assert any(
        c.key_path == "zero_force_ds_cpu_optimizer" and c.new is False for c in patch.changes
    )
    own = _eff({"stage": 3}, optimizer={"type": "AdamW", "params": {"lr": 1e-4}})
    patch = patch_offload_optimizer(own, MODEL, EIGHT, build_budget(own, MODEL, EIGHT))
    assert patch is not None
    assert all(c.key_path != "zero_force_ds_cpu_optimizer" for c in patch.changes)
