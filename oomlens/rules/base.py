"""What a rule is and what it returns.

A rule reads only facts (``oomlens.facts`` and the derived facts of ``oomlens.analysis``) and
returns ``Diagnosis`` objects.  A diagnosis says what killed the run, how sure oomlens is
(``confidence`` 0..1), cites every piece of evidence it rests on, says what evidence is missing,
and proposes fixes that are never already in force.  Each rule module owns its id, title,
explanation and fix wording; the HTML partial ``templates/rules/<id>.html`` renders it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Protocol

from oomlens.diagnosis import Diagnosis

if TYPE_CHECKING:
    from oomlens.facts.run import RunFacts
    from oomlens.rules.thresholds import Thresholds


class Rule(Protocol):
    """A rule: reads facts, returns zero or more diagnoses. Must not raise on odd facts."""

    id: ClassVar[str]
    title: ClassVar[str]
    explanation: ClassVar[str]
    """What the diagnosis means and why it happens, for readers of the report."""

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterable[Diagnosis]: ...


def clamp(value: float, low: float = 0.0, high: float = 1.0) -> float:
    """Confidence arithmetic stays within [low, high]."""
    return max(low, min(high, value))
