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
