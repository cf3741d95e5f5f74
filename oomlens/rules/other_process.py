"""Another process holds GPU memory: the OOM message lists every process NVML sees on the card."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_fraction, in_bytes
from oomlens.facts.run import RunFacts
from oomlens.rules._common import (
    allocator_oom,
    oom_evidence,
    oom_figures,
    size,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="other_process",
    title="Another process holds GPU memory",
    severity=Severity.HIGH,
    explanation=(
        "The OOM message lists every other process NVML sees on the same GPU with the memory "
        "it holds. Memory held by another process (a leftover job, a notebook, a DataLoader "
        "worker that touched CUDA, another rank placed on the same GPU) is simply not there "
        "for this one. Inside containers NVML may show this very process under its host pid; "
        "oomlens ignores a single listed process whose size matches this process' own."
    ),
    verify=(
        "nvidia-smi on the node before the next launch lists no compute process on the job's "
        "GPUs, and the OOM message no longer has a 'Process N has ... memory in use' clause for "
        "a foreign pid."
    ),
    thresholds=(
        "other_process_min_fraction",
        "other_process_self_match_bytes",
        "others_dominate_fraction",
    ),
    precedence=20,
)


class OtherProcessRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            if s.device_exhausted:
                yield SPEC.diagnose(
                    confidence=0.45,
                    summary=(
                        f"the device had only {size(s.device_free)} free while this process "
                        f"reserved {size(s.reserved)}: unless the card is that small, other "
                        "processes or memory outside PyTorch held the rest"
                    ),
                    evidence=(snapshot_oom_evidence(s, "the device itself was full"),),
                    missing=(
                        "the OOM message from the log (it lists every process on the GPU), "
                        "or nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
                    ),
                    rank=s.snapshot.source.rank,
                    figures={
                        "device_free": in_bytes(s.device_free),
                        "reserved": in_bytes(s.reserved),
                    },
                )
        event = allocator_oom(facts)
        if event is None:
            return
        n = event.message
        others = event.message.other_processes
        if not others or not n.total_capacity:
            return  # a capacity of 0 is no card torch reports on
        if n.process_in_use is None and len(others) == 1 and n.reserved is not None:
            # Containers: NVML reports this process under its host pid.
            if abs(others[0].bytes - n.reserved) <= thresholds.other_process_self_match_bytes:
                return
        held = n.other_processes_total or 0
        share = held / n.total_capacity
        if share < thresholds.other_process_min_fraction:
            return
        confidence = 0.6
        if share >= thresholds.others_dominate_fraction or (
            n.process_in_use is not None and held > n.process_in_use
        ):
            confidence = 0.85
        if n.free is not None and n.tried_to_allocate is not None and n.free < n.tried_to_allocate:
            confidence += 0.05
        listing = ", ".join(f"pid {p.pid}: {size(p.bytes)}" for p in others[:5])
        evidence = [
            oom_evidence(
                event,
                f"other processes hold {size(held)} ({share:.0%} of the "
                f"{size(n.total_capacity)} card); "
                f"this process holds {size(n.process_in_use)}",
            ),
            Evidence(
                EvidenceKind.DERIVED,
                f"other processes on device {event.message.device}: {listing}",
                event.source,
            ),
        ]
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"{len(others)} other process(es) held {size(held)} of the GPU's "
                f"{size(n.total_capacity)}; only {size(n.free)} was free for a "
                f"{size(n.tried_to_allocate)} request"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Find and stop the other process, or run where the GPU is yours alone.",
                    command=(
                        "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                        "--format=csv  # on the node; SLURM: --exclusive or --gres=gpu:N"
                    ),
                    predicted_saving_bytes=held,
                    cost="none",
                ),
                Fix(
                    "If the other process is your own DataLoader worker or a second rank on the "
                    "same GPU, make sure workers never touch CUDA and each rank calls "
                    "torch.cuda.set_device(local_rank) before any CUDA work.",
                    cost="code change",
                ),
            ),
            rank=event.rank,
            figures={**oom_figures(n), "other_processes_share": a_fraction(round(share, 3))},
        )


RULE = OtherProcessRule()
