"""The result of an analysis: the verdict, the ranked diagnoses, and the facts behind them.

Renderers read only a ``Report`` (or ``oomlens check``'s ``CheckReport``, ``oomlens whatif``'s
``WhatIfReport``), and the report's vocabulary (``Diagnosis``, ``Evidence``, ``Fix``,
``Severity``, ``Verdict``, re-exported here from ``oomlens.diagnosis``).  ``assemble(facts,
thresholds)`` makes one from what the rules decided (``oomlens.rules.judgment.judge``: the
verdict, the diagnoses most likely first, ``insufficient_evidence`` when no cause is sure
enough, what died first, how the memory model reads against the run); it decides nothing
itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from oomlens import __version__
from oomlens.diagnosis import (
    Diagnosis,
    Evidence,
    EvidenceKind,
    Figure,
    Fix,
    RuleDoc,
    Severity,
    Unit,
    Verdict,
)
from oomlens.facts.preflight import Preflight
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import FailurePoint
from oomlens.facts.whatif import WhatIf
from oomlens.rules.budget_reading import BudgetReading, CapacityReading
from oomlens.rules.judgment import judge
from oomlens.rules.thresholds import Thresholds

__all__ = [
    "CHECK_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "BudgetReading",
    "CapacityReading",
    "CheckReport",
    "Diagnosis",
    "Evidence",
    "EvidenceKind",
    "FailurePoint",
    "Figure",
    "Fix",
    "Report",
    "RuleDoc",
    "Severity",
    "Unit",
    "Verdict",
    "assemble",
]

SCHEMA_VERSION = "1.1"
"""Of the JSON report (docs/json-schema.md): keys are only added within a major version."""
CHECK_SCHEMA_VERSION = "1.0"
"""Of ``oomlens check``'s JSON, the same way."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What ``oomlens check`` found about one ds_config (``oomlens.analysis.preflight``)."""

    document: ClassVar[str] = "check"
    preflight: Preflight
    oomlens_version: str = __version__


@dataclass(frozen=True, slots=True)
class WhatIfReport:
    """What ``oomlens whatif`` found: a snapshot's recording replayed under other allocator
    settings (``oomlens.analysis.whatif``)."""

    document: ClassVar[str] = "whatif"
    whatif: WhatIf
    oomlens_version: str = __version__


@dataclass(frozen=True, slots=True)
class Report:
    """What an analysis found: the verdict, the diagnoses, the facts behind them."""

    document: ClassVar[str] = "report"
    verdict: Verdict
    verdict_reason: str
    """One sentence: what decided the verdict."""
    diagnoses: tuple[Diagnosis, ...]
    """Most likely first."""
    facts: RunFacts
    missing: tuple[str, ...]
    """What to capture next time, across all diagnoses (deduplicated)."""
    failure: FailurePoint | None = None
    """What died first (None when nothing did)."""
    docs: Mapping[str, RuleDoc] = field(default_factory=dict)
    """What each diagnosis id of the report means (declared with its rule)."""
    budget: BudgetReading | None = None
    """The memory model read against the run (None without a model)."""
    oomlens_version: str = __version__

    @property
    def top(self) -> Diagnosis | None:
        return self.diagnoses[0] if self.diagnoses else None


def assemble(facts: RunFacts, thresholds: Thresholds) -> Report:
    """The report of ``facts`` as the rules judge it under ``thresholds``."""
    judgment = judge(facts, thresholds)
    return Report(
        verdict=judgment.verdict,
        verdict_reason=judgment.reason,
        diagnoses=judgment.diagnoses,
        facts=facts,
        missing=judgment.missing,
        failure=judgment.failure,
        docs=judgment.docs,
        budget=judgment.budget,
    )
