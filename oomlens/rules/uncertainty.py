"""When no cause is sure enough: evidence or silence (a guess presented as a cause is worse).

``insufficient_evidence(facts, verdict, diagnoses)`` is the ``insufficient_evidence`` diagnosis
when the verdict is a failure (or unknown) and no rule names a cause with ``SURE_ENOUGH``
confidence, with what to capture next time; ``with_uncertainty`` places it among the causes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Severity, Verdict
from oomlens.facts.run import RunFacts
from oomlens.rules.base import RuleSpec
from oomlens.rules.common.advice import (
    CAPTURE_CONFIG,
    CAPTURE_KERNEL,
    CAPTURE_MEMORY_SERIES,
    CAPTURE_RANK_OUTPUT,
    CAPTURE_SNAPSHOT,
)

SURE_ENOUGH = 0.5
"""A cause at this confidence or above is worth naming; below, the report says what is missing."""
_NOT_CAUSES = frozenset({"config_hazard", "internal_error"})
INSUFFICIENT_EVIDENCE = RuleSpec(
    id="insufficient_evidence",
    title="Not enough evidence to say why",
    severity=Severity.INFO,
    explanation="oomlens reports a cause only when the evidence supports it. Here the inputs "
    "show what failed but not why: no rule reached the confidence needed to name a cause. "
    "Guessing would send the reader after the wrong knob, so the report says what to capture "
    "instead.",
    verify="capture the items listed below on the next run (or reproduce the failure with them "
    "enabled) and run oomlens again on the run directory.",
)
"""Not a rule: what the report says when no rule is sure enough."""


def _is_cause(d: Diagnosis) -> bool:
    """A diagnosis that names why the run failed: not an internal error, and not a config
    hazard read from the config alone (one the failure itself names is a cause)."""
    if d.id not in _NOT_CAUSES:
        return True
    return d.id == "config_hazard" and any(e.kind is EvidenceKind.LOG for e in d.evidence)


def with_uncertainty(
    diagnoses: Sequence[Diagnosis], undetermined: Diagnosis
) -> tuple[Diagnosis, ...]:
    """Where ``insufficient_evidence`` goes.  First only when nothing points anywhere (no
    cause at all).  When causes were found but none is sure enough, the best-supported one
    still comes first, at its own low confidence, carrying what to capture next time in its
    ``missing``; ``insufficient_evidence`` follows the causes (at no more than their
    confidence, so the list stays most likely first)."""
    causes = [d for d in diagnoses if _is_cause(d)]
    if not causes:
        return (undetermined, *diagnoses)
    best = causes[0]
    recipe = tuple(m for m in undetermined.missing if m not in best.missing)
    ordered = [replace(best, missing=(*best.missing, *recipe))]
    ordered += [d for d in diagnoses if d is not best]
    lowest = min(d.confidence for d in ordered)
    return (*ordered, replace(undetermined, confidence=min(lowest, undetermined.confidence)))


def insufficient_evidence(
    facts: RunFacts, verdict: Verdict, diagnoses: Sequence[Diagnosis]
) -> Diagnosis | None:
    """An ``insufficient_evidence`` diagnosis when ``verdict`` is a failure (or unknown) and no
    cause reaches ``SURE_ENOUGH``; None otherwise."""
    if verdict is Verdict.NO_FAILURE:
        return None
    if any(d.confidence >= SURE_ENOUGH and _is_cause(d) for d in diagnoses):
        return None
    missing: list[str] = []
    if facts.signals.unseen_errors:
        missing.append(CAPTURE_RANK_OUTPUT)
    if verdict is Verdict.GPU_OOM or verdict is Verdict.UNKNOWN:
        if not facts.snapshots:
            missing.append(CAPTURE_SNAPSHOT)
        if not facts.signals.memory_series_seen:
            missing.append(CAPTURE_MEMORY_SERIES)
    if verdict is Verdict.HOST_OOM and not facts.signals.host_kill_seen:
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
    return INSUFFICIENT_EVIDENCE.diagnose(
        confidence=SURE_ENOUGH,
        summary="the inputs show what failed but not why; capture the items below next time",
        evidence=tuple(evidence),
        missing=tuple(missing),
    )
