"""What a worker process does for one run: analyze it, and write its HTML report if asked."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from oomlens.errors import NoUsableInputError, OomlensError
from oomlens.render.output import write_atomically
from oomlens.triage import adapter


@dataclass(frozen=True, slots=True)
class AnalysisTask:
    """One run to analyze: what ``analyze`` gets, and where its HTML report goes (if wanted)."""

    inputs: tuple[str, ...]
    config: str | None
    report_path: str | None
    deepspeed: bool = False
    """Validate configs with DeepSpeed's own models (when installed)."""


@dataclass(frozen=True, slots=True)
class AnalysisResult:
    """The report's JSON dict, or the error that prevented it; never both missing."""

    report: dict[str, Any] | None
    error: str | None
    report_file: str | None
    """``report_path`` once the HTML report is written there."""
    report_problem: str | None
    """Why the HTML report could not be written, when it could not."""
    seconds: float


def analyze_task(task: AnalysisTask) -> AnalysisResult:
    """Analyze one run.  Bad inputs become ``error``; only a bug in oomlens raises."""
    started = time.perf_counter()
    report: dict[str, Any] | None = None
    html: str | None = None
    error: str | None = None
    try:
        report, html = adapter.analyze_run(
            task.inputs,
            config=task.config,
            want_html=task.report_path is not None,
            deepspeed=task.deepspeed,
        )
    except NoUsableInputError as exc:
        error = f"no usable input: {exc.message}"
    except OomlensError as exc:
        error = exc.message
    report_file: str | None = None
    problem: str | None = None
    if html is not None and task.report_path is not None:
        try:
            write_atomically(task.report_path, html.encode("utf-8"))
            report_file = task.report_path
        except OSError as exc:
            problem = f"{task.report_path}: cannot be written ({exc.strerror or exc})"
    return AnalysisResult(report, error, report_file, problem, time.perf_counter() - started)
