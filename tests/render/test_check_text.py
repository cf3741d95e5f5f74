"""``oomlens check``'s text: the budget's rows say what their numbers count."""

from __future__ import annotations

import re

from oomlens.analysis.preflight import preflight
from oomlens.facts.memory_model import Device
from oomlens.ingest.ds_config import document_from_mapping
from oomlens.render.check_text import check_text
from oomlens.report import CheckReport
from oomlens.units import format_size


def test_host_rows_show_the_hosts_total_with_a_formula_for_the_same_total() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "fp16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu"},
            "offload_optimizer": {"device": "cpu"},
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    result = preflight(
        document_from_mapping(config), params=3_000_000_000, gpus=12, gpus_per_node=6
    )
    assert result.budget is not None
    text = check_text(CheckReport(result))
    host = text.split("Memory per host:")[1].split("  peak")[0]
    rows = {line.split("  ")[1].strip(): line for line in host.splitlines()[1:] if line.strip()}
    components = result.budget.on(Device.HOST)
    assert any(c.per_host for c in components) and any(not c.per_host for c in components)
    for comp in components:
        row = rows[comp.name]
        if comp.per_host:
            assert format_size(comp.bytes) in row and "(once per host)" in row
        else:
            assert format_size(comp.bytes * 6) in row
            assert re.search(r"  6 ranks x \(" + re.escape(comp.formula) + r"\)", row), row
