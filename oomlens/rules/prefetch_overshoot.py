"""ZeRO-3's working-set settings raised far above DeepSpeed's defaults: it gathers more
parameters at once than the card holds.  Only proposes changes to values not already in force."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, Figure, Fix, Severity, a_count, in_bytes
from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.log import Phase
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_CONFIG
from oomlens.rules.common.evidence import (
    config_evidence,
    leaf_key,
    oom_evidence,
    phase_evidence,
    size,
    snapshot_evidence,
)
from oomlens.rules.common.message import allocator_oom, in_zero3_gather
from oomlens.rules.common.model_states import (
    SnapshotOom,
    category_share,
    effective_config,
    live_bytes,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.thresholds import Thresholds

#: DeepSpeed 0.19.8's defaults (deepspeed/runtime/zero/config.py), in elements.
WORKING_SET_DEFAULTS = {
    "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 1_000_000_000,
    "max_reuse_distance": 1_000_000_000,
}


def _restore_defaults(raised: list[tuple[ConfigValue[int], int]], saving: int | None = None) -> Fix:
    """Put the raised working-set knobs back to DeepSpeed's defaults (the config's spelling)."""
    return Fix(
        "Restore DeepSpeed's defaults for the raised working-set settings.",
        config_patch={"zero_optimization": {leaf_key(v): default for v, default in raised}},
        predicted_saving_bytes=saving,
        cost="less overlap of gathers with compute: a few percent slower steps",
    )


def _live_after_fix(effective: EffectiveDsConfig) -> int:
    """The elements that may stay gathered once the defaults are back: the live-parameter
    bound (``stage3_max_live_parameters``, at most its default), not the prefetch bucket
    alone: with the defaults a 1e9-element working set is still allowed."""
    live = effective.zero.max_live_parameters.value
    default = WORKING_SET_DEFAULTS["max_live_parameters"]
    return min(int(live), default) if isinstance(live, int | float) else default


def _raised_working_set(
    effective: EffectiveDsConfig, factor: float
) -> list[tuple[ConfigValue[int], int]]:
    zero = effective.zero
    raised = []
    for name, default in WORKING_SET_DEFAULTS.items():
        value: ConfigValue[int] = getattr(zero, name)
        if isinstance(value.value, int | float) and value.value >= factor * default:
            raised.append((value, default))
    return raised


SPEC = RuleSpec(
    id="prefetch_overshoot",
    title="ZeRO-3 gathers too many parameters at once",
    severity=Severity.HIGH,
    explanation=(
        "ZeRO-3 keeps each GPU's share of the parameters and all-gathers a module's full "
        "parameters just before it runs. stage3_prefetch_bucket_size bounds how many elements "
        "are fetched ahead, stage3_max_live_parameters how many may be gathered at once, and "
        "stage3_max_reuse_distance keeps gathered parameters that will be used again soon. "
        "Raised far above their defaults they let a whole model's parameters be gathered at "
        "once, in 16 bits, on every GPU: the memory ZeRO-3 was supposed to save."
    ),
    verify=(
        "DeepSpeed's see_memory_usage peak (Max_MA) during forward and backward drops back "
        "towards the default settings' level; a few 'allocator cache flushes' warnings are "
        "normal."
    ),
    thresholds=("gathered_params_min_fraction", "prefetch_overshoot_factor"),
    precedence=80,
)


class PrefetchOvershootRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        effective = effective_config(facts)
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s, effective, thresholds)
        event = allocator_oom(facts)
        if effective is None or event is None or effective.zero.stage.value != 3:
            return
        raised = _raised_working_set(effective, thresholds.prefetch_overshoot_factor)
        if not raised:
            return
        if event.phase not in (
            Phase.FORWARD,
            Phase.BACKWARD,
            Phase.UNKNOWN,
        ) and not in_zero3_gather(event):
            return
        evidence: list[Evidence] = [
            config_evidence(value, f"{value.value / default:,.0f}x DeepSpeed's default {default:,}")
            for value, default in raised
        ]
        confidence = 0.5
        if in_zero3_gather(event):
            confidence += 0.2
            evidence.insert(
                0, oom_evidence(event, "the failing allocation is a ZeRO-3 parameter all-gather")
            )
        else:
            evidence.insert(0, oom_evidence(event))
        placed = phase_evidence(facts, event)
        if placed is not None:
            evidence.append(placed)
        element = effective.precision.param_bytes
        figures: dict[str, Figure] = {leaf_key(v): a_count(v.value) for v, _ in raised}
        saving: int | None = None
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            gathered = live_bytes(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
            share = category_share(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
            figures["gathered_param_bytes"] = in_bytes(gathered)
            if share >= thresholds.gathered_params_min_fraction:
                confidence += 0.15
                saving = max(0, gathered - _live_after_fix(effective) * element)
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"device {device.device}: gathered ZeRO-3 parameters hold {size(gathered)} "
                        f"({share:.0%} of live memory)",
                        "the gathered working set, not activations or states, fills the card",
                    )
                )
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                "ZeRO-3's working-set settings ("
                + ", ".join(f"{leaf_key(v)}={v.value:,.0f}" for v, _ in raised)
                + ") let it gather far more parameters than the GPU could hold"
            ),
            evidence=tuple(evidence),
            fixes=(
                _restore_defaults(raised, saving),
                Fix(
                    "If memory is still short, disable prefetch and caching entirely.",
                    config_patch={
                        "zero_optimization": {
                            "stage3_prefetch_bucket_size": 0,
                            "stage3_max_reuse_distance": 0,
                        }
                    },
                    cost="slower steps (every gather waits)",
                ),
            ),
            rank=event.rank,
            figures=figures,
        )

    def _from_snapshot(
        self, s: SnapshotOom, effective: EffectiveDsConfig | None, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        """A snapshot without its log: gathered parameters fill the card and a gather failed."""
        oom, device = s.device.oom, s.device
        share = category_share(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
        if (
            oom is None
            or oom.category is not MemoryCategory.ZERO3_GATHERED_PARAMS
            or share < thresholds.gathered_params_min_fraction
        ):
            return
        gathered = live_bytes(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
        evidence = [
            snapshot_oom_evidence(s, "a ZeRO-3 parameter gather failed"),
            snapshot_evidence(
                s.snapshot,
                f"gathered ZeRO-3 parameters hold {size(gathered)} ({share:.0%} of live memory)",
                "the gathered working set fills the card",
            ),
        ]
        raised = (
            _raised_working_set(effective, thresholds.prefetch_overshoot_factor)
            if effective is not None
            else []
        )
        evidence += [config_evidence(v, "raised above DeepSpeed's default") for v, _ in raised]
        fixes = (
            (_restore_defaults(raised),)
            if raised
            else (
                Fix(
                    "Lower stage3_prefetch_bucket_size, stage3_max_live_parameters and "
                    "stage3_max_reuse_distance (DeepSpeed's defaults: 5e7, 1e9, 1e9; 0 disables "
                    "prefetch and caching).",
                    cost="slower steps",
                ),
            )
        )
        yield SPEC.diagnose(
            confidence=0.75 if raised else 0.5,
            summary=f"ZeRO-3 held {size(gathered)} of gathered parameters when a gather failed",
            evidence=tuple(evidence),
            fixes=fixes,
            missing=() if effective is not None else (CAPTURE_CONFIG,),
            rank=s.snapshot.source.rank,
            figures={"gathered_param_bytes": in_bytes(gathered)},
        )


RULE = PrefetchOvershootRule()
