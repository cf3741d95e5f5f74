"""Combine the tables that the shards of a job array wrote into one table."""

from __future__ import annotations

from collections.abc import Sequence

import pandas

from oomlens.triage.outputs import read_table
from oomlens.triage.table import COLUMNS, normalize


def merge_tables(paths: Sequence[str]) -> pandas.DataFrame:
    """One table from the shard tables at ``paths`` (any table format, mixed).

    A run present in several tables (shards of different sizes over the same tree, or a
    table given twice) appears once: its newest row wins.  Raises ``InputError`` for a file
    that is not a triage table.
    """
    frames = [read_table(path) for path in paths]
    if not frames:
        return normalize(pandas.DataFrame(columns=list(COLUMNS)))
    combined = pandas.concat(frames, ignore_index=True)
    combined = normalize(combined)  # newest first, so the first of each run is its newest row
    combined = combined.drop_duplicates(subset=["run", "path"], keep="first")
    return normalize(combined)
