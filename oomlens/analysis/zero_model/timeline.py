"""When the budget's components exist, in the order DeepSpeed allocates them (engine init,
first forward/backward, first optimizer step - when Adam states are created -, later passes),
and what that means against a capacity: the peaks, and where the card or the host overflows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from oomlens.facts.memory_model import (
    BudgetPhase,
    Capacity,
    CapacityVerdict,
    Device,
    MemoryBudget,
    MemoryComponent,
)

# -- timelines and capacity --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Step:
    label: str
    adds: tuple[MemoryComponent, ...]
    frees: tuple[MemoryComponent, ...]


@dataclass(frozen=True, slots=True)
class _Walk:
    peak: int
    peak_label: str
    first_over: tuple[str, MemoryComponent, int] | None


def _gpu_timeline(budget: MemoryBudget) -> list[_Step]:
    gpu = budget.on(Device.GPU)
    persistent_init = tuple(
        c for c in gpu if c.phase is BudgetPhase.PERSISTENT and c.code != "optimizer_states"
    )
    states = tuple(c for c in gpu if c.code == "optimizer_states")
    init = tuple(c for c in gpu if c.phase is BudgetPhase.INIT)
    fwd = tuple(c for c in gpu if c.phase is BudgetPhase.FORWARD_BACKWARD)
    step = tuple(c for c in gpu if c.phase is BudgetPhase.OPTIMIZER_STEP)
    return [
        _Step("engine init", persistent_init + init, init),
        _Step("first forward/backward", fwd, fwd),
        _Step("first optimizer step", states + step, step),
        _Step("forward/backward after the first step", fwd, fwd),
    ]


#: Timeline steps by the phase name a rule knows from the OOM traceback.
_PHASE_STEPS = {
    "engine init": ("engine init",),
    "forward/backward": ("first forward/backward", "forward/backward after the first step"),
    "optimizer step": ("first optimizer step",),
}


def gpu_phase_totals(budget: MemoryBudget) -> dict[str, int]:
    """GPU bytes in use at the end of each phase's allocations (``engine init``,
    ``forward/backward`` - the larger of the first and later passes -, ``optimizer step``)."""
    at_step: dict[str, int] = {}
    total = 0
    for step in _gpu_timeline(budget):
        total += sum(c.bytes for c in step.adds)
        at_step[step.label] = total
        total -= sum(c.bytes for c in step.frees)
    return {
        phase: max(at_step[label] for label in labels) for phase, labels in _PHASE_STEPS.items()
    }


def phase_of_step(label: str) -> str:
    """``"first forward/backward"`` -> ``"forward/backward"``."""
    for phase, labels in _PHASE_STEPS.items():
        if label in labels:
            return phase
    return label


def _scaled(comp: MemoryComponent, ranks: int) -> MemoryComponent:
    if comp.per_host or ranks == 1:
        return comp
    return replace(comp, bytes=comp.bytes * ranks, formula=f"{ranks} ranks x ({comp.formula})")


def _host_timeline(budget: MemoryBudget) -> list[_Step]:
    ranks = budget.topology.ranks_per_host
    host = [_scaled(c, ranks) for c in budget.on(Device.HOST)]
    persistent_init = tuple(
        c for c in host if c.phase is BudgetPhase.PERSISTENT and c.code != "host_optimizer_states"
    )
    states = tuple(c for c in host if c.code == "host_optimizer_states")
    init = tuple(c for c in host if c.phase is BudgetPhase.INIT)
    save = tuple(c for c in host if c.phase is BudgetPhase.CHECKPOINT_SAVE)
    step = tuple(c for c in host if c.phase is BudgetPhase.OPTIMIZER_STEP)
    return [
        _Step("engine init", persistent_init + init, init),
        _Step("first optimizer step", states + step, step),
        _Step("checkpoint save", save, save),
    ]


def _walk(steps: Iterable[_Step], capacity: int | None) -> _Walk:
    total = 0
    peak = 0
    peak_label = ""
    first: tuple[str, MemoryComponent, int] | None = None
    for step in steps:
        for comp in step.adds:
            total += comp.bytes
            if total > peak:
                peak, peak_label = total, step.label
            if capacity is not None and first is None and total > capacity:
                # Blame the largest allocation of the step where the total crossed the
                # capacity: within a step the order of allocations is not known, their sizes are.
                largest = max(step.adds, key=lambda c: c.bytes)
                first = (step.label, largest, total - capacity)
        for comp in step.frees:
            total -= comp.bytes
    return _Walk(peak, peak_label, first)


def compare_with_capacity(budget: MemoryBudget, capacity: Capacity) -> list[CapacityVerdict]:
    """GPU, host and pinned-host verdicts for the capacities given (a missing capacity gives no
    verdict)."""
    verdicts: list[CapacityVerdict] = []
    if capacity.gpu_bytes is not None:
        usable = capacity.gpu_bytes - capacity.gpu_reserved_bytes
        walk = _walk(_gpu_timeline(budget), usable)
        verdicts.append(_verdict("gpu", usable, capacity.gpu_source, walk))
    if capacity.host_bytes is not None:
        walk = _walk(_host_timeline(budget), capacity.host_bytes)
        verdicts.append(_verdict("host", capacity.host_bytes, capacity.host_source, walk))
        ranks = budget.topology.ranks_per_host
        pinned = [_scaled(c, ranks) for c in budget.on(Device.HOST) if c.pinned]
        walk = _walk([_Step("pinned host buffers", tuple(pinned), ())], capacity.host_bytes)
        verdicts.append(_verdict("pinned", capacity.host_bytes, capacity.host_source, walk))
    return verdicts


def _verdict(kind: str, capacity: int, source: str, walk: _Walk) -> CapacityVerdict:
    over = walk.first_over
    return CapacityVerdict(
        kind=kind,
        capacity_bytes=capacity,
        capacity_source=source,
        required_bytes=walk.peak,
        peak_phase=walk.peak_label,
        headroom_bytes=capacity - walk.peak,
        overflow_component=over[1] if over else None,
        overflow_phase=over[0] if over else None,
        overflow_bytes=max(0, walk.peak - capacity),
    )


def gpu_peak(budget: MemoryBudget, phase: str | None = None) -> int:
    """The GPU peak, over the whole timeline or within one step of it (``"engine init"``,
    ``"forward/backward"``, ``"optimizer step"``)."""
    if phase is None:
        return _walk(_gpu_timeline(budget), None).peak
    return gpu_phase_totals(budget)[phase]


def host_peak(budget: MemoryBudget) -> int:
    """One host's peak, all its ranks together."""
    return _walk(_host_timeline(budget), None).peak
