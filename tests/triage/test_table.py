"""The triage table's dtypes hold whatever a log printed (fuzz finding triage-573 of campaign E:
a mutated OOM message's 24-digit size ended the whole triage in an internal error)."""

from __future__ import annotations

import pandas

from oomlens.triage.store import StoredResult
from oomlens.triage.table import COLUMNS, RunRow, build_table, normalize
from oomlens.triage.walk import FileEntry, RunSpec


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


def _row(name: str, report: dict[str, object] | None, mtime_ns: int) -> RunRow:
    entry = FileEntry(f"/runs/{name}/train.log", 1, mtime_ns, 1)
    run = RunSpec(
        name, f"/runs/{name}", f"/runs/{name}", (f"/runs/{name}",), (("train.log", entry),)
    )
    return RunRow(run, StoredResult("k-" + name, "id-" + name, report, None, None, 0.0))


def _failed_at(first_time: str) -> dict[str, object]:
    return {
        "verdict": "gpu_oom",
        "ranks": {"first_failed": 0, "ranks": [{"rank": 0, "first_time": first_time}]},
    }


def test_time_has_one_form_whatever_its_source() -> None:
    # The report's times are datetime.isoformat: seconds or microseconds, an offset or none;
    # a file's time is UTC.
    table = build_table(
        [
            _row("seconds", _failed_at("2026-11-30T06:37:49"), 0),
            _row("micro", _failed_at("2026-11-30T06:33:53.598000"), 0),
            _row("offset", _failed_at("2026-11-30T07:33:53.598123+01:00"), 0),
            _row("utc", _failed_at("2026-11-30T06:33:53+00:00"), 0),
            _row(
                "events",
                {
                    "oom_events": [
                        {"timestamp": "2026-11-30T06:40:00.5"},
                        {"timestamp": "2026-11-30T06:39:59"},
                    ]
                },
                0,
            ),  # fmt: skip
            _row("file", None, 1_795_000_000_250_000_000),
            _row("garbled", _failed_at("yesterday"), 1_795_000_000_000_000_000),
        ]
    )
    times = dict(
        zip(table["run"], zip(table["time"], table["time_source"], strict=True), strict=True)
    )
    assert times == {
        "seconds": ("2026-11-30T06:37:49.000", "log"),
        "micro": ("2026-11-30T06:33:53.598", "log"),
        "offset": ("2026-11-30T07:33:53.598+01:00", "log"),
        "utc": ("2026-11-30T06:33:53.000Z", "log"),
        "events": ("2026-11-30T06:39:59.000", "log"),
        "file": ("2026-11-18T11:06:40.250Z", "file"),
        "garbled": ("2026-11-18T11:06:40.000Z", "file"),
    }
