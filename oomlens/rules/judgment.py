"""The one place a run is judged: every rule's diagnoses, the verdict, what to do when no
cause is sure enough, what died first and how the memory model reads against the run.

``judge(facts, thresholds)`` reads only ``RunFacts`` (with its derived ``signals``) and the
user's ``Thresholds``; ``oomlens.report.assemble`` puts what it returns into a ``Report``
without deciding anything more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oomlens.diagnosis import Diagnosis, RuleDoc, Verdict
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import FailurePoint
from oomlens.rules.budget_reading import BudgetReading, read_budget
from oomlens.rules.engine import docs, evaluate
from oomlens.rules.thresholds import Thresholds
from oomlens.rules.uncertainty import INSUFFICIENT_EVIDENCE, insufficient_evidence, with_uncertainty
from oomlens.rules.verdict import decide_verdict, failure_point


@dataclass(frozen=True, slots=True)
class Judgment:
    """What the rules decided about one run."""

    verdict: Verdict
    reason: str
    """One sentence: what decided the verdict."""
    diagnoses: tuple[Diagnosis, ...]
    """Most likely first (``insufficient_evidence`` placed among them when no cause is sure
    enough)."""
    missing: tuple[str, ...]
    """What to capture next time, across all diagnoses (deduplicated)."""
    failure: FailurePoint
    docs: Mapping[str, RuleDoc]
    """What each diagnosis id of ``diagnoses`` means."""
    budget: BudgetReading | None
    """The memory model read against the run (None without a model)."""


def judge(facts: RunFacts, thresholds: Thresholds) -> Judgment:
    """Judge ``facts`` under ``thresholds`` (see the module docstring)."""
    diagnoses = evaluate(facts, thresholds)
    verdict, reason = decide_verdict(facts, thresholds)
    undetermined = insufficient_evidence(facts, verdict, diagnoses)
    if undetermined is not None:
        diagnoses = with_uncertainty(diagnoses, undetermined)
    known = docs() | {INSUFFICIENT_EVIDENCE.id: INSUFFICIENT_EVIDENCE.doc}
    return Judgment(
        verdict=verdict,
        reason=reason,
        diagnoses=diagnoses,
        missing=tuple(dict.fromkeys(m for d in diagnoses for m in d.missing)),
        failure=failure_point(facts, verdict),
        docs={d.id: known[d.id] for d in diagnoses if d.id in known},
        budget=read_budget(facts, verdict, diagnoses[0] if diagnoses else None),
    )
