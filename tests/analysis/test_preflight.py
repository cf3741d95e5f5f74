"""``oomlens.analysis.preflight``: what ``oomlens check`` judges, from the config alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from oomlens.analysis.preflight import Preflight, preflight
from oomlens.facts.config import ConfigHazard, ConfigSeverity
from oomlens.ingest.ds_config import document_from_mapping


def _check(data: dict[str, Any], **settings: Any) -> Preflight:
    return preflight(document_from_mapping(data), validator="oomlens", **settings)


def _hazard(code: str, severity: ConfigSeverity) -> ConfigHazard:
    return ConfigHazard(code, f"{code} message", severity)


def test_verdict_counts_every_hazard_it_lists() -> None:
    base = _check({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}, gpus=4)
    listed = (
        _hazard("a", ConfigSeverity.HIGH),
        _hazard("b", ConfigSeverity.LOW),
        _hazard("c", ConfigSeverity.INFO),
    )
    verdict = replace(base, hazards=listed).verdict()
    assert "with 3 hazard(s) above (1 medium or higher)" in verdict
    both = replace(base, hazards=listed[:1] + (_hazard("d", ConfigSeverity.MEDIUM),)).verdict()
    assert both.endswith("with 2 hazard(s) above")


def _codes(result: Preflight) -> set[str]:
    return {h.code for h in result.hazards}


def test_bf16_is_read_from_the_spelling_deepspeed_reads() -> None:
    shadowed = _check(
        {"train_micro_batch_size_per_gpu": 1, "bf16": {}, "bfloat16": {"enabled": True}},
        gpus=2,
    )
    assert shadowed.effective.precision.bf16_enabled.value is False
    assert shadowed.effective.precision.bf16_enabled.key_path == "bf16.enabled"
    assert "bfloat16_ignored" in _codes(shadowed)
    alone = _check({"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": True}}, gpus=2)
    assert alone.effective.precision.bf16_enabled.value is True
    assert not {"bfloat16_ignored", "fp32_fallback"} & _codes(alone)


def test_auto_under_the_old_bf16_spelling_is_not_filled_by_the_trainer() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bfloat16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2},
    }
    result = _check(config, gpus=2, integration="hf", precision="bf16")
    assert result.effective.precision.bf16_enabled.value is False
    assert "bfloat16_auto_unfilled" in _codes(result)
    spelled = _check(
        {**{k: v for k, v in config.items() if k != "bfloat16"}, "bf16": {"enabled": "auto"}},
        gpus=2,
        integration="hf",
        precision="bf16",
    )
    assert spelled.effective.precision.bf16_enabled.value is True
    assert "bfloat16_auto_unfilled" not in _codes(spelled)


def test_a_precision_conflict_names_the_key_as_written() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "fp16": {"enabled": True},
        "bfloat16": {"enabled": True},
    }
    for validator in ("oomlens", "deepspeed"):
        result = preflight(document_from_mapping(config), validator=validator, gpus=1)
        assert [p.key_path for p in result.problems] == ["bfloat16.enabled"]


HF_STAGE2 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 4,
    "fp16": {"enabled": "auto", "loss_scale": 0},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
}


def test_an_hf_auto_config_is_valid_and_says_who_fills_what() -> None:
    for validator in ("oomlens", "deepspeed"):
        for integration in (None, "hf"):
            result = preflight(
                document_from_mapping(HF_STAGE2),
                validator=validator,
                integration=integration,
                params=1_300_000_000,
                gpu_memory=24 * 2**30,
            )
            assert result.valid and not result.failed, result.problems
            notes = " ".join(result.notes)
            assert "train_micro_batch_size_per_gpu <- --per_device_train_batch_size" in notes
            assert "fp16.enabled <- --fp16" in notes
            assert "optimizer.params.lr <- --learning_rate" in notes
            # precision unknown: no fp32 budget, no fp32 warning
            assert result.precision_pending and result.budget is None
            assert "--precision" in notes
            assert "fp32_fallback" not in _codes(result)


def test_an_auto_config_given_to_deepspeed_directly_stays_invalid() -> None:
    result = _check(HF_STAGE2, integration="deepspeed")
    assert not result.valid
    assert {p.code for p in result.problems} == {"batch_type_error"}


def test_auto_precision_resolved_by_the_option_gives_its_budget() -> None:
    result = _check(HF_STAGE2, params=1_300_000_000, precision="fp16", gpus=2)
    assert not result.precision_pending
    assert result.budget is not None and result.budget.precision.value == "fp16"


def _nvme(path: str) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": path},
        },
    }


def test_a_placeholder_nvme_path_is_a_hazard_and_a_real_mount_is_not() -> None:
    for path in ("~/nvme_swap", "<NVME_MOUNT>/ds", "$LOCAL_SCRATCH/zero", "/home/path/to/swap"):
        hazards = _check(_nvme(path), gpus=4).hazards
        flagged = [h for h in hazards if h.code == "nvme_path_placeholder"]
        assert flagged and flagged[0].severity is ConfigSeverity.HIGH, path
    for path in ("/mnt/nvme0/ds_swap", "/raid/local/path_to_x"):
        assert "nvme_path_placeholder" not in _codes(_check(_nvme(path), gpus=4)), path


def _fp16(**block: Any) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True, **block}}


def test_a_loss_scale_starting_above_fp16s_range_is_a_hazard() -> None:
    high = _check(_fp16(initial_scale_power=24), gpus=1)
    found = [h for h in high.hazards if h.code == "initial_scale_power_too_high"]
    assert found and "at least 8 optimizer steps" in found[0].message
    huge = _check(_fp16(initial_scale_power=1100), gpus=1).hazards
    assert any(h.severity is ConfigSeverity.HIGH and "OverflowError" in h.message for h in huge)
    for quiet in (
        _fp16(initial_scale_power=16),
        _fp16(initial_scale_power=12),
        _fp16(initial_scale_power=24, loss_scale=1024),  # static: the power is not used
        {
            "train_micro_batch_size_per_gpu": 1,
            "fp16": {"enabled": False, "initial_scale_power": 30},
        },
    ):
        assert "initial_scale_power_too_high" not in _codes(_check(quiet, gpus=1)), quiet


def test_without_gpus_the_verdict_says_where_the_batch_triple_holds() -> None:
    full = _check(
        {
            "train_batch_size": 64,
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 4,
            "bf16": {"enabled": True},
        }
    )
    assert full.world_sizes is not None and full.world_sizes.sizes == (8,)
    assert "batch holds only at 8 GPUs" in full.verdict()
    partial = _check({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3})
    assert partial.world_sizes is not None
    assert partial.world_sizes.sizes == (1, 2, 4, 8)
    assert "holds only at 1, 2, 4 or 8 GPUs" in partial.verdict()
    free = _check({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2})
    assert free.world_sizes is not None and free.world_sizes.every
    assert "batch" not in free.verdict()
