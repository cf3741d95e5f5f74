"""The one place where the Epilog calls oomlens' analysis API.

:func:`analyze_for_epilog` is the adapter: everything else in ``oomlens.epilog`` sees only
:class:`EpilogAnalysis`, plain data that crosses the pipe from the analysis process.  It runs in
that process (as the job's user, under the Epilog's deadline), so it imports lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EpilogAnalysis:
    """What the Epilog keeps of a report."""

    report: dict[str, Any]
    """The versioned JSON report (``oomlens.render.json.report_to_dict``)."""
    html: str | None
    """The HTML report, or None when this oomlens has no HTML renderer."""
    verdict: str
    diagnosis: str | None = None
    """The most likely diagnosis' id."""
    confidence: float | None = None
    summary: str | None = None
    notes: tuple[str, ...] = field(default=())


def prepare_analysis() -> None:
    """Get the analysis ready in a process that is about to drop to the job's user.

    Imports it now, while the installation is surely readable (it may not be to the job's
    user).  DeepSpeed stays out (``prefer_deepspeed=False`` below): importing it, and torch
    with it, to validate a config costs seconds and gigabytes the Epilog does not have.
    """
    from oomlens.session import preload

    preload()


def analyze_for_epilog(
    paths: Sequence[str], *, config: str | None = None, max_snapshot_bytes: int | None = None
) -> EpilogAnalysis:
    """Analyze a job's files (logs, snapshots, configs) and render the report.

    Snapshots larger than ``max_snapshot_bytes`` are not loaded (the report says so).  Raises
    ``oomlens.errors.NoUsableInputError`` when nothing among ``paths`` could be read; problems
    with single files are recorded in the report.
    """
    from oomlens.render.json import report_to_dict
    from oomlens.render.registry import Format, available, render
    from oomlens.session import AnalysisOptions, analyze

    options = AnalysisOptions(max_snapshot_bytes=max_snapshot_bytes, prefer_deepspeed=False)
    report = analyze(list(paths), config=config, options=options)
    notes: list[str] = []
    html: str | None = None
    if available(Format.HTML):
        html = render(report, Format.HTML)
    else:
        notes.append("this oomlens has no HTML renderer; only the JSON report was written")
    top = report.diagnoses[0] if report.diagnoses else None
    return EpilogAnalysis(
        report=report_to_dict(report),
        html=html,
        verdict=str(report.verdict),
        diagnosis=None if top is None else str(top.id),
        confidence=None if top is None else float(top.confidence),
        summary=None if top is None else str(top.summary),
        notes=tuple(notes),
    )
