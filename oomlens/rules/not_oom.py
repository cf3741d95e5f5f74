"""When the run failed for something other than memory: the failure that came first, and which
ranks only died because a peer did."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.run import RunFacts
from oomlens.rules._common import (
    quote,
)
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

_HINTS = (
    (
        "device-side assert",
        "Rerun with CUDA_LAUNCH_BLOCKING=1 to see the failing kernel; an "
        "index out of range (labels >= vocabulary size, a padding id) is the usual cause.",
    ),
    (
        "illegal memory access",
        "Rerun with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer; an "
        "out-of-bounds kernel or a race, not a lack of memory.",
    ),
    (
        "Watchdog caught collective operation timeout",
        "One rank did not reach the collective in "
        "time: look at what the straggler was doing (stuck I/O, a rank-dependent code path, a "
        "crashed peer); TORCH_NCCL_TRACE_BUFFER_SIZE and py-spy dump help.",
    ),
    ("NCCL", "Check the network and NCCL_DEBUG=INFO output on every node."),
)


SPEC = RuleSpec(
    id="not_oom",
    title="The run failed, but not for lack of memory",
    severity=Severity.HIGH,
    explanation=(
        "No allocator, driver or host out-of-memory error and no OOM kill appear in the "
        "inputs: the failure is something else. oomlens names the first failure it can see "
        "and the ranks that only died because of it (peers torn down by the launcher, "
        "collectives that timed out waiting)."
    ),
    verify=(
        "this is not a memory problem: fix the first failure named above; the ranks that only "
        "died because a peer did need no change."
    ),
    precedence=140,
)


class NotOomRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        if (
            facts.oom_events()
            or facts.kernel_oom_kills()
            or facts.captured_kills()
            or facts.sigkilled_at()
        ):
            return
        if any(log.batch_assertions or log.config_errors for log in facts.logs):
            return
        if not facts.has_failure_evidence():
            return
        picture = facts.ranks
        evidence: list[Evidence] = []
        confidence = 0.6
        headline = "the run failed without any memory error"
        own = [e for e in facts.exceptions() if not e.peer_failure]
        if own:
            first = own[0]
            if picture.first_failed is not None and picture.first_failed.exceptions:
                first = picture.first_failed.exceptions[0]
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    quote(f"{first.exception_class}: {first.text}"),
                    first.source,
                    "the first failure of a rank on its own",
                )
            )
            headline = (
                f"{first.exception_class} on rank {first.source.rank}"
                if first.source.rank is not None
                else first.exception_class
            )
            confidence = 0.85
        timeouts = [
            p for log in facts.logs for p in log.peer_failures if p.kind == "watchdog_timeout"
        ]
        if timeouts:
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    quote(timeouts[0].text),
                    timeouts[0].source,
                    "a collective timed out: a peer never joined",
                )
            )
            if picture.suspected_stragglers:
                stragglers = ", ".join(str(r) for r in picture.suspected_stragglers)
                evidence.append(
                    Evidence(
                        EvidenceKind.DERIVED,
                        f"rank(s) {stragglers} did not time out: the others were waiting for them",
                        None,
                    )
                )
                headline = f"a collective timed out waiting for rank(s) {stragglers}"
            else:
                headline = "a collective operation timed out"
            confidence = max(confidence, 0.8)
        if picture.peer_victims:
            victims = ", ".join("?" if r is None else str(r) for r in picture.peer_victims)
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"rank(s) {victims} only died because a "
                    "peer did (SIGTERM from the launcher or a broken collective)",
                    None,
                )
            )
        if not evidence:
            evidence.extend(
                Evidence(
                    EvidenceKind.LOG,
                    quote(
                        f"exit code {failure.exitcode} {failure.signal or ''} "
                        f"{failure.message or ''}"
                    ),
                    failure.source,
                )
                for log in facts.logs
                for failure in log.process_failures[:1]
            )
        text = " ".join(e.text for e in evidence)
        fixes = tuple(Fix(hint, cost="debugging") for key, hint in _HINTS if key in text)[:2]
        yield SPEC.diagnose(
            confidence=confidence,
            summary=headline,
            evidence=tuple(evidence),
            fixes=fixes,
            rank=picture.first_failed.rank if picture.first_failed else None,
        )


RULE = NotOomRule()
