"""Page-locked (pinned) host memory ran out: ZeRO offload buffers, DataLoader pinning, WSL2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_count, in_bytes
from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import PinnedFailure
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_KERNEL
from oomlens.rules.common.evidence import config_evidence, oom_evidence, quote, size
from oomlens.rules.common.host import (
    host_kill_evidence,
    host_kill_seen,
    host_overflow_evidence,
)
from oomlens.rules.common.model_states import effective_config
from oomlens.rules.thresholds import Thresholds

GIB = 1024**3


def _pinned_blocks(effective: EffectiveDsConfig) -> list[ConfigValue[bool]]:
    zero = effective.zero
    pinned = []
    if zero.offload_param.enabled and zero.offload_param.pin_memory.value:
        pinned.append(zero.offload_param.pin_memory)
    if zero.offload_optimizer.enabled and zero.offload_optimizer.pin_memory.value:
        pinned.append(zero.offload_optimizer.pin_memory)
    return pinned


SPEC = RuleSpec(
    id="pinned_memory_exhaustion",
    title="Pinned host memory exhausted",
    severity=Severity.CRITICAL,
    explanation=(
        "ZeRO offload keeps parameters and/or optimizer state in host memory and, with "
        "pin_memory (the default since DeepSpeed 0.19.5), page-locks the buffers it copies "
        "through. Pinned pages cannot be swapped or reclaimed, torch's pinned allocator rounds "
        "each buffer up to a power of two and caches freed blocks, and every rank on the node "
        "pins its own: the node runs out of RAM and the kernel kills a rank (SIGKILL, exit "
        "-9), or cudaHostAlloc fails with 'CUDA error: out of memory'. DataLoader's "
        "pin_memory=True pins every batch the same way (its pin-memory thread reports the "
        "failure), and WSL2 limits pinned memory far below the machine's RAM."
    ),
    verify=(
        "the job's cgroup memory.events shows no new oom_kill, and the node's kernel log no "
        "'Killed process' line for the ranks; the offload steps get somewhat slower."
    ),
    precedence=90,
)


class PinnedMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        effective = effective_config(facts)
        pinned = _pinned_blocks(effective) if effective is not None else []
        if not pinned:
            failure = facts.signals.pinned
            if failure is not None:
                yield self._failed_pinning(failure)
            return
        evidence, confidence, shmem = host_kill_evidence(facts)
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
        overflow = host_overflow_evidence(facts)
        if overflow is not None:
            evidence.append(overflow[0])
            # an account, not an observation: it firms up a kill, it does not make it certain
            confidence = max(confidence, min(0.95, confidence + 0.1))
        ranks = facts.world_size.value if facts.world_size else None
        patch: dict[str, object] = {}
        for value in pinned:
            block = value.key_path.split(".")[-2]
            patch[block] = {"pin_memory": False}
        yield SPEC.diagnose(
            confidence=confidence,
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
            missing=() if host_kill_seen(facts) else (CAPTURE_KERNEL,),
            figures={"pinned_per_killed_rank": in_bytes(shmem), "ranks": a_count(ranks)},
        )

    @staticmethod
    def _failed_pinning(failure: PinnedFailure) -> Diagnosis:
        """A pinned allocation failed (DataLoader's pin-memory thread, cudaHostAlloc), with no
        ZeRO offload config to blame: the page-locked host memory ran out."""
        return SPEC.diagnose(
            confidence=0.5 if failure.wsl_only else 0.6 if failure.oom else 0.55,
            summary=(
                "page-locked (pinned) host memory ran out: a pinned allocation failed"
                + (" with an out-of-memory error" if failure.oom else " in the pin-memory thread")
            ),
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    quote(failure.text),
                    failure.source,
                    "pinning host memory failed (cudaHostAlloc): a host-side limit, not the "
                    "card's memory; WSL2 and containers cap it well below the RAM",
                ),
            ),
            fixes=(
                Fix(
                    "Stop pinning: DataLoader(pin_memory=False), and pin_memory: false in ZeRO "
                    "offload blocks; under WSL2 this is the usual fix.",
                    command="DataLoader(..., pin_memory=False)",
                    cost="slower host-to-device copies",
                ),
                Fix(
                    "Give the job more lockable host memory (ulimit -l unlimited; WSL2: "
                    "memory= in .wslconfig) or fewer DataLoader workers and prefetched batches.",
                    cost="configuration",
                ),
            ),
            missing=("the error the pin-memory thread caught (it follows in the traceback)",)
            if not failure.oom
            else (),
        )


RULE = PinnedMemoryRule()
