"""Parameters, gradients and optimizer states cannot fit, whatever the batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, in_bytes
from oomlens.facts.log import Phase
from oomlens.facts.memory_model import MODEL_STATE_COMPONENTS
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_SNAPSHOT
from oomlens.rules.common.evidence import (
    config_evidence,
    oom_evidence,
    oom_figures,
    oversized_evidence,
    phase_evidence,
    size,
    snapshot_evidence,
)
from oomlens.rules.common.fit import states_fixes
from oomlens.rules.common.message import (
    allocator_oom,
    demand_exceeds_card,
    fullness,
    message_balance,
    others_dominate,
    oversized,
)
from oomlens.rules.common.model_states import (
    MODEL_STATE_CATEGORIES,
    SnapshotOom,
    category_share,
    effective_config,
    live_bytes,
    model_overflow,
    model_patch_fixes,
    snapshot_oom_evidence,
    snapshot_ooms,
    states_account_evidence,
)
from oomlens.rules.common.timeline import (
    CUT_PLACE_CONFIDENCE,
    first_step_optimizer_oom,
    optimizer_state_init,
    phase,
    steps_completed_before,
)
from oomlens.rules.thresholds import Thresholds

_LONE_MESSAGE_CONFIDENCE = 0.25
"""A full card and no frame to place the failure: the model's states, named below the batch."""

SPEC = RuleSpec(
    id="model_states_too_large",
    title="Model states do not fit",
    severity=Severity.CRITICAL,
    explanation=(
        "Mixed-precision Adam keeps about 16-18 bytes per parameter: 16-bit weights and "
        "gradients, fp32 master weights and two fp32 moments (created at the first optimizer "
        "step). ZeRO-3 divides them by the number of GPUs; offloading the optimizer moves the "
        "12-14 bytes of fp32 state to host memory. When the first optimizer step (or the "
        "model's creation) fails, the states themselves do not fit, whatever the batch size."
    ),
    verify=(
        "oomlens check on the patched config with --params, --gpus and --gpu-memory prints a GPU "
        "budget that fits, and the first optimizer step (where Adam creates its states) "
        "completes."
    ),
    thresholds=(
        "fragmentation_min_unallocated_bytes",
        "fragmentation_min_unallocated_fraction",
        "model_states_max_fraction",
        "model_states_min_fraction",
        "model_states_snapshot_fraction",
        "other_process_self_match_bytes",
        "other_process_unlisted_fraction",
        "other_process_unlisted_min_bytes",
        "others_dominate_fraction",
        "own_tensors_min_fraction",
    ),
    precedence=60,
)


class ModelStatesRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s, thresholds)
        event = allocator_oom(facts)
        if event is None:
            yield from self._cut_in_loading(facts)
            return
        n = event.message
        confidence = 0.0
        evidence: list[Evidence] = []
        if first_step_optimizer_oom(facts, event) or optimizer_state_init(event):
            confidence = 0.6
            evidence.append(
                oom_evidence(
                    event,
                    "the failure is in the first optimizer step, where the optimizer "
                    "creates its states",
                )
            )
            placed = phase_evidence(facts, event)
            if placed is not None:
                evidence.append(placed)
        elif phase(facts, event) is Phase.MODEL_INIT:
            confidence = 0.55
            evidence.append(
                oom_evidence(
                    event,
                    "the failure is while the model is created, loaded "
                    "or partitioned, before any training step",
                )
            )
            placed = phase_evidence(facts, event)
            if placed is not None:
                evidence.append(placed)
        elif (
            phase(facts, event) is Phase.OPTIMIZER_STEP
            and steps_completed_before(facts, event) is None
        ):
            # Adam creates its moments at the first step and works on fp32 copies at every
            # step; with no step count to say which, the states are the first suspect (after
            # completed steps they existed and fit: not this path).
            confidence = 0.45
            evidence.append(
                oom_evidence(event, "the failure is in the optimizer step, which holds the states")
            )
            placed = phase_evidence(facts, event)
            if placed is not None:
                evidence.append(placed)
        elif phase(facts, event) is Phase.UNKNOWN and demand_exceeds_card(
            message_balance(n, thresholds), thresholds
        ):
            # The card was full of this process' own tensors and no frame says which pass:
            # the states are the second candidate after the batch's activations.
            confidence = _LONE_MESSAGE_CONFIDENCE
            evidence.append(
                oom_evidence(
                    event,
                    "live tensors filled the card; no traceback says whether they were the "
                    "model's states or a batch's activations",
                )
            )
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            share = category_share(device, MODEL_STATE_CATEGORIES)
            states = live_bytes(device, MODEL_STATE_CATEGORIES)
            if share >= thresholds.model_states_min_fraction:
                confidence = confidence + 0.2 if confidence else 0.45
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"device {device.device}: parameters, gradients and optimizer state hold "
                        f"{size(states)} of {size(device.state.allocated_bytes)} live "
                        f"({share:.0%})",
                        "model states fill the card",
                    )
                )
            elif confidence and share < thresholds.model_states_max_fraction:
                confidence -= 0.2
        overflow = model_overflow(facts)
        if overflow is not None and confidence:
            confidence += 0.15
            evidence.append(overflow[0])
        elif (
            overflow is not None
            and overflow[1].overflow_component is not None
            and (overflow[1].overflow_component.code in MODEL_STATE_COMPONENTS)
        ):
            confidence = 0.5
            evidence.append(overflow[0])
        accounted = states_account_evidence(facts, supports=True)
        if accounted is not None:
            # arithmetic with nothing assumed: the states cannot fit, whatever the pass
            confidence = confidence + 0.1 if confidence else 0.5
            evidence.append(accounted)
        if not confidence:
            return
        if oversized(n):
            confidence = min(confidence, 0.2)
            evidence.append(oversized_evidence(event))
        if others_dominate(n, thresholds):
            confidence *= 0.5
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    "other processes hold most of the card",
                    event.source,
                    "the states would fit on the card alone",
                    supports=False,
                )
            )
        effective = effective_config(facts)
        fixes: list[Fix] = model_patch_fixes(facts) if overflow is not None else []
        if effective is not None and not fixes:
            zero = effective.zero
            if zero.stage.value < 3:
                fixes.append(
                    Fix(
                        "Partition parameters, gradients and optimizer states across "
                        "GPUs with ZeRO stage 3.",
                        config_patch={"zero_optimization": {"stage": 3}},
                        cost="more communication per step",
                    )
                )
            if not zero.offload_optimizer.enabled:
                evidence.append(
                    config_evidence(
                        zero.offload_optimizer.device, "optimizer states stay on the GPU"
                    )
                )
                fixes.append(
                    Fix(
                        "Keep the fp32 master weights and Adam moments in host memory.",
                        config_patch={
                            "zero_optimization": {"offload_optimizer": {"device": "cpu"}}
                        },
                        cost="optimizer step on the CPU: slower steps, ~16 bytes/param "
                        "of host RAM per node",
                    )
                )
            elif not zero.offload_param.enabled and zero.stage.value == 3:
                fixes.append(
                    Fix(
                        "Also keep the 16-bit parameter partitions in host memory.",
                        config_patch={"zero_optimization": {"offload_param": {"device": "cpu"}}},
                        cost="parameters fetched from the host every pass: much slower",
                    )
                )
        elif effective is None:
            computed = (
                states_fixes(facts.account, facts.context) if facts.account is not None else []
            )
            fixes.extend(computed)
            if not computed:
                fixes.append(
                    Fix(
                        "Shard the model states across GPUs (DeepSpeed ZeRO-3 or PyTorch "
                        "FSDP) or offload the optimizer to CPU.",
                        cost="more communication per step",
                    )
                )
        fixes.append(
            Fix(
                "Use more GPUs (ZeRO-3 divides the states by the GPU count) or an "
                "optimizer with smaller states (8-bit Adam, Adafactor).",
                cost="hardware, or possibly different convergence",
            )
        )
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(f"parameters, gradients and optimizer states do not fit: {fullness(n)}"),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if located else (CAPTURE_SNAPSHOT,),
            rank=event.rank,
            figures=oom_figures(n),
        )

    @staticmethod
    def _cut_in_loading(facts: RunFacts) -> Iterator[Diagnosis]:
        """A traceback cut before its exception while the model is loaded, placed or
        partitioned, and no error anywhere: named low (``CUT_PLACE_CONFIDENCE``)."""
        cut = facts.signals.cut_in(frozenset({Phase.MODEL_INIT}))
        if cut is None or cut.phase_evidence is None:
            return
        yield SPEC.diagnose(
            confidence=CUT_PLACE_CONFIDENCE,
            summary="the traceback stops while the model is created or loaded; its error is "
            "cut off",
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    cut.phase_evidence,
                    cut.phase_source or cut.source,
                    "the failure happened before any training step; if it was out of "
                    "memory, the model's own states did not fit",
                ),
            ),
            fixes=(
                Fix(
                    "Shard the model states across GPUs (DeepSpeed ZeRO-3 or PyTorch FSDP), "
                    "load in 8/4-bit, or offload.",
                    cost="more communication per step",
                ),
            ),
            missing=("the end of the traceback: its exception line (out of memory or not)",),
        )

    def _from_snapshot(self, s: SnapshotOom, thresholds: Thresholds) -> Iterator[Diagnosis]:
        oom, device = s.device.oom, s.device
        if oom is None or oom.category is not MemoryCategory.OPTIMIZER_STATE:
            return
        share = category_share(device, MODEL_STATE_CATEGORIES)
        states = live_bytes(device, MODEL_STATE_CATEGORIES)
        confidence = 0.6 + (0.1 if share >= thresholds.model_states_snapshot_fraction else 0.0)
        evidence = [
            snapshot_oom_evidence(s, "the failing request creates optimizer state"),
            snapshot_evidence(
                s.snapshot,
                f"parameters, gradients and optimizer state hold {size(states)} ({share:.0%} "
                "of live memory)",
            ),
        ]
        if s.device_exhausted:
            confidence *= 0.7
            evidence.append(
                snapshot_evidence(
                    s.snapshot,
                    f"only {size(s.device_free)} was free on the device",
                    "something outside this process' allocator may have held the card",
                    supports=False,
                )
            )
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"creating optimizer state failed: {size(s.request)} needed with "
                f"{size(s.allocated)} already allocated, {size(states)} of it model states"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Shard the model states across GPUs (DeepSpeed ZeRO-3 or PyTorch FSDP) or "
                    "offload the optimizer to CPU.",
                    cost="more communication per step",
                ),
            ),
            missing=("the job's log and ds_config (stage, offload, GPU count)",),
            rank=s.snapshot.source.rank,
            figures={
                "model_state_bytes": in_bytes(states),
                "tried_to_allocate": in_bytes(s.request),
            },
        )


RULE = ModelStatesRule()
