"""The vocabulary of a report: diagnoses, the evidence they cite and the fixes they propose.

Rules (``oomlens.rules``) produce these objects and the verdict, the report
(``oomlens.report``) carries them and re-exports this vocabulary, and renderers read it from
there.  A diagnosis says what killed
the run, how sure oomlens is (``confidence`` 0..1), cites every piece of evidence it rests on,
says what evidence is missing, and proposes fixes that are never already in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from oomlens.facts import SourceRef


class Verdict(StrEnum):
    """What happened to the run, decided before why (``oomlens.rules.verdict``)."""

    GPU_OOM = "gpu_oom"
    """The GPU (or another accelerator) ran out of memory."""
    HOST_OOM = "host_oom"
    """Host RAM ran out: the kernel or the scheduler killed a rank, or a host allocation failed."""
    CONFIG_ERROR = "config_error"
    """The job was rejected by its own configuration before or while starting."""
    OTHER_FAILURE = "other_failure"
    """The run failed for a reason other than memory."""
    NO_FAILURE = "no_failure"
    """The inputs show no failure."""
    UNKNOWN = "unknown"
    """The inputs cannot tell (nothing readable, or a log cut before any sign)."""


class Severity(IntEnum):
    """How bad the finding is for the run, independent of how sure we are."""

    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class EvidenceKind(StrEnum):
    LOG = "log"
    SNAPSHOT = "snapshot"
    CONFIG = "config"
    KERNEL = "kernel"
    ERROR_FILE = "error_file"
    CAPTURE = "capture"
    """A record of an oomlens capture (its file and line)."""
    DERIVED = "derived"
    """A number oomlens computed from other evidence (the arithmetic is in ``text``)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One cited fact: where it is, what it says (quoted, bounded), and why it matters."""

    kind: EvidenceKind
    text: str
    """The quoted line (``verbatim``), config key = value, snapshot figure, oomlens' account of
    a line, or a computed figure."""
    source: SourceRef | None = None
    note: str = ""
    """Why this supports (or weakens) the diagnosis."""
    supports: bool = True
    """False for evidence that speaks against the diagnosis (kept to show the weighing)."""
    verbatim: bool = False
    """True when ``text`` is the input's own words at ``source`` (a line or message as printed,
    its whitespace collapsed and perhaps cut short with "…"), so that a renderer may show it as
    an excerpt of that line.  False for oomlens' own account of what the line says (a summary,
    a figure, a conclusion from a traceback), which must not be shown as if it were quoted."""


@dataclass(frozen=True, slots=True)
class Fix:
    """A change to make, with what it saves and what it costs.

    ``config_patch`` is a JSON merge patch (RFC 7396) for the ds_config; ``environment`` maps
    variables to values; ``command`` is a command-line change in words or a literal argument,
    ``arguments`` the same change as flags and values when it is one.
    """

    summary: str
    config_patch: Mapping[str, Any] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    command: str | None = None
    predicted_saving_bytes: int | None = None
    cost: str | None = None
    arguments: Mapping[str, str] = field(default_factory=dict)
    """Command-line arguments to set (flag -> value), machine-applicable: ``oomlens fix``
    replaces them in the run's command."""
    predicted_peak_bytes: int | None = None
    """The peak the run is predicted to reach with the fix applied (the account's
    arithmetic), to check the fix against."""


class Unit(StrEnum):
    """What a figure counts, so that every renderer shows it the same way."""

    BYTES = "bytes"
    COUNT = "count"
    """Whole things: steps, ranks, segments, elements (a config's element counts)."""
    FRACTION = "fraction"
    """A share, 0..1."""
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class Figure:
    """One named number behind a diagnosis, with its unit (None: not known)."""

    value: int | float | str | None
    unit: Unit


def in_bytes(value: int | float | None) -> Figure:
    return Figure(value, Unit.BYTES)


def a_count(value: int | float | None) -> Figure:
    return Figure(value, Unit.COUNT)


def a_fraction(value: float | None) -> Figure:
    return Figure(value, Unit.FRACTION)


def a_text(value: str | None) -> Figure:
    return Figure(value, Unit.TEXT)


@dataclass(frozen=True, slots=True)
class RuleDoc:
    """What a diagnosis id means, for the reader of a report: declared once with the rule
    (``oomlens.rules.base.RuleSpec``) and shown the same way by every renderer.  Plain text."""

    id: str
    title: str
    explanation: str
    """What the diagnosis means and why it happens."""
    verify: str
    """How to tell the fix worked."""
    reading: str = ""
    """How to read the evidence, when it needs saying."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A rule's conclusion about the run."""

    id: str
    title: str
    severity: Severity
    confidence: float
    summary: str
    evidence: tuple[Evidence, ...]
    fixes: tuple[Fix, ...] = ()
    missing: tuple[str, ...] = ()
    """Evidence that would settle it, phrased as what to capture next time."""
    rank: int | None = None
    """The rank the diagnosis is about, when it is about one."""
    figures: Mapping[str, Figure] = field(default_factory=dict)
    """Named numbers behind the summary, each with its unit, for reports and JSON."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} outside 0..1 for {self.id}")
