"""Batch triage: analyze every run under a tree of directories and make one table of them.

``triage(paths, options)`` walks the tree for run directories, analyzes them in parallel
worker processes (one per core by default, each run with a time limit), keeps every result
in a SQLite store so that the next call analyzes only what is new or changed, and returns one
row per run (``table.COLUMNS``).  ``Shard`` splits a tree among the tasks of a job array,
``merge_tables`` joins their tables, ``write_table`` writes CSV, JSON lines, Parquet, SQLite or
an HTML index.  The analysis API is reached only through ``oomlens.triage.adapter``.
"""

from oomlens.triage.engine import Shard, TriageOptions, TriageResult, triage
from oomlens.triage.merge import merge_tables
from oomlens.triage.outputs import read_table, write_table
from oomlens.triage.summary import group_table, render_summary
from oomlens.triage.table import COLUMNS

__all__ = [
    "COLUMNS",
    "Shard",
    "TriageOptions",
    "TriageResult",
    "group_table",
    "merge_tables",
    "read_table",
    "render_summary",
    "triage",
    "write_table",
]
