"""DeepSpeed ZeRO-3 rules that need the config: prefetch overshoot, pinned host memory,
and the 16-bit checkpoint gather.

Each reads the effective config (from the ds_config file, or DeepSpeed's own startup dump in
the log, which says what the engine really ran with) and only proposes changes to values that
are not already in force.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts import SourceRef
from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.log import OomKind, Phase
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.rules._common import (
    CAPTURE_CONFIG,
    CAPTURE_KERNEL,
    SnapshotOom,
    allocator_oom,
    category_share,
    config_evidence,
    effective_config,
    kernel_kill_evidence,
    live_bytes,
    oom_evidence,
    phase_evidence,
    quote,
    size,
    snapshot_evidence,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.base import clamp
from oomlens.rules.thresholds import Thresholds
from oomlens.rules.workload import _in_zero3_gather

#: DeepSpeed 0.19.8's defaults (deepspeed/runtime/zero/config.py), in elements.
WORKING_SET_DEFAULTS = {
    "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 1_000_000_000,
    "max_reuse_distance": 1_000_000_000,
}
GIB = 1024**3


def _leaf_key(value: ConfigValue[Any]) -> str:
    return value.key_path.rsplit(".", 1)[-1]


def _restore_defaults(raised: list[tuple[ConfigValue[int], int]], saving: int | None = None) -> Fix:
    """Put the raised working-set knobs back to DeepSpeed's defaults (the config's spelling)."""
    return Fix(
        "Restore DeepSpeed's defaults for the raised working-set settings.",
        config_patch={"zero_optimization": {_leaf_key(v): default for v, default in raised}},
        predicted_saving_bytes=saving,
        cost="less overlap of gathers with compute: a few percent slower steps",
    )


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


class PrefetchOvershootRule:
    id: ClassVar[str] = "prefetch_overshoot"
    title: ClassVar[str] = "ZeRO-3 gathers too many parameters at once"
    explanation: ClassVar[str] = (
        "ZeRO-3 keeps each GPU's share of the parameters and all-gathers a module's full "
        "parameters just before it runs. stage3_prefetch_bucket_size bounds how many elements "
        "are fetched ahead, stage3_max_live_parameters how many may be gathered at once, and "
        "stage3_max_reuse_distance keeps gathered parameters that will be used again soon. "
        "Raised far above their defaults they let a whole model's parameters be gathered at "
        "once, in 16 bits, on every GPU: the memory ZeRO-3 was supposed to save."
    )

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
        ) and not _in_zero3_gather(event):
            return
        evidence: list[Evidence] = [
            config_evidence(value, f"{value.value / default:,.0f}x DeepSpeed's default {default:,}")
            for value, default in raised
        ]
        confidence = 0.5
        if _in_zero3_gather(event):
            confidence += 0.2
            evidence.insert(
                0, oom_evidence(event, "the failing allocation is a ZeRO-3 parameter all-gather")
            )
        else:
            evidence.insert(0, oom_evidence(event))
        phase = phase_evidence(event)
        if phase is not None:
            evidence.append(phase)
        element = effective.precision.param_bytes
        figures: dict[str, int | float | str | None] = {_leaf_key(v): v.value for v, _ in raised}
        saving: int | None = None
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            gathered = live_bytes(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
            share = category_share(device, [MemoryCategory.ZERO3_GATHERED_PARAMS])
            figures["gathered_param_bytes"] = gathered
            if share >= 0.25:
                confidence += 0.15
                saving = max(0, gathered - WORKING_SET_DEFAULTS["prefetch_bucket_size"] * element)
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"device {device.device}: gathered ZeRO-3 parameters hold {size(gathered)} "
                        f"({share:.0%} of live memory)",
                        "the gathered working set, not activations or states, fills the card",
                    )
                )
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                "ZeRO-3's working-set settings ("
                + ", ".join(f"{_leaf_key(v)}={v.value:,.0f}" for v, _ in raised)
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
        if oom is None or oom.category is not MemoryCategory.ZERO3_GATHERED_PARAMS or share < 0.25:
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
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=0.75 if raised else 0.5,
            summary=f"ZeRO-3 held {size(gathered)} of gathered parameters when a gather failed",
            evidence=tuple(evidence),
            fixes=fixes,
            missing=() if effective is not None else (CAPTURE_CONFIG,),
            rank=s.snapshot.source.rank,
            figures={"gathered_param_bytes": gathered},
        )


def _pinned_blocks(effective: EffectiveDsConfig) -> list[ConfigValue[bool]]:
    zero = effective.zero
    pinned = []
    if zero.offload_param.enabled and zero.offload_param.pin_memory.value:
        pinned.append(zero.offload_param.pin_memory)
    if zero.offload_optimizer.enabled and zero.offload_optimizer.pin_memory.value:
        pinned.append(zero.offload_optimizer.pin_memory)
    return pinned


def _host_kill_evidence(facts: RunFacts) -> tuple[list[Evidence], float, int | None]:
    """Evidence that host memory ran out, a confidence for it, and the pinned bytes the kernel
    saw (shmem-rss) per killed process."""
    evidence: list[Evidence] = []
    confidence = 0.0
    shmem: int | None = None
    kills = facts.kernel_oom_kills()
    for kill in kills[:2]:
        evidence.append(
            kernel_kill_evidence(kill, "page-locked (pinned) host buffers are counted as shmem-rss")
        )
        if kill.shmem_rss:
            shmem = max(shmem or 0, kill.shmem_rss)
    if kills:
        confidence = 0.75
    killed_at = facts.sigkilled_at()
    if killed_at is not None:
        evidence.append(
            Evidence(
                EvidenceKind.LOG,
                f"a rank was killed with SIGKILL ({killed_at})",
                None,
                "what the OOM killer does; no Python traceback is left",
            )
        )
        confidence = max(confidence, 0.5)
    return evidence, confidence, shmem


class PinnedMemoryRule:
    id: ClassVar[str] = "pinned_memory_exhaustion"
    title: ClassVar[str] = "Pinned host memory exhausted by ZeRO offload"
    explanation: ClassVar[str] = (
        "ZeRO offload keeps parameters and/or optimizer state in host memory and, with "
        "pin_memory (the default since DeepSpeed 0.19.5), page-locks the buffers it copies "
        "through. Pinned pages cannot be swapped or reclaimed, torch's pinned allocator rounds "
        "each buffer up to a power of two and caches freed blocks, and every rank on the node "
        "pins its own: the node runs out of RAM and the kernel kills a rank (SIGKILL, exit "
        "-9), or cudaHostAlloc fails with 'CUDA error: out of memory'."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        effective = effective_config(facts)
        if effective is None:
            return
        pinned = _pinned_blocks(effective)
        if not pinned:
            return
        evidence, confidence, shmem = _host_kill_evidence(facts)
        driver = [e for e in facts.gpu_oom_events() if e.message.kind is OomKind.DRIVER]
        if driver and any(
            "pin" in (f.function or "") for e in driver if e.traceback for f in e.traceback.frames
        ):
            evidence.append(oom_evidence(driver[0], "cudaHostAlloc failed while pinning"))
            confidence = max(confidence, 0.8)
        if not confidence:
            return
        if facts.gpu_oom_events() and not driver:
            return  # a GPU OOM is what killed it
        evidence.extend(config_evidence(v, "offloaded buffers are page-locked") for v in pinned)
        confidence += 0.1
        if shmem is not None and shmem >= GIB:
            confidence += 0.05
        ranks = facts.world_size.value if facts.world_size else None
        patch: dict[str, object] = {}
        for value in pinned:
            block = value.key_path.split(".")[-2]
            patch[block] = {"pin_memory": False}
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.CRITICAL,
            confidence=clamp(confidence),
            summary=(
                "host memory ran out while ZeRO offload kept its buffers pinned"
                + (f" ({size(shmem)} pinned per killed rank)" if shmem else "")
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Stop page-locking the offload buffers: pageable memory can be reclaimed "
                    "and is not rounded up to powers of two.",
                    config_patch={"zero_optimization": patch},
                    predicted_saving_bytes=(shmem * ranks if shmem and ranks else shmem),
                    cost="slower host-device copies (typically 10-30% slower offload steps)",
                ),
                Fix(
                    "Give the job more host memory or fewer ranks per node (each rank pins its "
                    "own buffers), or raise the memlock limit if pinning itself fails.",
                    command="sbatch --mem=... / --ntasks-per-node=...; ulimit -l unlimited",
                    cost="hardware or throughput",
                ),
            ),
            missing=() if facts.kernel_oom_kills() else (CAPTURE_KERNEL,),
            figures={"pinned_per_killed_rank": shmem, "ranks": ranks},
        )


_SAVE_MARKER = re.compile(
    r"(?i)save_16bit_model|save_checkpoint|is about to be saved|saving (?:the )?(?:16-bit )?"
    r"(?:model|checkpoint|weights|state)|_zero3_consolidated_16bit_state_dict|Saving model weights"
)


class CheckpointSaveRule:
    id: ClassVar[str] = "checkpoint_save_gather"
    title: ClassVar[str] = "Out of memory while saving a checkpoint"
    explanation: ClassVar[str] = (
        "With stage3_gather_16bit_weights_on_model_save, save_16bit_model() (and HF Trainer's "
        "save under ZeRO-3) gathers every partitioned parameter, module by module, and rank 0 "
        "copies the full 16-bit state dict into host memory before writing it: 2 bytes per "
        "parameter on one process, on top of what training already uses. Large models kill "
        "rank 0 at save time, after hours of training."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        evidence: list[Evidence] = []
        confidence = 0.0
        save_events = [e for e in facts.oom_events() if e.phase is Phase.CHECKPOINT_SAVE]
        if save_events:
            event = save_events[0]
            evidence.append(oom_evidence(event, "the failure is inside a checkpoint save"))
            phase = phase_evidence(event)
            if phase is not None:
                evidence.append(phase)
            confidence = 0.75
        else:
            marker = self._save_marker_in_tail(facts)
            if marker is None:
                return
            kill_evidence, kill_confidence, _ = _host_kill_evidence(facts)
            if not kill_confidence or facts.gpu_oom_events():
                return
            evidence.append(marker)
            evidence.extend(kill_evidence)
            confidence = 0.45 + kill_confidence * 0.3
        effective = effective_config(facts)
        fixes = []
        gather = effective.zero.gather_16bit_weights_on_model_save if effective else None
        if gather is not None:
            evidence.append(
                config_evidence(
                    gather, "rank 0 gathers the full 16-bit model" if gather.value else ""
                )
            )
            if gather.value:
                confidence += 0.1
                fixes.append(
                    Fix(
                        "Save the partitioned checkpoint instead and consolidate it offline, where "
                        "memory is plentiful.",
                        config_patch={"zero_optimization": {_leaf_key(gather): False}},
                        command=(
                            "engine.save_checkpoint(dir); then python zero_to_fp32.py dir out.bin"
                        ),
                        cost="a conversion step after training",
                    )
                )
        fixes.append(
            Fix(
                "Give rank 0's node enough host memory for 2 bytes per parameter on top "
                "of training, or save less often.",
                cost="hardware",
            )
        )
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary="the run died while gathering the model for a checkpoint save",
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if (facts.kernel_oom_kills() or save_events) else (CAPTURE_KERNEL,),
        )

    @staticmethod
    def _save_marker_in_tail(facts: RunFacts) -> Evidence | None:
        for log in facts.logs:
            for number, text in reversed(log.tail):
                if _SAVE_MARKER.search(text):
                    return Evidence(
                        EvidenceKind.LOG,
                        quote(text),
                        SourceRef(log.path, number, log.layout_rank),
                        "the last thing the run did was saving a checkpoint",
                    )
        return None
