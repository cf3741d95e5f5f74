"""The rule engine: every rule, run over the facts, results ranked.

Adding a rule means adding its class to a rule-family module, listing it in ``RULES``, and
adding its partial ``templates/rules/<id>.html``.  A rule that raises is a bug in oomlens: the
engine records it as an ``internal_error`` diagnosis instead of losing the whole analysis.
"""

from __future__ import annotations

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Severity
from oomlens.facts.run import RunFacts
from oomlens.rules.allocator import FragmentationRule, NonPytorchMemoryRule, OtherProcessRule
from oomlens.rules.base import Rule
from oomlens.rules.batch import AccumulationMismatchRule
from oomlens.rules.failure import ConfigInvalidRule, NotOomRule
from oomlens.rules.hazards import ConfigHazardRule
from oomlens.rules.host import HostOomRule, SharedMemoryRule
from oomlens.rules.leak import MemoryLeakRule
from oomlens.rules.thresholds import Thresholds
from oomlens.rules.workload import ActivationMemoryRule, EvalOrGenerationRule, ModelStatesRule
from oomlens.rules.zero import CheckpointSaveRule, PinnedMemoryRule, PrefetchOvershootRule

RULES: tuple[Rule, ...] = (
    FragmentationRule(),
    OtherProcessRule(),
    NonPytorchMemoryRule(),
    ActivationMemoryRule(),
    EvalOrGenerationRule(),
    ModelStatesRule(),
    MemoryLeakRule(),
    PrefetchOvershootRule(),
    PinnedMemoryRule(),
    CheckpointSaveRule(),
    AccumulationMismatchRule(),
    HostOomRule(),
    SharedMemoryRule(),
    NotOomRule(),
    ConfigInvalidRule(),
    ConfigHazardRule(),
)


def rule_by_id(rule_id: str) -> Rule | None:
    for rule in RULES:
        if rule.id == rule_id:
            return rule
    return None


def evaluate(facts: RunFacts, thresholds: Thresholds) -> tuple[Diagnosis, ...]:
    """Every rule's diagnoses above the reporting threshold, most likely first (ties: more
    severe first, then the order of ``RULES``)."""
    found: list[tuple[int, Diagnosis]] = []
    for order, rule in enumerate(RULES):
        try:
            found.extend((order, diagnosis) for diagnosis in rule.evaluate(facts, thresholds))
        except Exception as exc:  # noqa: BLE001 - a rule bug must not lose the analysis
            found.append(
                (
                    order,
                    Diagnosis(
                        id="internal_error",
                        title=f"oomlens rule {rule.id} failed",
                        severity=Severity.INFO,
                        confidence=0.2,
                        summary=f"a bug in oomlens' {rule.id} rule ({type(exc).__name__}: {exc}); "
                        "the other rules ran. Please report it with this report attached.",
                        evidence=(Evidence(EvidenceKind.DERIVED, f"{type(exc).__name__}: {exc}"),),
                    ),
                )
            )
    kept = [(o, d) for o, d in found if d.confidence >= thresholds.min_confidence_to_report]
    kept.sort(key=lambda item: (-item[1].confidence, -item[1].severity, item[0]))
    return tuple(d for _, d in kept)
