"""Memory that grows step after step until it runs out: a leak.

Evidence comes from memory printed every step (DeepSpeed ``see_memory_usage``: MA/CA per
step, compared at the same point of each step) and from a snapshot, where a leak shows as
many blocks of one size from one call site still alive at the OOM, or as live bytes growing
from one iteration boundary to the next."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from oomlens.diagnosis import (
    Diagnosis,
    Evidence,
    EvidenceKind,
    Figure,
    Fix,
    Severity,
    a_count,
    a_text,
    in_bytes,
)
from oomlens.facts.log import MemorySeries, SeriesStats
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_MEMORY_SERIES, CAPTURE_SNAPSHOT
from oomlens.rules.common.evidence import oom_evidence, size, snapshot_evidence
from oomlens.rules.common.message import allocator_oom
from oomlens.rules.common.model_states import snapshot_ooms
from oomlens.rules.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class _Growth:
    series: MemorySeries
    label: str | None
    stats: SeriesStats

    @property
    def total(self) -> float:
        return self.stats.last - self.stats.first


def _grows_steadily(stats: SeriesStats, limit: int | None, th: Thresholds) -> bool:
    """Growth over the series that is large, linear, and starts at the minimum: the shape of
    tensors piling up each step (not a one-time jump, not a warm-up that levels off)."""
    if stats.count < th.leak_min_samples or stats.slope is None:
        return False
    growth = stats.last - stats.first
    if stats.slope < th.leak_min_growth_bytes_per_sample or growth <= 0:
        return False
    expected = stats.slope * (stats.count - 1)
    tolerance = th.leak_linearity_tolerance
    if not (1 - tolerance) * expected <= growth <= (1 + tolerance) * expected:
        return False
    end = th.leak_end_tolerance
    # +1: a series that starts at 0 bytes still starts at its minimum
    if stats.last < (1 - end) * stats.maximum or stats.first > stats.minimum * (1 + end) + 1:
        return False
    floor = th.leak_min_total_growth_fraction * limit if limit else th.leak_min_total_growth_bytes
    return growth >= floor


def _best_growth(facts: RunFacts, limit: int | None, th: Thresholds) -> _Growth | None:
    best: _Growth | None = None
    for series in facts.memory_series():
        candidates: list[tuple[str | None, SeriesStats]] = [
            (label.label, label.allocated) for label in series.by_label
        ]
        if not any(stats.count >= th.leak_min_samples for _, stats in candidates):
            candidates = [(None, series.allocated)]
        for label, stats in candidates:
            if _grows_steadily(stats, limit, th):
                growth = _Growth(series, label, stats)
                if best is None or growth.total > best.total:
                    best = growth
    return best


SPEC = RuleSpec(
    id="memory_leak",
    title="Memory grows every step (leak)",
    severity=Severity.HIGH,
    explanation=(
        "Memory that rises by about the same amount every step, measured at the same point of "
        "each step, is held by something that outlives the step: a list of losses or outputs "
        "kept as tensors (with their autograd graph), metrics accumulated on the GPU, caches "
        "keyed by ever-new shapes. The run fails wherever it happens to be when the growth "
        "reaches the limit, so the failing line is usually innocent."
    ),
    verify=(
        "memory allocated after each step (see_memory_usage, or torch.cuda.memory_allocated() "
        "logged every step) stays flat from step to step instead of climbing."
    ),
    thresholds=(
        "leak_end_tolerance",
        "leak_linearity_tolerance",
        "leak_min_growth_bytes_per_sample",
        "leak_min_piled_fraction",
        "leak_min_samples",
        "leak_min_total_growth_bytes",
        "leak_min_total_growth_fraction",
    ),
    precedence=70,
)


class MemoryLeakRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        numbers = event.message if event is not None else None
        limit = numbers.limit if numbers is not None else None
        growth = _best_growth(facts, limit, thresholds)
        evidence: list[Evidence] = []
        figures: dict[str, Figure] = {}
        confidence = 0.0
        per_step: float | None = None
        if growth is not None:
            stats = growth.stats
            per_step = stats.slope
            confidence = 0.7
            first, last = growth.series.samples[0], growth.series.samples[-1]
            where = f" at '{growth.label}'" if growth.label else ""
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"allocated (MA){where} grew from {size(stats.first)} to {size(stats.last)} "
                    f"over "
                    f"{stats.count} samples, {size(stats.slope)} per sample"
                    f"{'' if growth.series.rank is None else f' on rank {growth.series.rank}'}",
                    first.source,
                    f"first sample here, last at {last.source.describe()}",
                )
            )
            figures.update(
                samples=a_count(stats.count),
                first_allocated=in_bytes(int(stats.first)),
                last_allocated=in_bytes(int(stats.last)),
                growth_per_sample=in_bytes(int(stats.slope or 0)),
            )
        located = facts.snapshot_for(event) if event is not None else None
        if located is None and event is None:
            found = snapshot_ooms(facts)
            located = (found[0].snapshot, found[0].device) if found else None
        if located is not None:
            snapshot, device = located
            if device.leak is not None and device.leak.sites:
                leak = device.leak
                confidence = confidence + 0.15 if confidence else 0.6
                top = leak.sites[0]
                where = top.site.describe() if top.site else "unknown site"
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"live bytes grew {size(leak.bytes_per_iteration)} per iteration over "
                        f"{leak.iterations} iterations; {where} kept "
                        f"{size(top.bytes_per_iteration)} per iteration",
                        "the allocation history shows the growth and who holds it",
                    )
                )
                figures["snapshot_bytes_per_iteration"] = in_bytes(leak.bytes_per_iteration)
                figures["growth_site"] = a_text(where)
            allocated = device.state.allocated_bytes
            for site in device.live_by_site:
                piled = site.common_size * site.common_size_blocks
                # Equal blocks from one line are also every layer's activations: piles only
                # corroborate growth seen elsewhere; without a log they are a lead (low
                # confidence), with a log that shows no growth they are nothing.
                if (
                    (confidence or event is None)
                    and site.common_size_blocks >= thresholds.leak_min_samples
                    and allocated
                    and piled >= thresholds.leak_min_piled_fraction * allocated
                ):
                    where = site.site.describe() if site.site else "an unknown site"
                    confidence = confidence + 0.15 if confidence else 0.3
                    evidence.append(
                        snapshot_evidence(
                            snapshot,
                            f"{site.common_size_blocks} live blocks of {size(site.common_size)} "
                            f"each "
                            f"from {where} ({size(piled)}, {piled / allocated:.0%} of live memory)",
                            "tensors of one shape from one line piling up: the kept objects",
                        )
                    )
                    figures["piled_site"] = a_text(where)
                    figures["piled_bytes"] = in_bytes(piled)
                    break
        if not confidence:
            return
        if event is not None:
            evidence.append(
                oom_evidence(event, "where the growth ran out of room (usually not the culprit)")
            )
        failed = event is not None
        summary = (
            f"memory grew by about {size(per_step)} every step until the run "
            f"{'ran out of GPU memory' if failed else 'ended'}"
            if per_step is not None
            else "tensors of one shape from one call site piled up in GPU memory until it ran out"
        )
        missing = []
        if growth is None and not any(
            s.total_samples >= thresholds.leak_min_samples for s in facts.memory_series()
        ):
            missing.append(CAPTURE_MEMORY_SERIES)
        if located is None:
            missing.append(CAPTURE_SNAPSHOT)
        yield SPEC.diagnose(
            severity=Severity.HIGH if failed else Severity.MEDIUM,
            confidence=confidence if failed else confidence * 0.8,
            summary=summary,
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Keep nothing from a step on the GPU: log loss.item(), move kept outputs "
                    "with .detach().cpu(), and reset per-epoch accumulators; "
                    + (
                        f"the piled-up tensors come from {figures['piled_site'].value} "
                        f"({size(int(figures['piled_bytes'].value or 0))}): find what keeps its "
                        "outputs across steps."
                        if "piled_site" in figures and "piled_bytes" in figures
                        else "look at what the piled-up call site appends to."
                    ),
                    predicted_saving_bytes=int(growth.total) if growth is not None else None,
                    cost="none",
                ),
                Fix(
                    "Confirm the culprit with a snapshot diff: dump torch.cuda.memory._snapshot() "
                    "at two steps and compare the live blocks by call site.",
                    cost="a debugging run",
                ),
            ),
            missing=tuple(missing),
            rank=event.rank if event is not None else growth.series.rank if growth else None,
            figures=figures,
        )


RULE = MemoryLeakRule()
