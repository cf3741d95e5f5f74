"""Rules about what the memory was used for: activations, evaluation/generation, model states.

These are true capacity problems: the tensors themselves did not fit.  The traceback's phase
says when it happened (a forward pass, the first optimizer step, a generate() call), the OOM
message says the card was full of live tensors rather than of cached free blocks, and a
snapshot's categories say which kind of tensor filled it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.log import OomEvent, Phase
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules._common import (
    CAPTURE_SNAPSHOT,
    MODEL_STATE_CATEGORIES,
    MODEL_STATE_COMPONENTS,
    OomNumbers,
    SnapshotOom,
    allocator_oom,
    category_share,
    config_evidence,
    effective_config,
    first_step_optimizer_oom,
    live_bytes,
    model_overflow,
    model_patch_fixes,
    oom_evidence,
    oom_numbers,
    optimizer_state_init,
    phase_evidence,
    size,
    snapshot_evidence,
    snapshot_oom_evidence,
    snapshot_ooms,
    steps_completed_before,
)
from oomlens.rules.base import clamp
from oomlens.rules.thresholds import Thresholds

_GATHER_FRAMES = frozenset(
    {
        "fetch_sub_module",
        "_all_gather",
        "all_gather_coalesced",
        "_all_gather_params",
        "__all_gather_params",
        "_fetch_sub_module_impl",
    }
)


def _near_full(n: OomNumbers, thresholds: Thresholds) -> bool:
    if n.limit is None or n.allocated is None:
        return False
    request = n.request or 0
    return n.allocated + request >= thresholds.capacity_near_full_fraction * n.limit


def _little_stuck(n: OomNumbers, thresholds: Thresholds) -> bool:
    if n.reserved_unallocated is None or n.limit is None:
        return True
    return n.reserved_unallocated < max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * n.limit,
    )


def _in_zero3_gather(event: OomEvent) -> bool:
    if event.traceback is None:
        return False
    return any(f.function in _GATHER_FRAMES for f in event.traceback.frames)


def _capacity_evidence(event: OomEvent, n: OomNumbers) -> Evidence:
    return oom_evidence(
        event,
        f"allocated {size(n.allocated)} of {size(n.limit)} {n.limit_name}, only "
        f"{size(n.reserved_unallocated)} cached: the live tensors themselves filled the card",
    )


def _others_dominate(n: OomNumbers) -> bool:
    return n.others is not None and n.total is not None and n.others >= 0.5 * n.total


class ActivationMemoryRule:
    id: ClassVar[str] = "activation_memory"
    title: ClassVar[str] = "Activations exceed the memory left"
    explanation: ClassVar[str] = (
        "During the forward pass every layer keeps its intermediate tensors for the backward "
        "pass. Their size grows with micro-batch size x sequence length x hidden size x "
        "layers (and the logits with the vocabulary), independently of ZeRO, which partitions "
        "only parameters, gradients and optimizer states. When the card is full of live "
        "tensors during a forward or backward pass, the activations are what to shrink."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s)
        event = allocator_oom(facts)
        if event is None or event.phase not in (Phase.FORWARD, Phase.BACKWARD):
            return
        n = oom_numbers(event)
        evidence = [e for e in (phase_evidence(event),) if e is not None]
        confidence = 0.35
        if _near_full(n, thresholds) and _little_stuck(n, thresholds):
            confidence = 0.6
            evidence.insert(0, _capacity_evidence(event, n))
        else:
            evidence.insert(0, oom_evidence(event))
        if _in_zero3_gather(event):
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
        if _others_dominate(n):
            confidence -= 0.3
        figures = n.as_figures()
        saving: int | None = None
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            share = category_share(device, [MemoryCategory.ACTIVATIONS])
            activations = live_bytes(device, [MemoryCategory.ACTIVATIONS])
            figures["activation_bytes"] = activations
            if share >= 0.5:
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
            elif category_share(device, MODEL_STATE_CATEGORIES) >= 0.6:
                confidence -= 0.2
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"model states are {category_share(device, MODEL_STATE_CATEGORIES):.0%} "
                        "of live memory",
                        "parameters, gradients and optimizer state, not activations, fill the card",
                    )
                )
        if confidence < 0.3:
            return
        fixes = list(_activation_fixes(facts, saving))
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                f"the {event.phase.value} pass filled the GPU with live tensors: "
                f"{size(n.allocated)} allocated of {size(n.limit)} {n.limit_name} when "
                f"{size(n.request)} more was needed"
            ),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if located else (CAPTURE_SNAPSHOT,),
            rank=event.rank,
            figures=figures,
        )

    def _from_snapshot(self, s: SnapshotOom) -> Iterator[Diagnosis]:
        oom, device = s.device.oom, s.device
        share = category_share(device, [MemoryCategory.ACTIVATIONS])
        if oom is None or oom.category is not MemoryCategory.ACTIVATIONS or share < 0.5:
            return
        activations = live_bytes(device, [MemoryCategory.ACTIVATIONS])
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
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
            figures={"activation_bytes": activations, "tried_to_allocate": s.request},
        )


def _activation_fixes(facts: RunFacts | None, saving: int | None) -> Iterator[Fix]:
    effective = effective_config(facts) if facts is not None else None
    if effective is not None:
        micro = effective.batch.micro_batch_per_gpu
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


class EvalOrGenerationRule:
    id: ClassVar[str] = "eval_or_generation"
    title: ClassVar[str] = "Evaluation or generation ran out of memory"
    explanation: ClassVar[str] = (
        "Evaluation and generation run next to the training state: parameters, gradients "
        "buffers and optimizer states stay on the GPU while the evaluation batch (often larger "
        "than the training batch) or the generation KV cache (which grows with every token: "
        "2 x layers x hidden x batch x tokens x bytes per value) is added on top."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None or event.phase not in (Phase.EVALUATION, Phase.GENERATION):
            return
        n = oom_numbers(event)
        confidence = 0.75
        evidence = [oom_evidence(event)]
        phase = phase_evidence(event)
        if phase is not None:
            evidence.append(phase)
        done = steps_completed_before(facts, event)
        if done:
            confidence += 0.05
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"{done} training step(s) completed before it",
                    event.source,
                    "training itself fit; the evaluation/generation did not",
                )
            )
        if _near_full(n, thresholds):
            confidence += 0.05
        what = "generation" if event.phase is Phase.GENERATION else "evaluation"
        fixes = [
            Fix(
                f"Use a smaller {what} batch than the training batch allows you to assume.",
                command="--per_device_eval_batch_size N (HF) / your eval loader's batch_size",
                cost="longer evaluation",
            ),
        ]
        if event.phase is Phase.GENERATION:
            fixes.append(
                Fix(
                    "Bound the KV cache: fewer new tokens, fewer prompts per call, or a "
                    "static/offloaded cache.",
                    command="generate(..., max_new_tokens=N) or cache_implementation='offloaded'",
                    cost="shorter outputs or slower generation",
                )
            )
        fixes.append(
            Fix(
                "Run evaluation under torch.inference_mode() and free the training "
                "step's tensors first (optimizer.zero_grad(set_to_none=True)).",
                cost="none",
            )
        )
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                f"{what} ran out of GPU memory ({size(n.allocated)} allocated of "
                f"{size(n.limit)} {n.limit_name}) after training steps had fit"
                if done
                else f"{what} ran out of GPU memory ({size(n.allocated)} allocated of "
                f"{size(n.limit)} {n.limit_name})"
            ),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            rank=event.rank,
            figures=n.as_figures(),
        )


class ModelStatesRule:
    id: ClassVar[str] = "model_states_too_large"
    title: ClassVar[str] = "Model states do not fit"
    explanation: ClassVar[str] = (
        "Mixed-precision Adam keeps about 16-18 bytes per parameter: 16-bit weights and "
        "gradients, fp32 master weights and two fp32 moments (created at the first optimizer "
        "step). ZeRO-3 divides them by the number of GPUs; offloading the optimizer moves the "
        "12-14 bytes of fp32 state to host memory. When the first optimizer step (or the "
        "model's creation) fails, the states themselves do not fit, whatever the batch size."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            yield from self._from_snapshot(s)
        event = allocator_oom(facts)
        if event is None:
            return
        n = oom_numbers(event)
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
            phase = phase_evidence(event)
            if phase is not None:
                evidence.append(phase)
        elif event.phase is Phase.MODEL_INIT:
            confidence = 0.55
            evidence.append(
                oom_evidence(
                    event,
                    "the failure is while the model is created "
                    "or partitioned, before any training step",
                )
            )
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            share = category_share(device, MODEL_STATE_CATEGORIES)
            states = live_bytes(device, MODEL_STATE_CATEGORIES)
            if share >= 0.7:
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
            elif confidence and share < 0.3:
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
        if not confidence:
            return
        if _others_dominate(n):
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
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.CRITICAL,
            confidence=clamp(confidence),
            summary=(
                f"parameters, gradients and optimizer states do not fit: "
                f"{size(n.allocated)} allocated of {size(n.limit)} {n.limit_name} when "
                f"{size(n.request)} more was needed"
            ),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if located else (CAPTURE_SNAPSHOT,),
            rank=event.rank,
            figures=n.as_figures(),
        )

    def _from_snapshot(self, s: SnapshotOom) -> Iterator[Diagnosis]:
        oom, device = s.device.oom, s.device
        if oom is None or oom.category is not MemoryCategory.OPTIMIZER_STATE:
            return
        share = category_share(device, MODEL_STATE_CATEGORIES)
        states = live_bytes(device, MODEL_STATE_CATEGORIES)
        confidence = 0.6 + (0.1 if share >= 0.5 else 0.0)
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
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.CRITICAL,
            confidence=clamp(confidence),
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
            figures={"model_state_bytes": states, "tried_to_allocate": s.request},
        )
