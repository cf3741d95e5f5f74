"""When the inputs show a failure but no rule is reasonably sure why: say so, and say exactly
what to capture next time (evidence or silence: a guess presented as a cause is worse)."""

from __future__ import annotations

from collections.abc import Sequence

from oomlens.facts.run import RunFacts
from oomlens.report import Verdict
from oomlens.rules._common import (
    CAPTURE_CONFIG,
    CAPTURE_KERNEL,
    CAPTURE_MEMORY_SERIES,
    CAPTURE_SNAPSHOT,
)
from oomlens.rules.base import Diagnosis, Evidence, EvidenceKind, Severity

SURE_ENOUGH = 0.5
_NOT_CAUSES = frozenset({"config_hazard", "internal_error", "non_pytorch_memory"})


def insufficient_evidence(
    facts: RunFacts, verdict: Verdict, diagnoses: Sequence[Diagnosis]
) -> Diagnosis | None:
    """An ``insufficient_evidence`` diagnosis when ``verdict`` is a failure (or unknown) and no
    cause reaches ``SURE_ENOUGH``; None otherwise."""
    if verdict is Verdict.NO_FAILURE:
        return None
    if any(d.confidence >= SURE_ENOUGH and d.id not in _NOT_CAUSES for d in diagnoses):
        return None
    missing: list[str] = []
    if verdict is Verdict.GPU_OOM or verdict is Verdict.UNKNOWN:
        if not facts.snapshots:
            missing.append(CAPTURE_SNAPSHOT)
        if not any(True for _ in facts.memory_series()):
            missing.append(CAPTURE_MEMORY_SERIES)
    if verdict is Verdict.HOST_OOM and not (facts.kernel_oom_kills() or facts.captured_kills()):
        missing.append(CAPTURE_KERNEL)
    if facts.config is None:
        missing.append(CAPTURE_CONFIG)
    if not facts.logs:
        missing.append("the job's combined stdout/stderr (every rank's)")
    cut = [log for log in facts.logs if log.ended_in_traceback or log.ended_mid_line]
    evidence = [
        Evidence(
            EvidenceKind.DERIVED,
            f"verdict {verdict.value}; no cause reaches {SURE_ENOUGH:.0%} confidence",
        )
    ]
    evidence += [Evidence(EvidenceKind.LOG, "the log ends mid-crash (cut)", None) for _ in cut[:1]]
    return Diagnosis(
        id="insufficient_evidence",
        title="Not enough evidence to say why",
        severity=Severity.INFO,
        confidence=0.5,
        summary="the inputs show what failed but not why; capture the items below next time",
        evidence=tuple(evidence),
        missing=tuple(missing),
    )
