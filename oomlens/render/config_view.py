"""The config and memory-budget part of the report's view: the config as DeepSpeed resolves it
(settings that drive memory first), its problems, the OOM message's budget of the card and the
ZeRO memory model's budget, bounded like the rest of the view."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from oomlens.facts.config import ConfigValue, show_value
from oomlens.facts.memory_model import Device
from oomlens.render.bounded import MAX_SHORT_TEXT, Capped, Fact, cap, plain, text, where
from oomlens.render.charts import Part
from oomlens.report import CapacityReading, Report
from oomlens.units import format_size

MAX_BUDGET_ROWS = 30
MAX_RAW_CONFIG_CHARS = 20_000
MAX_CONFIG_PROBLEMS = 30
MAX_CONFIG_ROWS = 60


@dataclass(frozen=True, slots=True)
class ConfigRow:
    key: str
    value: str
    origin: str
    where: str
    note: str


@dataclass(frozen=True, slots=True)
class ProblemRow:
    severity: str
    key: str
    message: str
    where: str


@dataclass(frozen=True, slots=True)
class ConfigView:
    origin: str
    where: str
    rows: Capped[ConfigRow]
    auto_keys: str
    problems: Capped[ProblemRow]
    hazards: Capped[ProblemRow]
    notes: Capped[str]
    raw_json: str | None
    raw_cut: str


def _config_row(value: ConfigValue[Any]) -> ConfigRow:
    return ConfigRow(
        key=text(value.key_path, 200),
        value=text(show_value(value.value), MAX_SHORT_TEXT),
        origin=value.origin.value.replace("_", " "),
        where=where(value.source),
        note=text(value.note, 300),
    )


def config_view(report: Report) -> ConfigView | None:
    source = report.facts.config
    if source is None:
        return None
    reading = source.reading
    effective = reading.effective
    values = effective.all_values()
    ordered = [v for v in values if v.is_explicit] + [v for v in values if not v.is_explicit]
    raw = None
    raw_cut = ""
    if reading.raw:
        dumped = json.dumps(plain(reading.raw), indent=2, default=str, ensure_ascii=False)
        if len(dumped) > MAX_RAW_CONFIG_CHARS:
            raw_cut = f"{len(dumped) - MAX_RAW_CONFIG_CHARS:,} more characters not shown"
            dumped = dumped[:MAX_RAW_CONFIG_CHARS]
        raw = text(dumped, MAX_RAW_CONFIG_CHARS)
    return ConfigView(
        origin=source.origin.replace("_", " ").replace("+", " + "),
        where=where(effective.source),
        rows=cap(ordered, MAX_CONFIG_ROWS, _config_row),
        auto_keys=", ".join(text(k, 200) for k in effective.auto_keys[:30]),
        problems=cap(
            reading.problems,
            MAX_CONFIG_PROBLEMS,
            lambda p: ProblemRow(
                p.severity.value, text(p.key_path, 200), text(p.message, 600), where(p.source)
            ),
        ),
        hazards=cap(
            reading.hazards,
            MAX_CONFIG_PROBLEMS,
            lambda h: ProblemRow(
                h.severity.value,
                text(", ".join(h.key_paths), 300),
                text(h.message, 600)
                + (f" ({format_size(h.bytes_at_stake)} at stake)" if h.bytes_at_stake else ""),
                ", ".join(where(s) for s in h.sources[:3]),
            ),
        ),
        notes=cap(reading.notes, MAX_CONFIG_PROBLEMS, lambda n: text(n, 600)),
        raw_json=raw,
        raw_cut=raw_cut,
    )


@dataclass(frozen=True, slots=True)
class BudgetRow:
    name: str
    where: str
    phase: str
    bytes: str
    formula: str


@dataclass(frozen=True, slots=True)
class OomBudget:
    """The memory picture the OOM message itself gives: what filled the limit."""

    where: str
    limit: str
    limit_name: str
    parts: tuple[Part, ...]
    rows: tuple[Fact, ...]
    width: int
    request_x: float | None
    request_width: float | None
    request: str
    limit_x: float


@dataclass(frozen=True, slots=True)
class ZeroBudget:
    summary: str
    rows: Capped[BudgetRow]
    gpu_peak: str
    host_peak: str
    assumptions: tuple[str, ...]
    verdicts: tuple[Fact, ...]
    """Each device's peak against its capacity."""
    patches: tuple[Fact, ...]
    """The config patches the model predicts would help, most memory saved first."""


@dataclass(frozen=True, slots=True)
class BudgetView:
    at_oom: OomBudget | None
    zero: ZeroBudget | None
    zero_missing: str
    """Why there is no ZeRO model budget, when there is none."""


_BUDGET_WIDTH = 760


def oom_budget(report: Report) -> OomBudget | None:
    event = report.facts.first_gpu_oom()
    if event is None:
        return None
    m = event.message
    limit = m.allowed if m.allowed is not None else m.total_capacity
    if limit is None or m.allocated_by_pytorch is None:
        return None
    limit_name = "allowed (memory fraction)" if m.allowed is not None else "total capacity"
    spec: list[tuple[str, int, str]] = [("allocated by PyTorch", m.allocated_by_pytorch, "live")]
    if m.reserved_unallocated:
        spec.append(("reserved by PyTorch, unallocated", m.reserved_unallocated, "stuck"))
    reserved = m.allocated_by_pytorch + (m.reserved_unallocated or 0)
    if m.process_in_use is not None and m.process_in_use > reserved and m.allowed is None:
        spec.append(
            (
                "this process outside PyTorch (context, NCCL...)",
                m.process_in_use - reserved,
                "context",
            )
        )
    if m.other_processes_total and m.allowed is None:
        spec.append(("other processes", m.other_processes_total, "other"))
    scale = max(limit, sum(v for _, v, _ in spec) + (m.tried_to_allocate or 0))
    x = 0.0
    parts = []
    for label, value, style in spec:
        width = round(_BUDGET_WIDTH * value / scale, 1)
        parts.append(Part(label, format_size(value), round(x, 1), width, style))
        x += width
    rows = [Fact(p.label, p.value) for p in parts]
    request = ""
    request_x = request_width = None
    if m.tried_to_allocate is not None:
        request_x = round(x, 1)
        request_width = max(2.0, round(_BUDGET_WIDTH * m.tried_to_allocate / scale, 1))
        request = f"the failed request: {format_size(m.tried_to_allocate)}"
        rows.append(Fact("tried to allocate", format_size(m.tried_to_allocate)))
    rows.append(Fact(limit_name, format_size(limit)))
    if m.free is not None:
        rows.append(Fact("free on the device (all processes)", format_size(m.free)))
    return OomBudget(
        where=where(event.source),
        limit=format_size(limit),
        limit_name=limit_name,
        parts=tuple(parts),
        rows=tuple(rows),
        width=_BUDGET_WIDTH,
        request_x=request_x,
        request_width=request_width,
        request=request,
        limit_x=round(_BUDGET_WIDTH * limit / scale, 1),
    )


def zero_budget(report: Report) -> tuple[ZeroBudget | None, str]:
    """The ZeRO memory model the analysis built (``RunFacts.memory_model``), for display."""
    facts = report.facts
    if facts.config is None:
        return None, ""
    model = facts.memory_model
    if model is None:
        if facts.params is None:
            return None, (
                "the parameter count is unknown: pass --params (e.g. --params 1.3B) to get the "
                "ZeRO memory model's per-GPU and per-host budget"
            )
        return None, "the memory model could not be built for this config"
    budget = model.budget
    rows = cap(
        budget.components,
        MAX_BUDGET_ROWS,
        lambda c: BudgetRow(
            name=text(c.name, 200),
            where=("GPU" if c.device is Device.GPU else "host")
            + (" (per host)" if c.per_host else ""),
            phase=c.phase.value,
            bytes=format_size(c.bytes),
            formula=text(c.formula, 300),
        ),
    )
    summary = (
        f"ZeRO stage {budget.stage}, {budget.precision.value}, "
        f"{budget.model.total_params:,} parameters ({text(budget.model.source, 100)}), "
        f"{budget.topology.world_size} rank(s), {budget.topology.ranks_per_host} per host"
    )
    reading = report.budget
    verdicts = tuple(
        Fact(
            f"{c.verdict.kind} capacity {format_size(c.verdict.capacity_bytes)} "
            f"({text(c.verdict.capacity_source, 100)})",
            _capacity_words(c),
        )
        for c in (reading.capacities if reading is not None else ())
    )
    patches = tuple(
        Fact(
            text(p.summary, 300),
            "; ".join(
                part
                for part in (
                    f"saves {format_size(p.gpu_bytes_saved)} per GPU" if p.gpu_bytes_saved else "",
                    f"cost: {text(p.cost, 200)}" if p.cost else "",
                )
                if part
            ),
        )
        for p in (reading.patches if reading is not None else model.patches)[:6]
    )
    return (
        ZeroBudget(
            summary=summary,
            rows=rows,
            gpu_peak=format_size(budget.gpu_peak_bytes),
            host_peak=format_size(budget.host_peak_bytes),
            assumptions=tuple(
                dict.fromkeys(text(a, 400) for a in (*budget.assumptions, *model.assumptions))
            )[:10],
            verdicts=verdicts,
            patches=patches,
        ),
        "",
    )


def _capacity_words(c: CapacityReading) -> str:
    v = c.verdict
    if c.ran_out:
        # The model's peak fits, yet the run ran out: said without contradicting the crash.
        return (
            f"the run ran out of it: the model's peak of {format_size(v.required_bytes)} "
            f"({text(v.peak_phase, 60)}) leaves {format_size(v.headroom_bytes)}, which what the "
            f"model does not count took: {', '.join(c.uncounted)}"
        )
    if v.fits:
        return (
            f"fits: peak {format_size(v.required_bytes)} ({text(v.peak_phase, 60)}), "
            f"{format_size(v.headroom_bytes)} left"
        )
    return (
        f"does not fit: peak {format_size(v.required_bytes)}, "
        f"{format_size(v.overflow_bytes)} over"
        + (f" from {text(v.overflow_phase, 60)}" if v.overflow_phase else "")
        + (f" ({text(v.overflow_component.name, 120)})" if v.overflow_component is not None else "")
    )
