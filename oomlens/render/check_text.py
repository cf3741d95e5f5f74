"""``oomlens check``'s report as text (the text renderer's half for ``CheckReport``)."""

from __future__ import annotations

import json
from typing import Any

from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.memory_model import CapacityVerdict, Device, MemoryBudget
from oomlens.facts.preflight import BatchCheck
from oomlens.render.wrap import Wrapped, json_members
from oomlens.report import CheckReport
from oomlens.units import format_size

LABEL_WIDTH = 40
"""The budget's label column at its narrowest."""


def _line(ref: Any) -> str:
    return ref.describe() if ref is not None else ""


def check_text(check: CheckReport, width: int = 0) -> str:
    """``oomlens check``'s report as text: the settings that drive memory, the problems, the
    batch, the budgets, the hazards, the patches and the verdict; ``width`` > 0 wraps it to
    that many columns (``wrap.wrap``)."""
    result = check.preflight
    eff = result.effective
    z = eff.zero
    out = Wrapped(width)
    doc = result.document
    out.add(f"{doc.path}: {doc.syntax} ds_config, validated by {result.validator}")
    offload = []
    for label, block in (("optimizer", z.offload_optimizer), ("params", z.offload_param)):
        if block.enabled:
            offload.append(
                f"{label}={block.device.value}{' (pinned)' if block.pin_memory.value else ''}"
            )
    precision = (
        "precision set at launch"
        if result.precision_pending
        else eff.precision.model_precision.value
    )
    out.add(
        f"  ZeRO stage {z.stage.value} ({z.stage.origin.value}), "
        f"{precision}, "
        f"offload: {', '.join(offload) if offload else 'none'}"
    )
    out.add("")
    out.add("Settings that drive memory (value, how it was set):")
    for line in _memory_settings(eff):
        out.add(f"  {line}", hang=4)
    if result.problems:
        out.add("")
        count = sum(problem.count for problem in result.problems)
        out.add(f"Problems - DeepSpeed refuses this config ({count:,}):")
        for problem in result.problems:
            where = _line(problem.source)
            out.add(
                f"  {where}: {problem.key_path or '(config)'}: {problem.message} [{problem.code}]",
                hang=4,
            )
    if result.batch is not None:
        out.add("")
        _render_batch(result.batch, out)
    if result.budget is not None:
        out.add("")
        _render_budget(result.budget, result.verdicts, out)
    if result.hazards:
        out.add("")
        out.add("Hazards:")
        for hazard in result.hazards:
            marker = f"  [{hazard.severity.value}] "
            out.add(marker + hazard.message, hang=len(marker))
            where = ", ".join(_line(s) for s in hazard.sources if s is not None)
            if where:
                out.add(f"         at {where}", hang=12)
    if result.patches:
        out.add("")
        out.add("Changes that would help (JSON merge patches, predicted by the memory model):")
        for index, patch in enumerate(result.patches, start=1):
            effect = []
            if patch.gpu_bytes_saved:
                verb = "saves" if patch.gpu_bytes_saved > 0 else "costs"
                effect.append(f"{verb} {format_size(abs(patch.gpu_bytes_saved))} per GPU")
            if patch.host_bytes_delta:
                sign = "+" if patch.host_bytes_delta > 0 else "-"
                effect.append(f"host {sign}{format_size(abs(patch.host_bytes_delta))}")
            if patch.pinned_bytes_delta:
                sign = "+" if patch.pinned_bytes_delta > 0 else "-"
                effect.append(f"pinned {sign}{format_size(abs(patch.pinned_bytes_delta))}")
            out.add(
                f"  {index}. {patch.summary}: {', '.join(effect) or 'no predicted change'}",
                hang=len(f"  {index}. "),
            )
            out.add(f"     cost: {patch.cost}", hang=11)
            merge = json.dumps(patch.merge_patch())
            out.add(f"     {merge}", hang=6, keep=json_members(merge))
    if result.notes:
        out.add("")
        for note in result.notes:
            out.add(f"note: {note}", hang=6)
    out.add("")
    out.add("Verdict: " + result.verdict(), hang=9)
    return out.text()


def _memory_settings(eff: EffectiveDsConfig) -> list[str]:
    z = eff.zero
    values: list[ConfigValue[Any]] = [
        z.stage,
        eff.precision.bf16_enabled,
        eff.precision.fp16_enabled,
        z.reduce_bucket_size,
        z.overlap_comm,
        z.contiguous_gradients,
        z.sub_group_size,
    ]
    if int(z.stage.value) == 3:
        values += [
            z.prefetch_bucket_size,
            z.max_live_parameters,
            z.max_reuse_distance,
            z.param_persistence_threshold,
        ]
    else:
        values.append(z.allgather_bucket_size)
    for block in (z.offload_optimizer, z.offload_param):
        values.append(block.device)
        if block.enabled:
            values.append(block.pin_memory)
    return [value.cite() for value in values]


def _human_count(value: int) -> str:
    for factor, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return str(value)


def _render_batch(batch: BatchCheck, lines: Wrapped) -> None:
    ws = batch.world_size.value
    if batch.ok and batch.derived is not None:
        d = batch.derived
        lines.add(
            f"Batch at {ws} GPUs: train_batch_size {d.train_batch_size} = micro "
            f"{d.micro_batch_per_gpu} x "
            f"gradient accumulation {d.gradient_accumulation_steps} x {ws} GPUs"
        )
        for step in batch.derivations:
            lines.add(f"  derived: {step}", hang=11)
        if batch.floor_loss:
            lines.add("  note: a floor division dropped a remainder")
    else:
        lines.add(f"Batch at {ws} GPUs: DeepSpeed fails with")
        lines.add(f"  {batch.error}", hang=4)
        for step in batch.derivations:
            lines.add(f"  derived: {step}", hang=11)
    for correction in batch.corrections:
        t = correction.triple
        effect = (
            "changes the global batch"
            if correction.changes_effective_batch
            else "same global batch"
        )
        merge = json.dumps(correction.patch.merge_patch())
        lines.add(
            f"  fix (keeps {correction.keeps}; {effect}): micro {t.micro_batch_per_gpu} x gas "
            f"{t.gradient_accumulation_steps} x {ws} = {t.train_batch_size}  {merge}",
            hang=4,
            keep=json_members(merge),
        )


def _render_budget(
    budget: MemoryBudget, verdicts: tuple[CapacityVerdict, ...], lines: Wrapped
) -> None:
    # Wrapped, the label column is the narrowest: a longer name has a line of its own.
    w = label_width(budget) if not lines.width else LABEL_WIDTH
    row_hang = w + 16  # a row's continuation under its phase column
    m = budget.model
    topo = budget.topology
    lines.add(
        f"Memory per GPU: {_human_count(m.total_params)} params, {topo.world_size} GPU(s), "
        f"{budget.precision.value}, "
        f"ZeRO stage {budget.stage}"
    )
    for row in _component_rows(budget, Device.GPU, w):
        lines.add(row, hang=row_hang)
    by_kind = {v.kind: v for v in verdicts}
    lines.add(f"  {'peak':{w}} {format_size(budget.gpu_peak_bytes):>11}")
    gpu = by_kind.get("gpu")
    if gpu is not None:
        lines.add(
            f"  {'capacity (' + gpu.capacity_source + ')':{w}} "
            f"{format_size(gpu.capacity_bytes):>11}"
        )
        if gpu.fits:
            lines.add(
                f"  {'left for activations and workspace':{w}} "
                f"{format_size(gpu.headroom_bytes):>11}"
            )
        else:
            comp = gpu.overflow_component
            lines.add(
                f"  OVERFLOW by {format_size(gpu.overflow_bytes)}: at "
                f"'{comp.name if comp else '?'}' "
                f"during {gpu.overflow_phase}"
            )
    host_rows = _component_rows(budget, Device.HOST, w)
    lines.add("")
    ranks = topo.ranks_per_host
    lines.add(
        f"Memory per host: {ranks} rank(s) per host"
        + (
            f" (each row: the host's total; a per-rank formula is shown times {ranks} ranks)"
            if ranks > 1
            else ""
        )
    )
    if host_rows:
        for row in host_rows:
            lines.add(row, hang=row_hang)
    else:
        lines.add("  (nothing DeepSpeed keeps on the host)")
    lines.add(f"  {'peak':{w}} {format_size(budget.host_peak_bytes):>11}")
    pinned_line = f"  {'pinned (page-locked)':{w}} {format_size(budget.pinned_per_host()):>11}"
    requested = budget.pinned_requested_per_rank() * topo.ranks_per_host
    if requested and requested != budget.pinned_per_host():
        pinned_line += (
            f"  (DeepSpeed requests {format_size(requested)}; torch rounds each pinned buffer "
            "up to a power of two)"
        )
    lines.add(pinned_line, hang=row_hang)
    host = by_kind.get("host")
    if host is not None:
        lines.add(
            f"  {'capacity (' + host.capacity_source + ')':{w}} "
            f"{format_size(host.capacity_bytes):>11}"
        )
        if not host.fits:
            comp = host.overflow_component
            lines.add(
                f"  OVERFLOW by {format_size(host.overflow_bytes)}: at "
                f"'{comp.name if comp else '?'}' "
                f"during {host.overflow_phase}"
            )
    if budget.estimator is not None:
        est = budget.estimator
        lines.add("")
        unknown = " (largest layer unknown: counted as 0)" if m.largest_layer_params is None else ""
        lines.add(
            f"DeepSpeed's {est.function}: {format_size(est.gpu_bytes or 0)} per GPU{unknown}, "
            f"{format_size(est.host_bytes or 0)} per host (model states only, host x1.5 buffer "
            "factor)"
        )
    if budget.assumptions:
        lines.add("Assumptions: " + "; ".join(budget.assumptions))


def label_width(budget: MemoryBudget) -> int:
    """The label column of the budget: wide enough for every component's whole name (a name
    cut mid-phrase reads as another thing), and at least ``LABEL_WIDTH``."""
    return max([LABEL_WIDTH, *(len(c.name) for c in budget.components)])


def _component_rows(budget: MemoryBudget, device: Device, w: int) -> list[str]:
    rows = []
    ranks = budget.topology.ranks_per_host
    for comp in budget.on(device):
        value = comp.bytes
        formula = comp.formula
        if device is Device.HOST and not comp.per_host:
            # a host row holds every rank's copy: its formula says so, beside the total
            value *= ranks
            if ranks > 1:
                formula = f"{ranks} ranks x ({formula})"
        elif device is Device.HOST and ranks > 1:
            formula = f"{formula} (once per host)"
        flags = []
        if comp.pinned:
            flags.append("pinned")
        if comp.basis.value != "code":
            flags.append(comp.basis.value)
        flag = f" [{', '.join(flags)}]" if flags else ""
        name = comp.name
        if len(name) > w:  # only when wrapped: the label column is as wide as every name else
            rows.append(f"  {name}")
            name = ""
        rows.append(f"  {name:{w}} {format_size(value):>11}  {comp.phase.value:17} {formula}{flag}")
    return rows
