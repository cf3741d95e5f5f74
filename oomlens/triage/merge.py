"""Combine the tables that the shards of a job array wrote into one table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas

from oomlens.triage.outputs import read_table
from oomlens.triage.table import COLUMNS, normalize

RUN_KEY = ["run", "path"]
"""What tells one run's row from another's in tables of one tree: the run's name and where it
is, both kept exactly (``table.EXACT_COLUMNS``).  One walk never gives two runs both the same
name and the same path; shards of one tree agree on both."""


@dataclass(frozen=True, slots=True)
class Merged:
    table: pandas.DataFrame
    """One row per run, newest first."""
    repeated: pandas.DataFrame
    """The rows left out because a newer row has the same ``RUN_KEY`` (a table given twice,
    shards of different sizes over the same tree): empty when every row was kept."""


def merge_runs(paths: Sequence[str]) -> Merged:
    """One table from the shard tables at ``paths`` (any table format, mixed).

    A run present in several tables appears once: its newest row wins, and the others are
    returned in ``repeated`` for the caller to report.  Raises ``InputError`` for a file that is
    not a triage table.
    """
    frames = [read_table(path) for path in paths]
    if not frames:
        empty = normalize(pandas.DataFrame(columns=list(COLUMNS)))
        return Merged(empty, empty)
    combined = pandas.concat(frames, ignore_index=True)
    combined = normalize(combined)  # newest first, so the first of each run is its newest row
    repeated = combined.duplicated(subset=RUN_KEY, keep="first")
    return Merged(normalize(combined[~repeated]), normalize(combined[repeated]))


def merge_tables(paths: Sequence[str]) -> pandas.DataFrame:
    """The table of :func:`merge_runs`, without the rows it left out."""
    return merge_runs(paths).table
