"""Activations fill the card during a forward or backward pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, in_bytes
from oomlens.facts.config import Origin
from oomlens.facts.log import OomKind, Phase
from oomlens.facts.oom_balance import MessageBalance
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_SNAPSHOT
from oomlens.rules.common.evidence import (
    capacity_evidence,
    frame_site,
    oom_evidence,
    oom_figures,
    oversized_evidence,
    phase_evidence,
    size,
    snapshot_evidence,
)
from oomlens.rules.common.fit import divide_batch_fix, micro_batch_fix, states_exceed
from oomlens.rules.common.message import (
    allocator_oom,
    demand_exceeds_card,
    fullness,
    little_stuck,
    message_balance,
    near_full,
    others_dominate,
    request_fills_card,
    zero3_gather_frame,
)
from oomlens.rules.common.model_states import (
    MODEL_STATE_CATEGORIES,
    SnapshotOom,
    category_share,
    effective_config,
    live_bytes,
    snapshot_oom_evidence,
    snapshot_ooms,
    states_account_evidence,
)
from oomlens.rules.common.timeline import failed_before_training, phase
from oomlens.rules.thresholds import Thresholds


def _activation_fixes(facts: RunFacts | None, saving: int | None) -> Iterator[Fix]:
    """The micro batch that fits, computed from the run's memory account when it knows the
    micro batch; else a smaller micro batch (unless it is 1 already: there is nothing to
    halve); then activation checkpointing.  No batch fix when the model states alone leave
    no room: no batch fits then."""
    effective = effective_config(facts) if facts is not None else None
    if facts is not None and facts.account is not None:
        if states_exceed(facts.account):
            yield _CHECKPOINTING
            return
        # a batch the HF Trainer / Accelerate fill in ("auto") is set by their arguments: a
        # number in the config would contradict TrainingArguments, which refuses to start
        batch = effective.batch.micro_batch_per_gpu if effective is not None else None
        in_config = batch is not None and batch.origin not in _AUTO
        computed, fit = micro_batch_fix(facts.account, facts.context, ds_config=in_config)
        computed = computed or divide_batch_fix(facts.account, facts.context)
        if computed is not None:
            yield computed
            yield _CHECKPOINTING
            return
        if fit is not None and fit.proposed < 1:
            yield _CHECKPOINTING
            return
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
    yield _CHECKPOINTING


_AUTO = frozenset({Origin.AUTO_RESOLVED, Origin.AUTO_UNRESOLVED})

_CHECKPOINTING = Fix(
    "Recompute activations in the backward pass instead of keeping them.",
    command="model.gradient_checkpointing_enable()  # HF; or torch.utils.checkpoint per block",
    cost="about 30% more compute per step",
)


_MIN_CONFIDENCE = 0.25
"""Below this the activations are not worth naming."""
_LONE_MESSAGE_CONFIDENCE = 0.3
"""A full card and no frame to place the failure: the commonest cause, named low.  Base rate
(development split of the field corpus): of the 14 lone allocator messages of a full card with
no frame, 9 threads blamed activations (the batch) and a 10th accepts them, 4 the model's
states, 1 a checkpoint save."""
_LARGE_REQUEST_CONFIDENCE = 0.25
"""As above, but one request as large as the live tensors made the difference: a single
tensor that large is as often an evaluation's accumulated outputs or a shape as activations."""

_CUT_MESSAGE_CONFIDENCE = _MIN_CONFIDENCE
"""As a lone full message, but the message is cut before the allocator's figures: the cached
share (fragmentation) cannot be ruled out, so the lowest named confidence."""


def _own_demand_in_a_cut_message(b: MessageBalance, thresholds: Thresholds) -> bool:
    """A message cut before its reserved figure that still shows this process' own holding
    (``allocated by PyTorch`` or ``this process has``) filling the card: at least
    ``own_tensors_min_fraction`` of the capacity, the request above the free memory, no other
    process listed, no cap, no request larger than the card."""
    held = b.allocated if b.allocated is not None else b.in_use_self
    if (
        b.reserved is not None
        or held is None
        or not b.capacity
        or b.free is None
        or b.request is None
        or b.others
        or b.capped
        or b.oversized
    ):
        return False
    return b.request > b.free and held >= thresholds.own_tensors_min_fraction * b.capacity


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
        "other_process_self_match_bytes",
        "other_process_unlisted_fraction",
        "other_process_unlisted_min_bytes",
        "others_dominate_fraction",
        "own_tensors_min_fraction",
    ),
    precedence=40,
)


class ActivationMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s, thresholds)
        event = allocator_oom(facts)
        if event is None:
            return
        n = event.message
        b = message_balance(n, thresholds)
        evidence = [e for e in (phase_evidence(facts, event),) if e is not None]
        holder = "live tensors"
        if phase(facts, event) in (Phase.FORWARD, Phase.BACKWARD):
            confidence = 0.35
            if n.kind is OomKind.DRIVER:
                # The driver, not the caching allocator, failed: memory outside the
                # allocator ran out (a context, a library's workspace), not tensors.
                confidence = 0.3
            if near_full(n, thresholds) and little_stuck(n, thresholds):
                # Full of live tensors in a training pass: decisive when it never fit (the
                # first steps); later, longer inputs or a leak could have filled it.
                confidence = 0.6 if failed_before_training(facts, event) else 0.5
                evidence.insert(0, capacity_evidence(event, n))
            else:
                evidence.insert(0, oom_evidence(event))
        elif phase(facts, event) is Phase.UNKNOWN and demand_exceeds_card(b, thresholds):
            # No frame places the failure: the message alone says this process' own live
            # tensors filled the card, and between the usual suspects (the batch's
            # activations, the model's states) the batch is the more common; a guess, so low.
            confidence = _LONE_MESSAGE_CONFIDENCE
            evidence.insert(0, capacity_evidence(event, n))
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"live tensors {size(b.allocated)} = {b.live_share or 0:.0%} of what this "
                    f"process could reach; the {size(b.request)} request "
                    + (
                        f"exceeded the free memory and the allocator's cache by {size(b.shortfall)}"
                        if (b.shortfall or 0) > 0
                        else "found no usable cached block"
                    ),
                    event.source,
                    "no traceback says which pass: activations are the usual cause, the "
                    "model's states the other candidate",
                )
            )
        elif phase(facts, event) is Phase.UNKNOWN and _own_demand_in_a_cut_message(b, thresholds):
            holder = "memory"
            # The message is cut before its allocator figures: what this process held (live
            # tensors, or all it had) filled the card, so its own demand did; how much of it
            # was cached blocks (fragmentation's question) is lost with the rest.
            confidence = _CUT_MESSAGE_CONFIDENCE
            held = b.allocated if b.allocated is not None else b.in_use_self
            evidence.insert(0, oom_evidence(event))
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"this process held {size(held)} of the {size(b.capacity)} card "
                    f"({(held or 0) / (b.capacity or 1):.0%}) and {size(b.free)} was free for "
                    f"the {size(b.request)} request",
                    event.source,
                    "its own demand filled the card; the message is cut before saying how much "
                    "of it was live tensors: the batch's activations are the usual cause",
                )
            )
        elif phase(facts, event) is Phase.UNKNOWN and request_fills_card(b, thresholds):
            confidence = _LARGE_REQUEST_CONFIDENCE
            evidence.insert(0, oom_evidence(event))
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"live tensors {size(b.allocated)} plus the {size(b.request)} request "
                    f"({b.request_share or 0:.0%} of the card) exceed the "
                    f"{size((b.reserved or 0) + (b.free or 0))} this process could reach; "
                    f"little was cached ({size(b.unallocated)}) and nothing else held the card",
                    event.source,
                    "this process' own demand filled the card; one large tensor (a batch's "
                    "activations at most often, else accumulated outputs or a shape) made it",
                )
            )
        else:
            return
        if b.oversized:
            confidence = min(confidence, 0.2)
            evidence.append(oversized_evidence(event))
        if b.capped:
            listed = (
                f"; the other process(es) listed ({size(b.others_total)}) took nothing it "
                "could have had"
                if b.others
                else ""
            )
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"{size(b.limit)} allowed for this process and {size(b.free)} still free on "
                    f"the device{listed}",
                    event.source,
                    "the per-process cap, not the card, was the limit",
                )
            )
        gather = zero3_gather_frame(event)
        if gather is not None:
            confidence -= 0.25
            # cites the gather's own frame, not the OOM line: the traceback shows the gather
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    "the failing allocation is a ZeRO-3 parameter gather: the traceback passes "
                    f"through {gather.function} ({gather.filename}:{gather.line})",
                    frame_site(event, gather),
                    "gathered parameters, not activations, were being allocated",
                    supports=False,
                )
            )
        if others_dominate(n, thresholds):
            confidence -= 0.3
        against = states_account_evidence(facts, supports=False)
        if against is not None:
            confidence -= 0.3
            evidence.append(against)
        figures = oom_figures(n)
        saving: int | None = None
        located = facts.snapshot_for(event)
        confirmed = False
        if located is not None:
            snapshot, device = located
            share = category_share(device, [MemoryCategory.ACTIVATIONS])
            activations = live_bytes(device, [MemoryCategory.ACTIVATIONS])
            figures["activation_bytes"] = in_bytes(activations)
            if share >= thresholds.activations_min_fraction:
                confirmed = True
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
        if gather is not None and not confirmed:
            # The failing allocation itself was gathered parameters: the traceback contradicts
            # what this cause claims was being allocated, and the message's figures (which any
            # cause that fills the card shares) cannot outweigh that; only a snapshot that
            # shows activations filling the card can.
            return
        if confidence < _MIN_CONFIDENCE:
            return
        fixes = list(_activation_fixes(facts, saving))
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"the {phase(facts, event).value} pass filled the GPU with live tensors: "
                f"{fullness(n)}"
                if phase(facts, event) is not Phase.UNKNOWN
                else f"this process' own {holder} filled the GPU: {fullness(n)}; most "
                "often the batch's activations (no traceback says which pass)"
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
