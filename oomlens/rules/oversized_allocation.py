"""A single request larger than the card can ever serve: a shape, index or dtype bug."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.analysis.oom_arithmetic import balance
from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_fraction
from oomlens.facts.run import RunFacts
from oomlens.rules._common import (
    allocator_oom,
    oom_evidence,
    oom_figures,
    phase_evidence,
    size,
)
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="oversized_allocation",
    title="One request larger than the card",
    severity=Severity.HIGH,
    explanation=(
        "The allocator asked for more memory in one piece than the whole card has (or nearly "
        "all of it with the card otherwise empty). No batch size, allocator setting or "
        "offload makes room for that: a tensor's shape is far larger than intended. The usual "
        "causes are broadcasting two tensors into an (N, N) result, a sequence length or "
        "vocabulary size read from the wrong place (an attention mask of seq x seq for a huge "
        "seq), an index or a count used as a size, or float64 where float16 was meant."
    ),
    reading=(
        "Compare 'Tried to allocate' with the card's total capacity: a request above it can "
        "never succeed, whatever else the message says."
    ),
    verify=(
        "printing the shapes and dtypes at the failing line shows the intended sizes, and the "
        "request in a repeat of the failure (if any) is a small fraction of the card."
    ),
    thresholds=("oversized_near_card_fraction",),
    precedence=15,
)


class OversizedAllocationRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None:
            return
        n = event.message
        b = balance(n, 0)  # the request against the card: no process to attribute
        share = b.request_share
        if n.message_format == "exabyte":
            confidence = 0.9
            note = "a request of more than 1 EB: no device has that much memory"
        elif b.oversized:
            confidence = 0.85
            note = (
                f"{size(b.request)} requested from a card of {size(b.capacity)}: "
                f"{share or 0:.1f}x the whole card"
            )
        elif (
            share is not None
            and b.allocated is not None
            and b.capacity
            and share >= thresholds.oversized_near_card_fraction
            and b.allocated < (1 - thresholds.oversized_near_card_fraction) * b.capacity
        ):
            confidence = 0.45
            note = (
                f"{size(b.request)} requested in one piece, {share:.0%} of the "
                f"{size(b.capacity)} card, with only {size(b.allocated)} allocated: one tensor "
                "nearly as large as the card"
            )
        else:
            return
        evidence = [oom_evidence(event, note)]
        placed = phase_evidence(event)
        if placed is not None:
            evidence.append(placed)
        evidence.append(
            Evidence(
                EvidenceKind.DERIVED,
                "no memory setting serves a request this size",
                event.source,
                "batch size, allocator settings, offload and more GPUs do not change one "
                "tensor's size",
            )
        )
        where = event.traceback.frames[-1] if event.traceback and event.traceback.frames else None
        site = f" ({where.filename}:{where.line} in {where.function})" if where else ""
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"one request of {size(b.request)} on a {size(b.capacity)} card{site}: a "
                "tensor far larger than intended (shape, broadcast, index or dtype)"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Print the shapes and dtypes of the operands at the failing line and find "
                    "the dimension that is far larger than intended (an unintended broadcast "
                    "to (N, N), a length or vocabulary size read from the wrong field, float64 "
                    "instead of float16).",
                    command="CUDA_LAUNCH_BLOCKING=1 python ...  # the traceback then points at "
                    "the exact operation",
                    cost="debugging",
                ),
            ),
            missing=(
                ()
                if event.traceback is not None
                else ("the full traceback of the error: the failing line names the tensor",)
            ),
            rank=event.rank,
            figures={
                **oom_figures(n),
                "request_share_of_card": a_fraction(None if share is None else round(share, 3)),
            },
        )


RULE = OversizedAllocationRule()
