"""Shared memory (/dev/shm) exhausted: a bus error or DataLoader's "insufficient shared memory"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="shm_exhausted",
    title="Shared memory (/dev/shm) exhausted",
    severity=Severity.HIGH,
    explanation=(
        "DataLoader workers pass batches through shared memory, and NCCL uses it for "
        "intra-node transport. Containers often mount a small /dev/shm (Docker's default is 64 "
        "MB); when it fills, the process dies of SIGBUS ('Bus error', exit -7) or DataLoader "
        "reports insufficient shared memory."
    ),
    verify=(
        "df -h /dev/shm inside the container leaves headroom while the DataLoader workers run, "
        "and no 'bus error' or 'No space left on device' appears."
    ),
    precedence=130,
)


class SharedMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        lines = [
            line
            for log in facts.logs
            for line in log.fatal_signals
            if line.kind in (FatalSignalKind.SIGBUS, FatalSignalKind.SHM_EXHAUSTED)
        ]
        if not lines:
            return
        yield SPEC.diagnose(
            confidence=0.8
            if any(line.kind is FatalSignalKind.SHM_EXHAUSTED for line in lines)
            else 0.6,
            summary="a process ran out of shared memory (/dev/shm)",
            evidence=tuple(
                Evidence(EvidenceKind.LOG, line.text, line.source) for line in lines[:3]
            ),
            fixes=(
                Fix(
                    "Give the container a larger /dev/shm, or use fewer DataLoader workers.",
                    command="docker run --shm-size=16g ... / DataLoader(num_workers=...)",
                    cost="none",
                ),
            ),
        )


RULE = SharedMemoryRule()
