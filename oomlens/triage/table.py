"""The triage table: one row per run, built from each run's versioned report JSON.

Rows are built from ``report_to_dict``'s stable schema, never from the analysis' internals,
so a stored report keeps making the same row.  Where a run is and when it last wrote come from
the walk, not from the stored report, so a moved archive shows its new paths.

Runs are *grouped* when they failed the same way: same verdict, same top diagnosis, and the
same config knob the fix changes (else the same failing call site).  "37 runs died of the same
prefetch setting" is one group.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas
import regex

from oomlens.triage import cells
from oomlens.triage.store import StoredResult
from oomlens.triage.walk import RunSpec
from oomlens.untrusted import escape_controls, one_line

COLUMNS: dict[str, str] = {
    "run": "string",
    "path": "string",
    "time": "string",
    "time_source": "string",
    "verdict": "string",
    "diagnosis": "string",
    "title": "string",
    "confidence": "Float64",
    "summary": "string",
    "first_failed_rank": "Int64",
    "failed_ranks": "string",
    "phase": "string",
    "tried_to_allocate": "Int64",
    "allocated_by_pytorch": "Int64",
    "reserved_unallocated": "Int64",
    "capacity": "Int64",
    "free": "Int64",
    "knob": "string",
    "call_site": "string",
    "group": "string",
    "figures": "string",
    "problems": "Int64",
    "report": "string",
    "error": "string",
}
"""Column name -> pandas dtype.  ``time`` is when the run failed, as its own log says (the first
failed rank's first failure, else its first OOM message, in the log's clock), else the newest
modification time among the run's files (UTC); ``time_source`` says which (``log`` or ``file``).
Either is ISO 8601 to the millisecond with the zone when one is known (``format_time``):
``2026-11-30T06:59:01.123Z`` (UTC), ``2026-11-30T06:59:01.123+01:00`` (a log that printed its
offset), ``2026-11-30T06:59:01.123`` (a log that printed none: no zone is made up).  ``run``,
``path`` and ``report`` are exactly as the file system spells them (``EXACT_COLUMNS``); every
other text cell is one line without control or bidi characters.  Byte counts are bytes.
``capacity`` is what the process was allowed (the ``allowed`` clause when torch printed one, else
the card's total) and ``free`` what was left of that capacity (under a limit: the limit less
what PyTorch had reserved, not the card's free memory), so ``free <= capacity``.
``figures`` is the top diagnosis' named numbers as a JSON object.  ``report`` is the path of
the run's HTML report, ``error`` why the run could not be analyzed."""

EXACT_COLUMNS = ("run", "path", "report")
"""The columns that name a file or directory and so are kept exactly, control characters and
undecodable bytes (``os.fsdecode``'s lone surrogates) included: they say which run a row is, and
two directories whose names differ only by a tab are two runs.  Each output writes them in a way
it can read back (CSV escapes them); whatever displays them escapes them (``untrusted.shown``)."""

VERDICT_ORDER = ("gpu_oom", "host_oom", "config_error", "other_failure", "unknown", "no_failure")
"""Worst first, for summaries."""


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run and its stored result, the two halves of one row."""

    run: RunSpec
    result: StoredResult


def build_table(rows: Sequence[RunRow]) -> pandas.DataFrame:
    """The table of ``rows``, newest first (ties: by run name, then path)."""
    records = [_record(row) for row in rows]
    return normalize(pandas.DataFrame.from_records(records, columns=list(COLUMNS)))


def normalize(frame: pandas.DataFrame, *, untrusted: bool = False) -> pandas.DataFrame:
    """``frame`` with exactly ``COLUMNS`` in their dtypes, sorted, indexed 0..n-1.

    Used on tables read back from any output format, so that they compare equal.  Every cell
    becomes its column's type (``cells``: an object or a list in a text column as JSON, a
    number past int64 missing); with ``untrusted`` (a table read back, maybe made by hand),
    the text cells but the exact ones become one line without control characters, as oomlens
    writes them.  Raises ``KeyError`` naming a missing column, ``ValueError`` naming the
    column and row of a cell that is no number where one must be.
    """
    missing = [name for name in COLUMNS if name not in frame.columns]
    if missing:
        raise KeyError(", ".join(missing))
    frame = frame[list(COLUMNS)].copy()
    for name, dtype in COLUMNS.items():
        column = frame[name].astype("object")
        if dtype == "string":
            one_line_only = untrusted and name not in EXACT_COLUMNS
            frame[name] = pandas.array(
                [cells.text(value, one_line_only=one_line_only) for value in column],
                dtype="string",
            )
        elif dtype == "Int64":
            frame[name] = pandas.array(
                [cells.integer(value, name, row) for row, value in enumerate(column)],
                dtype="Int64",
            )
        else:
            frame[name] = pandas.array(
                [cells.decimal(value, name, row) for row, value in enumerate(column)],
                dtype="Float64",
            )
    frame = frame.sort_values(
        ["time", "run", "path"], ascending=[False, True, True], na_position="last", kind="stable"
    )
    return frame.reset_index(drop=True)


def _record(row: RunRow) -> dict[str, Any]:
    run, result = row.run, row.result
    record: dict[str, Any] = dict.fromkeys(COLUMNS)
    record["run"] = run.name
    record["path"] = run.path
    record["time"] = format_time(
        datetime.datetime.fromtimestamp(run.mtime_ns / 1e9, tz=datetime.UTC)
    )
    record["time_source"] = "file"
    record["report"] = result.report_file
    record["error"] = result.error
    report = result.report
    if report is None:
        record["verdict"] = "unknown"
        record["group"] = group_label("unknown", None, None, None)
    else:
        record.update(summarize_report(report))
        logged = _failure_time(report)
        if logged is not None:
            record["time"], record["time_source"] = logged, "log"
        record["group"] = group_label(
            record["verdict"], record["diagnosis"], record["knob"], record["call_site"]
        )
    return {
        name: (_exact(value) if name in EXACT_COLUMNS else one_line(value))
        if isinstance(value, str)
        else value
        for name, value in record.items()
    }


def _exact(name: str) -> str:
    """A file's name as the table holds it: exactly, unless it has bytes that are not UTF-8
    (``os.fsdecode``'s lone surrogates), which no table column can hold: then in
    ``escape_controls``' form, ``\\udcff`` for the byte 0xff."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return escape_controls(name)
    return name


def _failure_time(report: Mapping[str, Any]) -> str | None:
    """When the run failed by its own log (``format_time``): the first failed rank's first
    failure, else the earliest OOM message with a time stamp."""
    ranks = report.get("ranks")
    ranks = ranks if isinstance(ranks, Mapping) else {}
    first = _integer(ranks.get("first_failed"))
    for status in _list(ranks.get("ranks")):
        if isinstance(status, Mapping) and first is not None and status.get("rank") == first:
            moment = _log_time(status.get("first_time"))
            if moment:
                return moment
    stamps = [
        stamp
        for event in _list(report.get("oom_events"))
        if isinstance(event, Mapping) and (stamp := _log_time(event.get("timestamp")))
    ]
    return min(stamps) if stamps else None


def format_time(moment: datetime.datetime) -> str:
    """``moment`` as the table's ``time``: ISO 8601 to the millisecond, ``Z`` for UTC, the
    offset for another zone, nothing for a time without a zone.  One width per kind of zone, so
    that the text sorts as the times do."""
    text = moment.isoformat(timespec="milliseconds")
    return text[: -len("+00:00")] + "Z" if text.endswith("+00:00") else text


def _log_time(value: object) -> str | None:
    """A report's time stamp (``datetime.isoformat``: seconds or microseconds, with an offset
    when the log printed one) in the table's form; None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        return format_time(datetime.datetime.fromisoformat(value))
    except ValueError:
        return None


def summarize_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The row fields that come from one report's JSON dict (missing parts become None)."""
    out: dict[str, Any] = {}
    out["verdict"] = _text(report.get("verdict")) or "unknown"
    diagnoses = [d for d in _list(report.get("diagnoses")) if isinstance(d, Mapping)]
    top = diagnoses[0] if diagnoses else {}
    out["diagnosis"] = _text(top.get("id"))
    out["title"] = _text(top.get("title"))
    out["confidence"] = _number(top.get("confidence"))
    out["summary"] = _text(top.get("summary"))
    figures = top.get("figures")
    out["figures"] = (
        json.dumps(figures, sort_keys=True, default=str) if isinstance(figures, Mapping) else None
    )
    ranks = report.get("ranks")
    ranks = ranks if isinstance(ranks, Mapping) else {}
    out["first_failed_rank"] = _integer(ranks.get("first_failed"))
    failed = {
        r["rank"]
        for r in _list(ranks.get("ranks"))
        if isinstance(r, Mapping)
        and r.get("own_failure") is True
        and _integer(r.get("rank")) is not None
    }
    out["failed_ranks"] = ",".join(str(r) for r in sorted(failed)) or None
    event = _first_event(report, out["first_failed_rank"])
    out["phase"] = _text(event.get("phase"))
    out["tried_to_allocate"] = _integer(event.get("tried_to_allocate"))
    out["allocated_by_pytorch"] = _integer(event.get("allocated_by_pytorch"))
    out["reserved_unallocated"] = _integer(event.get("reserved_unallocated"))
    out["capacity"], out["free"] = _capacity_and_free(event)
    out["knob"] = _knob(top)
    out["call_site"] = _call_site(_culprit_site(top) or _text(event.get("phase_evidence")))
    out["problems"] = sum(
        1 for i in _list(report.get("inputs")) if isinstance(i, Mapping) and i.get("problem")
    )
    return out


def _capacity_and_free(event: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """What the process could use and how much of it was left, of one kind.

    torch's message says how much of the *card* is free (``free`` of ``total_capacity``,
    other processes counted).  Under a memory-fraction limit (its ``allowed`` clause) the
    card's free memory can be far more than the whole limit; what the allocator could still
    take is the limit less what it had reserved (allocated + reserved but unallocated), as
    torch refuses a request that takes reserved memory over the limit.  Without the two
    figures that room is unknown: None, never the card's free beside the limit."""
    allowed = _integer(event.get("allowed"))
    if allowed is None:
        return _integer(event.get("total_capacity")), _integer(event.get("free"))
    allocated = _integer(event.get("allocated_by_pytorch"))
    unallocated = _integer(event.get("reserved_unallocated"))
    if allocated is None or unallocated is None:
        return allowed, None
    return allowed, max(0, allowed - allocated - unallocated)


def _culprit_site(diagnosis: Mapping[str, Any]) -> str | None:
    """For a leak, the call site where memory piled up (the failing allocation is usually an
    innocent bystander): runs that leak from the same line group together."""
    if diagnosis.get("id") != "memory_leak":
        return None
    figures = diagnosis.get("figures")
    if not isinstance(figures, Mapping):
        return None
    return _text(figures.get("growth_site")) or _text(figures.get("piled_site"))


def group_label(
    verdict: str, diagnosis: str | None, knob: str | None, call_site: str | None
) -> str:
    """What the runs of one group share, in words: ``gpu_oom/prefetch_overshoot @ knob``."""
    label = f"{verdict}/{diagnosis}" if diagnosis else verdict
    where = knob or call_site
    return f"{label} @ {where}" if where else label


def group_id(label: str) -> str:
    """A short stable id for a group label (for anchors and file names)."""
    return hashlib.sha256(label.encode()).hexdigest()[:10]


def _first_event(report: Mapping[str, Any], rank: int | None) -> Mapping[str, Any]:
    events = [e for e in _list(report.get("oom_events")) if isinstance(e, Mapping)]
    for event in events:
        if rank is not None and event.get("rank") == rank:
            return event
    return events[0] if events else {}


def _knob(diagnosis: Mapping[str, Any]) -> str | None:
    """The config settings the diagnosis' first fix changes, as dotted keys.

    The keys, not the values: runs that died of the same prefetch setting group together
    whether it was raised to 1e10 or 5e9.  Environment variables are left out: they are
    remedies (``expandable_segments``), not what the runs had in common.
    """
    fixes = [f for f in _list(diagnosis.get("fix")) if isinstance(f, Mapping)]
    for fix in fixes[:1]:
        patch = fix.get("config_patch")
        if isinstance(patch, Mapping) and patch:
            return ", ".join(_flatten_keys(patch, ""))
    return None


def _flatten_keys(patch: Mapping[str, Any], prefix: str) -> list[str]:
    keys: list[str] = []
    for name, value in sorted(patch.items()):
        if isinstance(value, Mapping) and value:
            keys.extend(_flatten_keys(value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


_INSTALLED = regex.compile(r"^.{0,4096}?/(?:site|dist)-packages/")


def _call_site(frame: str | None) -> str | None:
    """``.../site-packages/torch/optim/adam.py:791 in f`` -> ``torch/optim/adam.py:791 in f``:
    the same library frame groups together whichever environment it was installed in."""
    if frame is None:
        return None
    return str(_INSTALLED.sub("", frame, count=1, timeout=1.0))


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _integer(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
