"""Batch triage: analyze every run under a tree of directories and make one table of them.

``triage(paths, options)`` walks the tree for run directories, analyzes them in parallel
worker processes (one per core by default, each run with a time limit), keeps every result
in a SQLite store so that the next call analyzes only what is new or changed, and returns one
row per run (``table.COLUMNS``).  ``Shard`` splits a tree among the tasks of a job array,
``merge_runs`` joins their tables (``merge_tables``: the table alone), ``write_table`` writes
CSV, JSON lines, Parquet, SQLite or an HTML index.  The analysis API is reached only through
``oomlens.triage.adapter``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "COLUMNS": "oomlens.triage.table",
    "Shard": "oomlens.triage.shard",
    "TriageOptions": "oomlens.triage.engine",
    "TriageResult": "oomlens.triage.engine",
    "group_table": "oomlens.triage.summary",
    "merge_runs": "oomlens.triage.merge",
    "merge_tables": "oomlens.triage.merge",
    "read_table": "oomlens.triage.outputs",
    "render_summary": "oomlens.triage.summary",
    "triage": "oomlens.triage.engine",
    "write_table": "oomlens.triage.outputs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy: ``oomlens --help`` and the other commands must not pay for pandas.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'oomlens.triage' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
