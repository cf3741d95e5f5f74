"""``oomlens whatif``'s report (``WhatIfReport``): the JSON renderer's half and the text
renderer's half for it (docs/whatif.md); picked through ``oomlens.render.registry`` like
every other document.

``whatif_to_dict`` is the JSON contract (``schema_version`` 1.0; keys are only ever added):
sizes in bytes, event indices into the device's trace (``-1``: before its first event).
``whatif_text`` is the terminal table.  Both strip control and bidi characters from what the
snapshot supplies (its path, the recorded setting's text).
"""

from __future__ import annotations

from typing import Any

from oomlens.facts.whatif import (
    COVERS_UP_TO_OOM,
    MemoryLimit,
    Prediction,
    ReplayResult,
    SelfCheck,
    TraceCoverage,
)
from oomlens.render.wrap import Wrapped
from oomlens.report import WhatIfReport
from oomlens.units import format_size
from oomlens.untrusted import strip_controls

WHATIF_SCHEMA_VERSION = "1.0"


def _self_check(check: SelfCheck) -> dict[str, Any]:
    return {
        "passed": check.passed,
        "segment_events": check.segment_events,
        "segment_events_matched": check.segment_events_matched,
        "reserved_checks": check.reserved_checks,
        "reserved_matched": check.reserved_matched,
        "allocations": check.allocations,
        "addresses_matched": check.addresses_matched,
        "recorded_ooms": list(check.recorded_ooms),
        "replayed_ooms": list(check.replayed_ooms),
        "first_mismatch": check.first_mismatch,
    }


def _limit(limit: MemoryLimit) -> dict[str, Any]:
    return {
        "allowed_bytes": limit.bytes,
        "limit_source": limit.source,
        "limit_uncertainty_bytes": limit.uncertainty,
    }


def _result(result: ReplayResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome,
        "oom_event_index": result.oom_event_index,
        "oom_request_bytes": result.oom_request_bytes,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "peak_allocated_bytes": result.peak_allocated_bytes,
        "reserved_at_start_bytes": result.reserved_at_start_bytes,
        "reserved_unallocated_at_recorded_oom_bytes": (
            result.reserved_unallocated_at_recorded_oom_bytes
        ),
        "headroom_bytes": result.headroom_bytes,
        "shortfall_bytes": result.shortfall_bytes,
        "live_too_large": result.live_too_large,
    }


def _coverage(coverage: TraceCoverage) -> dict[str, Any]:
    return {
        "entries": coverage.entries,
        "from_process_start": coverage.from_process_start,
        "reserved_at_start_bytes": coverage.reserved_at_start,
        "live_at_start_bytes": coverage.live_at_start,
        "live_blocks_at_start": coverage.live_blocks_at_start,
        "inferred_block_sizes": coverage.inferred_block_sizes,
        "unplaced_blocks": coverage.unplaced_blocks,
        "ends_at_oom": coverage.ends_at_oom,
    }


def _prediction(prediction: Prediction, check: SelfCheck) -> dict[str, Any]:
    packed = prediction.packed_start
    return {
        "alloc_conf": prediction.alloc_conf,
        "baseline": prediction.baseline,
        **_limit(prediction.limit),
        **_result(prediction.result),
        "covers": prediction.covers,
        "conclusive": prediction.conclusive,
        "packed_start": None
        if packed is None
        else {
            "outcome": packed.outcome,
            "oom_event_index": packed.oom_event_index,
            "peak_reserved_bytes": packed.peak_reserved_bytes,
            "headroom_bytes": packed.headroom_bytes,
        },
        "notes": list(prediction.notes),
        "self_check": _self_check(check),
    }


def whatif_to_dict(report: WhatIfReport) -> dict[str, Any]:
    """The JSON document of one what-if run (strings not yet stripped: the JSON renderer
    strips every string it writes)."""
    whatif = report.whatif
    return {
        "schema_version": WHATIF_SCHEMA_VERSION,
        "oomlens_version": report.oomlens_version,
        "snapshot": whatif.source.path,
        "device": whatif.device,
        "recorded": {
            "alloc_conf": whatif.recorded_alloc_conf,
            "notes": list(whatif.recorded_notes),
            **_limit(whatif.recorded_limit),
            **_result(whatif.recorded),
            "trace": _coverage(whatif.coverage),
            "self_check": _self_check(whatif.self_check),
        },
        "predictions": [
            _prediction(prediction, whatif.self_check) for prediction in whatif.predictions
        ],
    }


# ---------------------------------------------------------------------------------- text


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _event(index: int | None) -> str:
    if index is None:
        return "-"
    return "before the trace" if index < 0 else f"event {index}"


_LITTLE_ROOM = 256 * 2**20
"""Less room than this left at the end of a recording that stops at its OOM is said to be
little: a training step allocates far more than that."""


def describe_limit(limit: MemoryLimit) -> str:
    if limit.bytes is None:
        return "no limit known (the recording never hit one; pass --allowed)"
    if limit.source == "--allowed":
        return f"{format_size(limit.bytes)} (--allowed)"
    if limit.source == "capacity":
        return f"{format_size(limit.bytes)} (the device's capacity: reserved + free at the OOM)"
    return (
        f"{format_size(limit.bytes)} allowed (a memory fraction, inferred from the trace, "
        f"+-{format_size(limit.uncertainty)})"
    )


def describe_outcome(
    result: ReplayResult, covers: str | None = None, limit: MemoryLimit | None = None
) -> str:
    """``fits with 1.30 GiB to spare`` / ``OOM at event 1499 (a 40.69 MiB request)``."""
    if result.outcome == "fits":
        text = "fits"
        if result.headroom_bytes is not None:
            text += f" with {format_size(result.headroom_bytes)} to spare"
        if covers == COVERS_UP_TO_OOM:
            text += " (up to the recorded OOM)"
        return text
    text = f"OOM at {_event(result.oom_event_index)}"
    if result.oom_request_bytes is not None:
        text += f" ({format_size(result.oom_request_bytes)} request)"
    if result.live_too_large:
        alone = (
            result.oom_request_bytes is not None
            and limit is not None
            and limit.bytes is not None
            and result.oom_request_bytes > limit.bytes
        )
        text += (
            ": the request alone is larger than the limit"
            if alone
            else ": the memory in use itself is too large"
        )
    return text


def _check_line(check: SelfCheck) -> str:
    figures = (
        f"{check.segment_events_matched}/{check.segment_events} segment events, "
        f"{check.addresses_matched}/{check.allocations} block addresses, "
        f"{check.reserved_matched}/{check.reserved_checks} reserved totals, "
        f"OOMs at {list(check.replayed_ooms)} vs recorded {list(check.recorded_ooms)}"
    )
    if check.passed:
        return f"self-check: passed ({figures})"
    return f"self-check: FAILED ({figures}); first difference: {check.first_mismatch}"


def whatif_text(report: WhatIfReport, width: int = 0) -> str:
    """The terminal summary: the recording, the self-check, one row per setting; ``width`` >
    0 wraps it to that many columns (``wrap.wrap``: a hanging indent under each item's text),
    the table becoming one item per setting when it is wider."""
    whatif = report.whatif
    coverage = whatif.coverage
    recorded = whatif.recorded
    lines = [
        f"oomlens whatif: {whatif.source.path}, device {whatif.device}",
        f"recorded setting: {whatif.recorded_alloc_conf or 'torch defaults'}; limit "
        + describe_limit(whatif.recorded_limit),
        f"  {describe_outcome(recorded, limit=whatif.recorded_limit)}; "
        f"peak reserved {_size(recorded.peak_reserved_bytes)}, "
        f"peak allocated {_size(recorded.peak_allocated_bytes)}"
        + (
            f"; {_size(recorded.reserved_unallocated_at_recorded_oom_bytes)} reserved but "
            "unallocated at the OOM"
            if coverage.ends_at_oom
            else ""
        ),
    ]
    if coverage.from_process_start:
        lines.append(f"  trace: {coverage.entries} events from the process start (the whole run)")
    else:
        lines.append(
            f"  trace: {coverage.entries} events from mid-run: {_size(coverage.reserved_at_start)}"
            f" reserved and {_size(coverage.live_at_start)} in use "
            f"({coverage.live_blocks_at_start} blocks) at its start, laid out as the recording "
            "shows; predictions also try them allocated afresh"
        )
    lines.extend(f"  note: {note}" for note in whatif.recorded_notes)
    lines.append("  " + _check_line(whatif.self_check))
    lines.append("")
    rows = [("setting", "outcome", "peak reserved", "peak allocated", "forecast")]
    for prediction in whatif.predictions:
        result = prediction.result
        name = prediction.alloc_conf or "torch defaults"
        if prediction.baseline:
            name += " (as recorded)"
        rows.append(
            (
                name,
                describe_outcome(result, prediction.covers, prediction.limit),
                _size(result.peak_reserved_bytes),
                _size(result.peak_allocated_bytes),
                "(the recording)"
                if prediction.baseline and prediction.limit == whatif.recorded_limit
                else "yes"
                if prediction.conclusive
                else "no",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    table = [
        "  ".join(cell.ljust(size) for cell, size in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if not width or max(len(row) for row in table) <= width:
        lines.extend(table)
    else:
        # too wide for the terminal: one item per setting, each wrapped, not a cut table
        heads = rows[0][2:]
        lines.extend(
            f"- {row[0]}: {row[1]}; "
            + ", ".join(f"{head} {cell}" for head, cell in zip(heads, row[2:], strict=True))
            for row in rows[1:]
        )
    past_oom = [
        p
        for p in whatif.predictions
        if p.result.outcome == "fits" and p.covers == COVERS_UP_TO_OOM and not p.baseline
    ]
    if past_oom:
        least = min((p.result.headroom_bytes or 0) for p in past_oom)
        lines.append("")
        lines.append(
            "fits (up to the recorded OOM): the request that failed would have been served; "
            "the recording ends there, so whether the rest of the run fits is not known"
            + (
                f" (the least room left was {format_size(least)}: the next step's allocations "
                "may not fit)"
                if least < _LITTLE_ROOM
                else ""
            )
        )
    limits = {prediction.limit for prediction in whatif.predictions}
    if limits and limits != {whatif.recorded_limit}:
        lines.extend(f"limit replayed: {describe_limit(limit)}" for limit in limits)
    notes = [
        f"  {prediction.alloc_conf or 'torch defaults'}: {note}"
        for prediction in whatif.predictions
        for note in prediction.notes
    ]
    if notes:
        lines.append("")
        lines.append("not a forecast where:")
        lines.extend(notes)
    out = Wrapped(width)
    for line in lines:
        text = strip_controls(line)
        indent = len(text) - len(text.lstrip(" "))
        out.add(text, hang=indent + (4 if text.lstrip().startswith("- ") else 2))
    return out.text() + "\n"
