"""Activations fill the card during a forward or backward pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, in_bytes
from oomlens.facts.log import Phase
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules._common import (
    CAPTURE_SNAPSHOT,
    MODEL_STATE_CATEGORIES,
    SnapshotOom,
    allocator_oom,
    capacity_evidence,
    category_share,
    effective_config,
    in_zero3_gather,
    little_stuck,
    live_bytes,
    near_full,
    oom_evidence,
    oom_figures,
    others_dominate,
    phase_evidence,
    size,
    snapshot_evidence,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds


def _activation_fixes(facts: RunFacts | None, saving: int | None) -> Iterator[Fix]:
    """A smaller micro batch (unless it is 1 already: there is nothing to halve), then
    activation checkpointing."""
    effective = effective_config(facts) if facts is not None else None
    micro_is_one = False
    if effective is not None:
        micro = effective.batch.micro_batch_per_gpu
        micro_is_one = micro.value == 1
        gas = effective.batch.gradient_accumulation_steps
        if isinstance(micro.value, int) and isinstance(gas.value, int) and micro.value > 1:
            new_micro = micro.value // 2
            new_gas = gas.value * micro.value // new_micro if micro.value % new_micro == 0 else None
            if new_gas is not None:
                yield Fix(
                    f"Halve the micro batch ({micro.value} -> {new_micro}) and double gradient "
                    f"accumulation ({gas.value} -> {new_gas}): the same global batch with half "
                    "the activations.",
                    config_patch={
                        "train_micro_batch_size_per_gpu": new_micro,
                        "gradient_accumulation_steps": new_gas,
                    },
                    predicted_saving_bytes=saving,
                    cost="about the same tokens per second when the GPU stays busy",
                )
    if not micro_is_one:
        yield Fix(
            "Use a smaller micro batch and more gradient-accumulation steps (same global batch).",
            command="--per_device_train_batch_size N/2 --gradient_accumulation_steps 2*G "
            "(or your script's equivalent)",
            predicted_saving_bytes=saving,
            cost="slightly lower throughput per step",
        )
    yield Fix(
        "Recompute activations in the backward pass instead of keeping them.",
        command="model.gradient_checkpointing_enable()  # HF; or torch.utils.checkpoint per block",
        cost="about 30% more compute per step",
    )


_MIN_CONFIDENCE = 0.3
"""Below this the activations are a guess: the report says what is missing instead."""

SPEC = RuleSpec(
    id="activation_memory",
    title="Activations exceed the memory left",
    severity=Severity.HIGH,
    explanation=(
        "During the forward pass every layer keeps its intermediate tensors for the backward "
        "pass. Their size grows with micro-batch size x sequence length x hidden size x "
        "layers (and the logits with the vocabulary), independently of ZeRO, which partitions "
        "only parameters, gradients and optimizer states. When the card is full of live "
        "tensors during a forward or backward pass, the activations are what to shrink."
    ),
    verify=(
        "the peak of torch.cuda.max_memory_allocated() over the first steps drops by about the "
        "activations' share, and training gets past the step that failed."
    ),
    thresholds=(
        "activations_min_fraction",
        "capacity_near_full_fraction",
        "fragmentation_min_unallocated_bytes",
        "fragmentation_min_unallocated_fraction",
        "model_states_against_activations_fraction",
        "others_dominate_fraction",
    ),
    precedence=40,
)


class ActivationMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s, thresholds)
        event = allocator_oom(facts)
        if event is None or event.phase not in (Phase.FORWARD, Phase.BACKWARD):
            return
        n = event.message
        evidence = [e for e in (phase_evidence(event),) if e is not None]
        confidence = 0.35
        if near_full(n, thresholds) and little_stuck(n, thresholds):
            confidence = 0.6
            evidence.insert(0, capacity_evidence(event, n))
        else:
            evidence.insert(0, oom_evidence(event))
        if in_zero3_gather(event):
            confidence -= 0.25
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    "the failing allocation is a ZeRO-3 parameter gather",
                    event.source,
                    "gathered parameters, not activations, were being allocated",
                    supports=False,
                )
            )
        if others_dominate(n, thresholds):
            confidence -= 0.3
        figures = oom_figures(n)
        saving: int | None = None
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            share = category_share(device, [MemoryCategory.ACTIVATIONS])
            activations = live_bytes(device, [MemoryCategory.ACTIVATIONS])
            figures["activation_bytes"] = in_bytes(activations)
            if share >= thresholds.activations_min_fraction:
                confidence += 0.2
                saving = activations // 2
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"device {device.device}: {size(activations)} of "
                        f"{size(device.state.allocated_bytes)} live was allocated in forward "
                        f"passes "
                        f"({share:.0%})",
                        "activations dominate the live memory at the OOM",
                    )
                )
            elif (
                category_share(device, MODEL_STATE_CATEGORIES)
                >= thresholds.model_states_against_activations_fraction
            ):
                confidence -= 0.2
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"model states are {category_share(device, MODEL_STATE_CATEGORIES):.0%} "
                        "of live memory",
                        "parameters, gradients and optimizer state, not activations, fill the card",
                    )
                )
        if confidence < _MIN_CONFIDENCE:
            return
        fixes = list(_activation_fixes(facts, saving))
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"the {event.phase.value} pass filled the GPU with live tensors: "
                f"{size(n.allocated_by_pytorch)} allocated of {size(n.limit)} {n.limit_name} when "
                f"{size(n.tried_to_allocate)} more was needed"
            ),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if located else (CAPTURE_SNAPSHOT,),
            rank=event.rank,
            figures=figures,
        )

    def _from_snapshot(self, s: SnapshotOom, thresholds: Thresholds) -> Iterator[Diagnosis]:
        oom, device = s.device.oom, s.device
        share = category_share(device, [MemoryCategory.ACTIVATIONS])
        if (
            oom is None
            or oom.category is not MemoryCategory.ACTIVATIONS
            or share < thresholds.activations_min_fraction
        ):
            return
        activations = live_bytes(device, [MemoryCategory.ACTIVATIONS])
        yield SPEC.diagnose(
            confidence=0.6,
            summary=(
                f"tensors allocated in forward passes hold {size(activations)} of "
                f"{size(s.allocated)} live ({share:.0%}) and the failing request was one more"
            ),
            evidence=(
                snapshot_oom_evidence(s, "an activation allocation failed"),
                snapshot_evidence(
                    s.snapshot,
                    f"activations {size(activations)} ({share:.0%} of live memory)",
                    "activations dominate",
                ),
            ),
            fixes=tuple(_activation_fixes(None, activations // 2)),
            missing=(
                "the job's log (phase of the failure: training step, evaluation or generation)",
            ),
            rank=s.snapshot.source.rank,
            figures={
                "activation_bytes": in_bytes(activations),
                "tried_to_allocate": in_bytes(s.request),
            },
        )


RULE = ActivationMemoryRule()
