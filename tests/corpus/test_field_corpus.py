"""oomlens on the field corpus (``fixtures/field_logs``): what users pasted into public threads,
with the cause each thread established.

Every labelled case's top diagnosis is its label or an accepted alternative, and its verdict the
thread's, except the cases listed in ``known_misses.json``: each with why oomlens misses it,
whether the paste alone could decide it, and what oomlens answers instead (its top diagnosis
and verdict, held here as listed).  A known miss still must not crash, must not call a
crash ``no_failure``, and must not be a confident wrong answer (top confidence below 0.6).  The
list is kept honest both ways: a listed case that oomlens now gets right fails here until it is
taken off the list.  Unlabelled cases are kept for reading: they must not crash either.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from oomlens.errors import OomlensError
from oomlens.report import Report
from oomlens.session import analyze

FIELD = Path(__file__).resolve().parents[2] / "fixtures" / "field_logs"
CONFIDENT = 0.6
"""A wrong answer at or above this confidence is the worst outcome: none is allowed."""

pytestmark = pytest.mark.skipif(not FIELD.is_dir(), reason="field corpus not present")


def _cases() -> list[str]:
    return sorted(p.name for p in FIELD.iterdir() if (p / "case.json").is_file())


def _manifest(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIELD / case / "case.json").read_text())
    return data


def _labelled() -> list[str]:
    return [c for c in _cases() if _manifest(c)["label"]["diagnosis"] not in (None, "unknown")]


@cache
def _known_misses() -> dict[str, dict[str, Any]]:
    data = json.loads((FIELD / "known_misses.json").read_text())
    return {entry["id"]: entry for entry in data["misses"]}


def _analyze(case: str) -> Report:
    manifest = _manifest(case)
    files = manifest.get("files") or {}
    inputs = [FIELD / case / files.get("paste", "paste.txt")]
    if files.get("config") and (FIELD / case / files["config"]).is_file():
        inputs.append(FIELD / case / files["config"])
    return analyze(inputs)


def _top_leads_with_support(report: Report) -> bool:
    """The top cause's first (main) evidence is for it: a cause whose own main evidence is
    marked against it is never the answer a user reads first."""
    top = report.top
    return top is None or not top.evidence or top.evidence[0].supports


def _accepted(case: str) -> set[str]:
    label = _manifest(case)["label"]
    return {label["diagnosis"], *(label.get("accepted") or [])}


def test_every_known_miss_is_a_labelled_case_with_a_reason_and_a_verdict_on_the_paste() -> None:
    labelled = set(_labelled())
    split = json.loads((FIELD / "split.json").read_text())
    split2 = json.loads((FIELD / "split2.json").read_text())
    where = {
        **dict.fromkeys(split["test"], "test"),
        **dict.fromkeys(split["dev"], "dev"),
        **dict.fromkeys(split2["test"], "test2"),
        **dict.fromkeys(split2["dev"], "dev2"),
    }
    for case, entry in _known_misses().items():
        assert case in labelled, case
        assert entry["split"] == where.get(case), case
        assert entry["miss"] in ("diagnosis", "verdict", "both"), case
        assert isinstance(entry["paste_decides"], bool), case
        assert len(entry["reason"]) > 20, case


@pytest.mark.parametrize("case", _labelled())
def test_the_top_diagnosis_and_verdict_are_the_threads(case: str) -> None:
    report = _analyze(case)
    assert _top_leads_with_support(report), report.top
    label = _manifest(case)["label"]
    top = report.top
    diagnosis_ok = top is not None and top.id in _accepted(case)
    verdict_ok = report.verdict.value == label["verdict"]
    known = _known_misses().get(case)
    if known is None:
        assert diagnosis_ok, [(d.id, round(d.confidence, 2)) for d in report.diagnoses]
        assert verdict_ok, (report.verdict.value, report.verdict_reason)
        return
    # a known miss: still a miss of the kind listed (else take it off the list)...
    expected = {
        "diagnosis": (False, True),
        "verdict": (True, False),
        "both": (False, False),
    }[known["miss"]]
    assert (diagnosis_ok, verdict_ok) == expected, (
        f"{case} is listed as a {known['miss']} miss but now gives "
        f"{[d.id for d in report.diagnoses[:2]]} / {report.verdict.value}"
    )
    # ...the very answer listed (a changed answer is a change to review, not noise)...
    assert ((top.id if top else None), report.verdict.value) == (known["top"], known["verdict"])
    # ...and never a confident wrong answer, never "no failure" for a failure; a held-back
    # case of the second split is recorded, not tuned: its confident wrong answer is listed
    # (``confident_wrong``) and reported, and the list must say so both ways
    if not diagnosis_ok and top is not None:
        if known["split"] == "test2":
            assert (top.confidence >= CONFIDENT) == bool(known.get("confident_wrong")), (
                top.id,
                top.confidence,
            )
        else:
            assert top.confidence < CONFIDENT, (top.id, top.confidence)
    if label["verdict"] != "no_failure":
        assert report.verdict.value != "no_failure", report.verdict_reason


@pytest.mark.parametrize("case", [c for c in _cases() if c not in set(_labelled())])
def test_unlabelled_cases_are_read_without_crashing(case: str) -> None:
    try:
        report = _analyze(case)
    except OomlensError as exc:  # refused with one clear line is fine (exit 3)
        assert exc.exit_code == 3, exc.message
        return
    assert _top_leads_with_support(report), report.top
    assert report.verdict.value
