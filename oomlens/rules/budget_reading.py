"""How the ZeRO memory model's budget reads against what happened to the run.

The memory model (``RunFacts.memory_model``) predicts each device's peak from the config alone;
the run then either ran out of that memory or did not.  A capacity the model says fits, in a
run that died of that very memory, is read as "the model's peak fits, yet the run ran out": what
the model does not count took the rest, and this module names what that is for this run.  The
model's config patches are ordered so that those changing what the top diagnosis' own fix
changes come first.  The report carries the reading; renderers only format it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oomlens.diagnosis import Diagnosis, Verdict
from oomlens.facts.memory_model import CapacityVerdict, ConfigPatch
from oomlens.facts.run import RunFacts
from oomlens.units import format_size


@dataclass(frozen=True, slots=True)
class CapacityReading:
    """One device kind's capacity verdict, read against the run."""

    verdict: CapacityVerdict
    ran_out: bool
    """The model's peak fits, yet the run died for lack of this memory."""
    uncounted: tuple[str, ...] = ()
    """What the model does not count, which took the rest (when ``ran_out``)."""


@dataclass(frozen=True, slots=True)
class BudgetReading:
    """The memory model's verdicts and patches as this run reads them."""

    capacities: tuple[CapacityReading, ...]
    patches: tuple[ConfigPatch, ...]
    """The model's patches: those that change what the top diagnosis' fix changes first, then
    most memory saved first (the model's order)."""


def read_budget(facts: RunFacts, verdict: Verdict, top: Diagnosis | None) -> BudgetReading | None:
    """The reading of ``facts.memory_model`` for a run whose verdict is ``verdict`` and whose
    most likely diagnosis is ``top``; None without a memory model."""
    model = facts.memory_model
    if model is None:
        return None
    patches = tuple(_own_fix_first(top, model.patches))
    capacities = tuple(
        CapacityReading(v, True, _uncounted(facts, v.kind))
        if v.fits and _died_of(verdict, v.kind)
        else CapacityReading(v, False)
        for v in model.verdicts
    )
    return BudgetReading(capacities, patches)


def _died_of(verdict: Verdict, kind: str) -> bool:
    """The run failed for lack of the memory a capacity verdict is about."""
    return verdict is (Verdict.GPU_OOM if kind == "gpu" else Verdict.HOST_OOM)


def _uncounted(facts: RunFacts, kind: str) -> tuple[str, ...]:
    """What the memory model does not count on ``kind`` memory, for this run."""
    if kind != "gpu":
        return (
            "other processes and the page cache",
            "data-loader workers",
            "host copies the model does not list",
        )
    budget = facts.memory_model.budget if facts.memory_model is not None else None
    uncounted = [
        "activations and temporaries (not modelled)"
        if budget is None or budget.activations is None
        else "activations and temporaries beyond the estimate"
    ]
    if budget is not None and budget.stage == 3 and budget.model.largest_layer_params is None:
        # ZeRO-3 gathers one module at a time; without the largest layer's size the model
        # leaves the module being gathered out of its working set.
        uncounted.append("the module being gathered (its size is unknown)")
    event = facts.signals.first_gpu_oom
    stuck = event.message.reserved_unallocated if event is not None else None
    if stuck:
        uncounted.append(f"{format_size(stuck)} the allocator held unused at the OOM")
    uncounted.append("library workspaces")
    return tuple(uncounted)


def _own_fix_first(top: Diagnosis | None, patches: Sequence[ConfigPatch]) -> list[ConfigPatch]:
    keys: set[str] = set()
    for fix in top.fixes if top is not None else ():
        keys.update(_leaf_keys(fix.config_patch or {}))
    if not keys:
        return list(patches)
    return sorted(
        patches,
        key=lambda p: not any(c.key_path.rsplit(".", 1)[-1] in keys for c in p.changes),
    )


def _leaf_keys(patch: object) -> set[str]:
    if not isinstance(patch, dict):
        return set()
    found: set[str] = set()
    for key, value in patch.items():
        found |= _leaf_keys(value) if isinstance(value, dict) else {str(key)}
    return found
