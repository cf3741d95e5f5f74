"""The JSON contract and the Markdown report, on the corpus and on hostile text."""

from __future__ import annotations

import json
import re

import pytest

from oomlens.render.json import report_to_dict
from oomlens.render.markdown import render_markdown
from oomlens.render.templates import md_code, md_inline
from oomlens.session import analyze
from tests._corpus import case_dir, case_names

DIAGNOSIS_KEYS = {
    "id",
    "title",
    "severity",
    "confidence",
    "summary",
    "evidence",
    "fix",
    "missing",
    "figures",
    "rank",
}
OOM_KEYS = {
    "rank",
    "device",
    "phase",
    "source",
    "line",
    "tried_to_allocate",
    "total_capacity",
    "free",
    "process_in_use",
    "allocated_by_pytorch",
    "reserved_unallocated",
    "allowed",
    "other_processes",
}


@pytest.mark.parametrize("name", case_names())
def test_json_has_the_documented_keys_and_round_trips(name: str) -> None:
    data = report_to_dict(analyze([case_dir(name)]))
    assert json.loads(json.dumps(data)) == data
    assert data["schema_version"] == "1.1"
    assert {"verdict", "diagnoses", "oom_events", "ranks", "inputs", "account", "context"} <= set(
        data
    )
    for diagnosis in data["diagnoses"]:
        assert DIAGNOSIS_KEYS <= set(diagnosis)
        assert 0 <= diagnosis["confidence"] <= 1
    for event in data["oom_events"]:
        assert OOM_KEYS <= set(event)


def test_json_oom_numbers_are_the_messages_bytes() -> None:
    data = report_to_dict(analyze([case_dir("fragmentation")]))
    event = data["oom_events"][0]
    assert event["tried_to_allocate"] == 42 * 1024**2
    assert event["allowed"] == round(6.5 * 1024**3)
    assert event["reserved_unallocated"] == round(3.02 * 1024**3)
    assert event["phase"] and event["line"] > 0


@pytest.mark.parametrize(
    "name", ["fragmentation", "prefetch_overshoot", "pinned_memory_exhaustion"]
)
def test_markdown_report_carries_the_cause_evidence_and_patch(name: str) -> None:
    report = analyze([case_dir(name)])
    text = render_markdown(report)
    assert text.startswith("# oomlens: ")
    assert f"(`{report.top.id}`)" in text
    assert "**Evidence**" in text and "**Fix**" in text
    assert "<script" not in text.lower()


HOSTILE = [
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "![x](http://evil/x.png)",
    "**bold** _it_ `code` | table |",
    "<img src=x onerror=alert(1)>",
    "line\nbreak # heading",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_md_inline_neutralises_markup(text: str) -> None:
    out = str(md_inline(text))
    assert "\n" not in out
    assert not re.search(r"(?<!\\)[<\[`*_|]", out), out


def test_md_code_fence_cannot_be_closed_from_inside() -> None:
    out = str(md_code("a ``` b ```` c", "sh"))
    fence = out.split("\n", 1)[0].rstrip("sh")
    assert len(fence) == 5
    assert out.endswith("\n" + fence)


def test_json_strings_carry_no_control_or_bidi_characters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a crash whose exception text carries a C1 CSI, an ESC sequence, a BEL and a
    # right-to-left override (text that would read backwards in a terminal)
    log = tmp_path / "train.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/home/u/train.py", line 7, in <module>\n'
        "    main()\n"
        "RuntimeError: CUDA error: device-side assert triggered \u202eevil\x9b31m\x1b[0m\x07\n"
    )
    # WHEN it is reported as JSON
    text = json.dumps(report_to_dict(analyze([str(log)])), ensure_ascii=False)
    # THEN the exception text is there, its controls are not
    assert "device-side assert triggered evil31m" in text
    for character in ("\x9b", "\u202e", "\x1b", "\x07"):
        assert character not in text
