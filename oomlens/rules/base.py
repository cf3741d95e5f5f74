"""What a rule is: its declaration, once, and its evaluation.

A rule is one module of ``oomlens.rules`` that defines ``RULE``, an instance of a ``Rule``
subclass (the engine finds it; nothing lists it).  Its ``spec`` (a ``RuleSpec``) declares, in
one place, the rule's id, title, severity, the named thresholds it reads
(``oomlens.rules.thresholds``), its explanation for readers and how to tell its fix worked.
``evaluate`` reads only facts (``oomlens.facts``, derived by ``oomlens.analysis``) and returns
diagnoses made with ``spec.diagnose``, which fills the id, title and severity and keeps the
confidence within 0..1.  The HTML partial ``templates/rules/<id>.html`` is the rule's card.

Confidence arithmetic: each rule starts from the weight of its main evidence and adds or
subtracts for evidence that supports or weighs against it; those weights are the rule's
judgement, calibrated on the crash corpus (``fixtures/crash_logs``), and live in the rule's
code next to the evidence they weigh.  Thresholds, the values facts are compared with, are
named in ``Thresholds`` and can be changed from a settings file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, Figure, Fix, RuleDoc, Severity

if TYPE_CHECKING:
    from oomlens.facts.run import RunFacts
    from oomlens.rules.thresholds import Thresholds

VERIFY_DEFAULT = (
    "re-run with the same inputs captured and run oomlens again: this diagnosis should be gone "
    "or its figures much smaller."
)


def clamp(value: float, low: float = 0.0, high: float = 1.0) -> float:
    """Confidence arithmetic stays within [low, high]."""
    return max(low, min(high, value))


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """A rule's declaration (see the module docstring)."""

    id: str
    title: str
    severity: Severity
    explanation: str
    """What the diagnosis means and why it happens, for readers of the report (plain text)."""
    verify: str = VERIFY_DEFAULT
    """How to tell the fix worked (plain text)."""
    reading: str = ""
    """How to read the evidence, when it needs saying (plain text)."""
    thresholds: tuple[str, ...] = ()
    """The ``Thresholds`` it compares facts with, by name."""
    precedence: int = 1000
    """Diagnoses equally likely and equally severe are listed in this order (lowest first)."""

    @property
    def doc(self) -> RuleDoc:
        return RuleDoc(self.id, self.title, self.explanation, self.verify, self.reading)

    def diagnose(
        self,
        *,
        confidence: float,
        summary: str,
        evidence: Sequence[Evidence],
        fixes: Sequence[Fix] = (),
        missing: Sequence[str] = (),
        rank: int | None = None,
        figures: Mapping[str, Figure] | None = None,
        title: str | None = None,
        severity: Severity | None = None,
    ) -> Diagnosis:
        """A diagnosis of this rule: its id, its title and severity unless given, and
        ``confidence`` clamped to 0..1."""
        return Diagnosis(
            id=self.id,
            title=self.title if title is None else title,
            severity=self.severity if severity is None else severity,
            confidence=clamp(confidence),
            summary=summary,
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=tuple(missing),
            rank=rank,
            figures=dict(figures or {}),
        )


class Rule(ABC):
    """A rule: reads facts, returns zero or more diagnoses. Must not raise on odd facts."""

    spec: ClassVar[RuleSpec]

    @abstractmethod
    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterable[Diagnosis]:
        """The rule's diagnoses of ``facts``."""
