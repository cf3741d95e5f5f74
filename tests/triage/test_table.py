"""The triage table's dtypes hold whatever a log printed (fuzz finding triage-573 of campaign E:
a mutated OOM message's 24-digit size ended the whole triage in an internal error)."""

from __future__ import annotations

import pandas

from oomlens.triage.table import COLUMNS, normalize


def _frame(**values: object) -> pandas.DataFrame:
    record = dict.fromkeys(COLUMNS)
    record.update(run="r", path="p", verdict="gpu_oom", **values)
    return pandas.DataFrame.from_records([record], columns=list(COLUMNS))


def test_an_integer_past_int64_is_missing_not_an_error() -> None:
    frame = normalize(_frame(tried_to_allocate=10**24 * 2**30, capacity=80 * 2**30))
    assert pandas.isna(frame.loc[0, "tried_to_allocate"])
    assert frame.loc[0, "capacity"] == 80 * 2**30
    assert frame["tried_to_allocate"].dtype == "Int64"


def test_the_largest_int64_is_kept() -> None:
    frame = normalize(_frame(free=2**63 - 1))
    assert frame.loc[0, "free"] == 2**63 - 1
