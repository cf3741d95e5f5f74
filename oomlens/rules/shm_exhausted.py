"""Shared memory (/dev/shm) exhausted: a bus error or DataLoader's "insufficient shared memory"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.kernel import FatalSignalKind, FatalSignalLine
from oomlens.facts.log import Phase
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import as_printed, exception_line, quote
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
        deaths = [d for d in facts.signals.signal_deaths if d.signal == "SIGBUS" and d.source]
        full = [e for e in facts.exceptions() if _NO_SPACE in e.text]
        evidence = [
            Evidence(EvidenceKind.LOG, line.text, line.source, verbatim=True) for line in lines[:3]
        ]
        confidence = 0.0
        if any(line.kind is FatalSignalKind.SHM_EXHAUSTED for line in lines):
            # NCCL naming /dev/shm, or DataLoader's own "insufficient shared memory" (which
            # hedges with "might be"): strong alone, decisive with the job's failure around it.
            nccl = any("nccl" in line.text.lower() for line in lines)
            failed = _failed_besides(facts, lines)
            confidence = 0.8 if nccl or failed else 0.55
        elif lines:
            confidence = 0.6
        if deaths:
            quoted = {(line.source, line.text) for line in lines[:3]}
            evidence += [
                Evidence(
                    EvidenceKind.LOG,
                    death.text,
                    death.source,
                    "SIGBUS: a shared-memory page that could not be backed",
                )
                for death in deaths[:2]
                if (death.source, death.text) not in quoted
            ]
            confidence = max(confidence + 0.1, 0.6)
        if full and not confidence:
            # ENOSPC with no save in progress: in a container, /dev/shm before the disk.
            saving = any(e.phase is Phase.CHECKPOINT_SAVE for e in full)
            if not saving:
                confidence = 0.4
                evidence.append(
                    Evidence(
                        EvidenceKind.LOG,
                        quote(exception_line(full[0])),
                        full[0].source,
                        "a filesystem is full; outside a checkpoint save it is most often "
                        "/dev/shm (DataLoader workers, NCCL) in a container, else the disk",
                        verbatim=as_printed(full[0]),
                    )
                )
        if not confidence:
            return
        denied = facts.signals.shm_denied
        if denied is not None:
            confidence = min(confidence, 0.3)
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    "opening shared memory was refused: Permission denied",
                    denied,
                    "a permission on /dev/shm, not a full one",
                    supports=False,
                )
            )
        yield SPEC.diagnose(
            confidence=confidence,
            summary="a process ran out of shared memory (/dev/shm)",
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Give the container a larger /dev/shm, or use fewer DataLoader workers.",
                    command="docker run --shm-size=16g ... (or --ipc=host) / "
                    "DataLoader(num_workers=...)",
                    cost="none",
                ),
            ),
            missing=("df -h /dev/shm inside the job's container while it runs",),
        )


_NO_SPACE = "No space left on device"


def _failed_besides(facts: RunFacts, lines: list[FatalSignalLine]) -> bool:
    """The run shows a failure other than the shared-memory lines themselves."""
    cited = {line.source for line in lines}
    if any(not e.peer_failure for e in facts.exceptions()) or facts.ranks.launcher_exits:
        return True
    if any(s.first_source not in cited for s in facts.ranks.ranks if s.first_source):
        return True
    return any(log.process_failures or log.peer_failures for log in facts.logs)


RULE = SharedMemoryRule()
