"""Another process holds GPU memory: the OOM message lists every process NVML sees on the card."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_fraction, in_bytes
from oomlens.facts.log import OomEvent, OomKind, Phase
from oomlens.facts.oom_balance import MessageBalance
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import (
    oom_evidence,
    oom_figures,
    phase_evidence,
    self_listed_evidence,
    size,
)
from oomlens.rules.common.message import allocator_oom, message_balance
from oomlens.rules.common.model_states import snapshot_oom_evidence, snapshot_ooms
from oomlens.rules.common.timeline import any_steps, phase, steps_completed_before
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
        "a listed process that holds what this process' allocator reserved (plus a context's "
        "worth) and no 'this process has' clause is this job itself, not another process. "
        "Messages that list no process (torch before 2.2) still balance: capacity minus what "
        "PyTorch reserved minus what was free is held outside this process' allocator."
    ),
    verify=(
        "nvidia-smi on the node before the next launch lists no compute process on the job's "
        "GPUs, and the OOM message no longer has a 'Process N has ... memory in use' clause for "
        "a foreign pid."
    ),
    thresholds=(
        "other_process_min_fraction",
        "other_process_self_match_bytes",
        "other_process_unlisted_fraction",
        "other_process_unlisted_min_bytes",
        "others_dominate_fraction",
        "small_model_max_bytes",
    ),
    precedence=20,
)


class OtherProcessRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            # a request larger than the card took nothing others held (oversized_allocation)
            if s.device_exhausted and not s.larger_than_card(facts.gpu_memory):
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
        if n.kind is OomKind.DRIVER:
            yield from self._driver(facts, event, thresholds)
            return
        b = message_balance(n, thresholds)
        if not b.capacity or b.capped or b.oversized:  # a capacity of 0 is no card
            # Under a cap with room left on the device, or for a request larger than the card,
            # what other processes hold took nothing this process could have had.
            return
        if b.others:
            yield from self._listed(event, b, thresholds)
        else:
            # The capture asked NVML itself at the OOM: what it saw outweighs the arithmetic.
            captured = list(self._from_capture(facts, event, thresholds))
            if captured:
                yield from captured
            else:
                yield from self._unlisted(event, b, thresholds)

    def _driver(
        self, facts: RunFacts, event: OomEvent, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        """``CUDA error: out of memory`` from the runtime, before the job computed anything:
        the caching allocator did not run out (it raises its own message), an allocation
        outside it did (a context, a library's handle, a kernel's module): the card was full
        before this job's tensors could fill it."""
        n = event.message
        if n.message_format != "driver" or event.traceback is None:
            return  # THC's message is the old allocator's; a lone line places nothing
        if event.traceback.headless:
            # The text starts inside the traceback: what ran before it is not shown, so the
            # absence of step lines says nothing about whether the job had computed.
            return
        if phase(facts, event) not in (
            Phase.MODEL_INIT,
            Phase.FORWARD,
            Phase.BACKWARD,
            Phase.UNKNOWN,
        ):
            return  # data loading: pinned host memory, another story
        if steps_completed_before(facts, event) or (
            steps_completed_before(facts, event) is None and any_steps(facts)
        ):
            return  # the job had been computing: its own memory may have filled the card
        confidence = 0.45
        evidence = [
            oom_evidence(
                event,
                "the CUDA runtime, not PyTorch's caching allocator, ran out: an allocation "
                "outside the allocator failed",
            )
        ]
        placed = phase_evidence(facts, event)
        if placed is not None:
            evidence.append(placed)
        evidence.append(
            Evidence(
                EvidenceKind.DERIVED,
                "no training step had completed",
                event.source,
                "the job's first computations failed: the card was already full",
            )
        )
        params = facts.params
        if params is not None and params.total * 4 < thresholds.small_model_max_bytes:
            confidence += 0.15
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"the model has {params.total:,} parameters: {size(params.total * 4)} in fp32",
                    params.source,
                    "far less than any card holds: the model did not fill it",
                )
            )
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                "the CUDA runtime ran out of device memory at the job's first computations: "
                "something else most likely held the card"
            ),
            evidence=tuple(evidence),
            fixes=self._fixes(None),
            missing=(
                "what else used the GPU at the time: nvidia-smi --query-compute-apps="
                "pid,process_name,used_memory --format=csv",
            ),
            rank=event.rank,
        )

    @staticmethod
    def _fixes(held: int | None) -> tuple[Fix, ...]:
        return (
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
        )

    def _listed(
        self, event: OomEvent, b: MessageBalance, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        n = event.message
        capacity = b.capacity or 0
        held = b.others_total
        share = held / capacity
        if share < thresholds.other_process_min_fraction:
            return
        confidence = 0.6
        if share >= thresholds.others_dominate_fraction or (
            b.in_use_self is not None and held > b.in_use_self
        ):
            confidence = 0.85
        evidence = [
            oom_evidence(
                event,
                f"other processes hold {size(held)} ({share:.0%} of the "
                f"{size(capacity)} card); this process holds {size(b.in_use_self)}",
            ),
            Evidence(
                EvidenceKind.DERIVED,
                "other processes on device "
                f"{n.device}: " + ", ".join(f"pid {p.pid}: {size(p.bytes)}" for p in b.others[:5]),
                event.source,
            ),
        ]
        itself = self_listed_evidence(event, b)
        if itself is not None:
            evidence.append(itself)
        if b.free is not None and b.request is not None:
            if b.free < b.request:
                confidence += 0.05
            if b.free + held < b.request:
                confidence -= 0.3
                evidence.append(
                    Evidence(
                        EvidenceKind.DERIVED,
                        f"free {size(b.free)} + held by others {size(held)} < requested "
                        f"{size(b.request)}",
                        event.source,
                        "the request would not have fit even without the other processes",
                        supports=False,
                    )
                )
        yield self._diagnosis(event, b, held, share, confidence, evidence, ())

    def _unlisted(
        self, event: OomEvent, b: MessageBalance, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        """The message lists no other process (torch < 2.2, or NVML cannot see them from a
        container): the memory its numbers leave unaccounted for is the evidence."""
        held = b.outside_unlisted
        if held is None or b.capacity is None or b.free is None or b.request is None:
            return
        share = held / b.capacity
        if (
            share < thresholds.other_process_unlisted_fraction
            or held < thresholds.other_process_unlisted_min_bytes
            or b.free + held < b.request
        ):
            return
        confidence = 0.55 if share >= thresholds.others_dominate_fraction else 0.45
        whose = (
            f"this process holds {size(b.in_use_self)} in all"
            if b.in_use_self is not None
            else f"this process' allocator reserved {size(b.reserved)}"
        )
        evidence = [
            oom_evidence(event, f"{whose}; {size(b.free)} free of {size(b.capacity)}"),
            Evidence(
                EvidenceKind.DERIVED,
                f"capacity {size(b.capacity)} - "
                + (
                    f"this process {size(b.in_use_self)}"
                    if b.in_use_self is not None
                    else f"reserved by PyTorch {size(b.reserved)}"
                )
                + f" - free {size(b.free)} = {size(held)} ({share:.0%} of the card) held "
                "outside this process' allocator",
                event.source,
                "a CUDA context takes well under 1 GiB: the rest is most likely another process "
                "(a leftover job, a notebook, another user), less often this process' own "
                "non-PyTorch libraries",
            ),
        ]
        yield self._diagnosis(
            event,
            b,
            held,
            share,
            confidence,
            evidence,
            (
                "what else used the GPU at the time: nvidia-smi --query-compute-apps="
                "pid,process_name,used_memory --format=csv (torch 2.2+ also lists them in "
                "the OOM message)",
            ),
        )

    @staticmethod
    def _diagnosis(
        event: OomEvent,
        b: MessageBalance,
        held: int,
        share: float,
        confidence: float,
        evidence: list[Evidence],
        missing: tuple[str, ...],
    ) -> Diagnosis:
        n = event.message
        listed = len(b.others)
        who = f"{listed} other process(es)" if listed else "memory outside this process"
        return SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"{who} held {size(held)} of the GPU's {size(b.capacity)}; only "
                f"{size(b.free)} was free for a {size(b.request)} request"
            ),
            evidence=tuple(evidence),
            fixes=OtherProcessRule._fixes(held),
            missing=missing,
            rank=event.rank,
            figures={**oom_figures(n), "other_processes_share": a_fraction(round(share, 3))},
        )

    def _from_capture(
        self, facts: RunFacts, event: OomEvent, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        """The OOM message listed no process (NVML unavailable to torch, or a torch that does
        not print them); the capture asked NVML itself at the OOM."""
        for capture in facts.captures:
            if event.rank is not None and capture.rank not in (None, event.rank):
                continue
            for oom in capture.ooms:
                others = [p for p in oom.other_processes if p.bytes]
                total = oom.nvml_total or oom.total
                if not others or not total:
                    continue
                held = sum(p.bytes or 0 for p in others)
                share = held / total
                if share < thresholds.other_process_min_fraction:
                    continue
                listing = ", ".join(f"pid {p.pid}: {size(p.bytes)}" for p in others[:5])
                yield SPEC.diagnose(
                    confidence=0.85 if share >= thresholds.others_dominate_fraction else 0.6,
                    summary=(
                        f"{len(others)} other process(es) held {size(held)} of the GPU's "
                        f"{size(total)} when this rank ran out"
                    ),
                    evidence=(
                        oom_evidence(event),
                        Evidence(
                            EvidenceKind.CAPTURE,
                            f"NVML at the OOM, device {oom.device}: {listing}",
                            oom.source,
                            f"other processes held {share:.0%} of the card",
                        ),
                    ),
                    fixes=(
                        Fix(
                            "Find and stop the other process, or run where the GPU is yours alone.",
                            command="nvidia-smi --query-compute-apps=pid,process_name,"
                            "used_memory --format=csv",
                            predicted_saving_bytes=held,
                            cost="none",
                        ),
                    ),
                    rank=event.rank,
                    figures={
                        "other_processes": in_bytes(held),
                        "other_processes_share": a_fraction(round(share, 3)),
                    },
                )
                return


RULE = OtherProcessRule()
