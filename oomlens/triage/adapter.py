"""The one place where triage touches oomlens' analysis API.

Everything else in ``oomlens.triage`` goes through the three functions here, so a change in
that API is a change in this module only.  They run in worker processes as well as in the
parent, so they import lazily and return plain data (dicts, strings, booleans).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import oomlens


def analyze_run(
    inputs: Sequence[str], *, config: str | None, want_html: bool, deepspeed: bool
) -> tuple[dict[str, Any], str | None]:
    """Analyze one run: ``inputs`` are its files and/or directories, as ``analyze`` takes them.

    Returns the report's versioned JSON dict and, when ``want_html`` and the HTML renderer
    exists, the report as one HTML page (else None).  ``deepspeed`` validates configs with
    DeepSpeed's own models when it is installed (else oomlens' own checks).  Raises
    ``NoUsableInputError`` when nothing among the inputs could be read; problems with single
    files are recorded in the report.
    """
    from oomlens.render.json import report_to_dict
    from oomlens.render.registry import Format, render
    from oomlens.session import AnalysisOptions, analyze

    report = analyze(
        list(inputs), config=config, options=AnalysisOptions(prefer_deepspeed=deepspeed)
    )
    html = render(report, Format.HTML) if want_html and html_available() else None
    return report_to_dict(report), html


def preload(*, deepspeed: bool) -> None:
    """Import, once in this process, what analyses need, so that worker processes forked
    from it start warm.  With ``deepspeed``, DeepSpeed's config models too (they import
    torch: seconds per process)."""
    from oomlens.session import preload as preload_analysis

    preload_analysis()
    if deepspeed:
        from oomlens.analysis.ds_validation import deepspeed_available

        deepspeed_available()


def html_available() -> bool:
    """Whether per-run HTML reports can be rendered by this oomlens."""
    from oomlens.render.registry import Format, available

    return available(Format.HTML)


def is_training_log(path: str) -> bool:
    """Whether ``path`` is a training log by its content, the way run discovery decides it
    (``oomlens.ingest.detect.accept``: a text file without any marker still counts when its
    name says it is a log).  Raises ``InputError`` when the file cannot be opened."""
    from oomlens.ingest.detect import accept, detect_kind
    from oomlens.ingest.kinds import kind

    accepted = accept(detect_kind(path), name=os.path.basename(path))
    return accepted is not None and accepted[0] is kind("training_log")


def analyzer_id() -> str:
    """Identifies the analysis code: results made by other code are not reused.

    The package version alone is not enough while rules change between releases, so the
    digest of oomlens' own sources is part of it (about a hundred small files: milliseconds).
    """
    digest = hashlib.sha256()
    package = Path(oomlens.__file__).resolve().parent
    for source in sorted(package.rglob("*.py")):
        relative = source.relative_to(package).as_posix()
        if relative.startswith(("triage/", "cli/")):
            continue
        digest.update(relative.encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    return f"oomlens {oomlens.__version__} {digest.hexdigest()[:16]}"
