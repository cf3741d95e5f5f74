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
