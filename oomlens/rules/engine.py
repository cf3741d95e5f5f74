"""The rule engine: every rule, run over the facts, results ranked.

Rules are the modules of ``oomlens.rules`` that define ``RULE`` (see ``oomlens.rules.base``):
adding a rule is adding its module (and its card ``templates/rules/<id>.html``); nothing here
lists them.  A rule that raises is a bug in oomlens: the engine records it as an
``internal_error`` diagnosis instead of losing the whole analysis.
"""

from __future__ import annotations

import importlib
import pkgutil

import oomlens.rules
from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, RuleDoc, Severity
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

INTERNAL_ERROR = RuleSpec(
    id="internal_error",
    title="oomlens rule failed",
    severity=Severity.INFO,
    explanation="One of oomlens' rules failed on these inputs: a bug in oomlens, not in the "
    "job. The other rules ran and their diagnoses stand; only this rule's view of the run is "
    "missing.",
    reading="The evidence is the error the rule raised.",
    verify="report the bug with this report (use --redact if it leaves the organisation); "
    "nothing in the job needs to change for this item.",
)
"""Not a rule: what the engine reports when a rule raises."""
INTERNAL_ERROR_CONFIDENCE = 0.2
"""Low: it says nothing about the run, only that one rule's view of it is missing."""


MACHINERY = frozenset(
    {"base", "engine", "thresholds", "verdict", "uncertainty", "judgment", "budget_reading"}
)
"""The modules of ``oomlens.rules`` that are not rules: the rule's declaration, this engine,
the thresholds, and the judgment around the rules (the verdict table, the uncertainty, the
budget reading).  Subpackages (``common``: what several rules know) are not rules either."""


def _discover() -> tuple[Rule, ...]:
    """Every module of ``oomlens.rules`` but ``MACHINERY`` and subpackages is a rule and must
    define ``RULE``: a module that does not is an error here, not a rule silently lost."""
    found: list[Rule] = []
    for module in pkgutil.iter_modules(oomlens.rules.__path__):
        if module.ispkg or module.name in MACHINERY or module.name.startswith("_"):
            continue
        declared = getattr(importlib.import_module(f"oomlens.rules.{module.name}"), "RULE", None)
        if not isinstance(declared, Rule):
            raise TypeError(f"oomlens.rules.{module.name} defines no RULE (a Rule instance)")
        found.append(declared)
    return tuple(sorted(found, key=lambda rule: rule.spec.precedence))


RULES: tuple[Rule, ...] = _discover()
"""Every rule, in precedence order."""


def docs() -> dict[str, RuleDoc]:
    """What every diagnosis id the engine can report means (``internal_error`` included)."""
    return {rule.spec.id: rule.spec.doc for rule in RULES} | {INTERNAL_ERROR.id: INTERNAL_ERROR.doc}


def evaluate(facts: RunFacts, thresholds: Thresholds) -> tuple[Diagnosis, ...]:
    """Every rule's diagnoses above the reporting threshold, most likely first (ties: more
    severe first, then the rules' precedence)."""
    found: list[tuple[int, Diagnosis]] = []
    for order, rule in enumerate(RULES):
        try:
            found.extend((order, diagnosis) for diagnosis in rule.evaluate(facts, thresholds))
        except Exception as exc:  # noqa: BLE001 - a rule bug must not lose the analysis
            error = f"{type(exc).__name__}: {exc}"
            found.append(
                (
                    order,
                    INTERNAL_ERROR.diagnose(
                        title=f"oomlens rule {rule.spec.id} failed",
                        confidence=INTERNAL_ERROR_CONFIDENCE,
                        summary=f"a bug in oomlens' {rule.spec.id} rule ({error}); "
                        "the other rules ran. Please report it with this report attached.",
                        evidence=(Evidence(EvidenceKind.DERIVED, error),),
                    ),
                )
            )
    kept = [(o, d) for o, d in found if d.confidence >= thresholds.min_confidence_to_report]
    kept.sort(key=lambda item: (-item[1].confidence, -item[1].severity, item[0]))
    return tuple(d for _, d in kept)
