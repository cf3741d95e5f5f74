"""The memory account in every report: the same rows in the terminal summary, Markdown, HTML and
JSON, taken from the account (never a string of today's output), none without a GPU OOM, and
hostile text in its sources escaped like every other input's.  A fix's predicted peak and
arguments are shown wherever the fix is."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from oomlens.facts.account import MemoryAccount, Term, TermBasis
from oomlens.facts.context import Certainty, ContextKey
from oomlens.render import words
from oomlens.render.registry import Format, RenderOptions, render
from oomlens.report import SCHEMA_VERSION, Report
from oomlens.session import analyze
from oomlens.units import format_size
from tests._corpus import case_dir
from tests.render._hostile import XSS_PAYLOADS

# Cases from different sources and phases: a DDP forward pass with a snapshot (activations), a
# generate() call (KV cache), a Lightning DeepSpeed strategy dying in its set-up (no state size
# known), a card shared with another process (not a per-process cap).
CASES = ("activation_memory", "generation_oom", "lightning_deepspeed_states", "other_process")
NO_OOM = "activation_memory_fixed"
OUTSIDE_NEEDED = {Term.CACHED_UNUSED.value, Term.NON_PYTORCH.value, Term.OTHER_PROCESSES.value}
"""Terms that are not the live tensors or the request: what ``needed`` leaves out."""


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {name: analyze([case_dir(name)]) for name in (*CASES, NO_OOM)}


def _account(report: Report) -> MemoryAccount:
    assert report.facts.account is not None
    return report.facts.account


def _section(html: str) -> str:
    found = re.search(r'<section id="account">.*?</section>', html, re.DOTALL)
    assert found is not None
    return found.group()


def _markdown_section(markdown: str) -> str:
    return markdown.split("## Memory account", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("case", CASES)
def test_the_json_account_adds_up_to_what_was_needed(reports: dict[str, Report], case: str) -> None:
    data = json.loads(render(reports[case], Format.JSON, RenderOptions()))
    assert data["schema_version"] == SCHEMA_VERSION == "1.1"
    account = data["account"]
    assert set(account) == {
        "rank",
        "device",
        "phase",
        "limit",
        "limit_source",
        "limit_is_cap",
        "needed",
        "terms",
        "states_at_peak",
    }
    live_and_request = [t for t in account["terms"] if t["term"] not in OUTSIDE_NEEDED]
    assert sum(t["bytes"] for t in live_and_request) == account["needed"]
    peak = [account["states_at_peak"]] if account["states_at_peak"] is not None else []
    for term in [*account["terms"], *peak]:
        assert term["term"] in {t.value for t in Term}
        assert term["basis"] in {b.value for b in TermBasis}
        assert term["source"]
        if term["low"] is not None:
            assert term["low"] <= term["bytes"] <= term["high"]
    # the limit and the request are the first OOM's, as the same document lists it
    event = reports[case].facts.first_gpu_oom()
    assert event is not None
    first = next(e for e in data["oom_events"] if e["line"] == event.source.line)
    assert account["limit"] == (first["allowed"] or first["total_capacity"])
    assert account["limit_is_cap"] is (first["allowed"] is not None)
    request = next(t for t in account["terms"] if t["term"] == Term.REQUEST.value)
    assert request["bytes"] == first["tried_to_allocate"]


def test_the_json_context_gives_each_value_its_certainty_and_source(
    reports: dict[str, Report],
) -> None:
    report = reports["activation_memory"]
    context = json.loads(render(report, Format.JSON, RenderOptions()))["context"]
    assert set(context) == {value.key.value for value in report.facts.context}
    for key, value in context.items():
        assert ContextKey(key)
        assert set(value) == {"value", "certainty", "origin", "source", "text"}
        assert Certainty(value["certainty"])
        assert value["value"] == report.facts.context.values[ContextKey(key)].value
    known = report.facts.context.get(ContextKey.MICRO_BATCH)
    assert known is not None and known.source is not None
    assert context["micro_batch"]["source"]["line"] == known.source.line


@pytest.mark.parametrize("case", CASES)
def test_the_summary_shows_the_account_after_the_diagnoses(
    reports: dict[str, Report], case: str
) -> None:
    report = reports[case]
    account = _account(report)
    text = render(report, Format.TEXT, RenderOptions())
    assert "Memory account" in text
    head, section = text.split("Memory account", 1)
    assert "1. " + report.diagnoses[0].title in head  # after the diagnoses
    section = section.split("\n\n", 1)[0]
    assert account.limit is not None and format_size(account.limit) in section.splitlines()[0]
    assert account.needed is not None and format_size(account.needed) in section.splitlines()[0]
    rows = section.splitlines()[1:]
    shown = [*account.terms, *([account.states_at_peak] if _peak_shown(account) else [])]
    assert len(rows) == len(shown)  # compact: one line a term at width 0
    for row, term in zip(rows, shown, strict=True):
        assert words.term(term.term) in row and format_size(term.bytes) in row


def test_every_term_and_basis_has_its_words() -> None:
    assert set(words.TERM_WORDS) == set(Term)
    assert set(words.TERM_BASIS_WORDS) == set(TermBasis)


def _peak_shown(account: MemoryAccount) -> bool:
    peak = account.states_at_peak
    return peak is not None and peak != account.term(Term.MODEL_STATES)


@pytest.mark.parametrize("case", CASES)
def test_markdown_and_html_tables_have_a_row_per_term(
    reports: dict[str, Report], case: str
) -> None:
    report = reports[case]
    account = _account(report)
    shown = [*account.terms, *([account.states_at_peak] if _peak_shown(account) else [])]
    markdown = _markdown_section(render(report, Format.MARKDOWN, RenderOptions()))
    md_rows = [line for line in markdown.splitlines() if line.startswith("| ")][1:]
    html = _section(render(report, Format.HTML, RenderOptions()))
    html_rows = re.findall(r"<tr><td>.*?</tr>", html)
    assert len(md_rows) == len(html_rows) == len(shown)
    for md_row, html_row, term in zip(md_rows, html_rows, shown, strict=True):
        size = format_size(term.bytes)
        assert f"| {size} |" in md_row and f'<td class="num-col">{size}</td>' in html_row
    assert account.limit is not None
    assert format_size(account.limit) in markdown and format_size(account.limit) in html


def test_a_run_without_an_oom_has_no_account(reports: dict[str, Report]) -> None:
    report = reports[NO_OOM]
    assert report.verdict.value == "no_failure" and report.facts.account is None
    assert json.loads(render(report, Format.JSON, RenderOptions()))["account"] is None
    assert "Memory account" not in render(report, Format.TEXT, RenderOptions())
    assert "Memory account" not in render(report, Format.MARKDOWN, RenderOptions())
    html = render(report, Format.HTML, RenderOptions())
    assert 'id="account"' not in html and 'href="#account"' not in html


def test_a_fix_shows_its_predicted_peak_and_arguments_in_every_format(
    reports: dict[str, Report],
) -> None:
    """The arguments are shown once: as the command where the fix has one (it says the same
    flags in the reader's words), as an arguments block where it has none; JSON has both."""
    report = reports["activation_memory"]
    fix = next(f for d in report.diagnoses for f in d.fixes if f.arguments)
    assert fix.predicted_peak_bytes is not None and fix.command is not None
    peak = format_size(fix.predicted_peak_bytes)
    line = words.arguments(fix.arguments)
    assert all(flag in line and value in line for flag, value in fix.arguments.items())
    assert all(
        flag in fix.command and value in fix.command for flag, value in fix.arguments.items()
    )
    text = render(report, Format.TEXT, RenderOptions())
    assert f"command: {fix.command}" in text and f"predicted peak {peak}" in text
    assert f"arguments: {line}" not in text
    markdown = render(report, Format.MARKDOWN, RenderOptions())
    assert f"**Predicted peak {peak}.**" in markdown and f"```sh\n{line}\n```" not in markdown
    html = render(report, Format.HTML, RenderOptions())
    assert f"Predicted peak {peak}." in html and not re.search(
        r'-args"><code>' + re.escape(line) + "</code>", html
    )
    data = json.loads(render(report, Format.JSON, RenderOptions()))
    shown = [f for d in data["diagnoses"] for f in d["fix"] if f["arguments"]]
    assert shown[0]["arguments"] == dict(fix.arguments)
    assert shown[0]["predicted_peak_bytes"] == fix.predicted_peak_bytes
    # a fix with arguments and no command shows them as its arguments block
    bare = dataclasses.replace(fix, command=None)
    view_text = render(
        dataclasses.replace(
            report,
            diagnoses=(dataclasses.replace(report.diagnoses[0], fixes=(bare,)),),
        ),
        Format.TEXT,
        RenderOptions(),
    )
    assert f"arguments: {line}" in view_text


# Folder names (no "/") from the classic vectors, one with a right-to-left override in front:
# the account cites the log and the snapshot by their paths.
_FOLDER_PAYLOADS = [p for p in XSS_PAYLOADS if "/" not in p and len(p.encode()) < 200][:3]
_FOLDER_PAYLOADS.append("\u202e" + _FOLDER_PAYLOADS[0].replace("XSS", "RLO"))


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, str]:
    folder = tmp_path_factory.mktemp("hostile")
    for payload in _FOLDER_PAYLOADS:
        folder = folder / payload
    folder.mkdir(parents=True)
    source = case_dir("activation_memory")
    for name in ("train.log", "snapshot_rank1.pickle"):
        shutil.copyfile(source / name, folder / name)
    return analyze([folder]), str(folder)


def test_hostile_text_in_an_account_source_is_escaped(
    hostile_report: tuple[Report, str],
) -> None:
    report, folder = hostile_report
    account = _account(report)
    assert any(_FOLDER_PAYLOADS[0] in t.source for t in account.terms)  # the input's own text
    html = _section(render(report, Format.HTML, RenderOptions()))
    assert "<img" not in html and "<svg" not in html and "<script" not in html
    assert "&lt;" in html and "\u202e" not in html
    markdown = _markdown_section(render(report, Format.MARKDOWN, RenderOptions()))
    assert not re.search(r"(?<!\\)<", markdown) and "\u202e" not in markdown
    for fmt in (Format.TEXT, Format.JSON):
        shown = render(report, fmt, RenderOptions())
        assert "\u202e" not in shown, fmt
    data = json.loads(render(report, Format.JSON, RenderOptions()))
    sources = [t["source"] for t in data["account"]["terms"]]
    assert any(Path(folder).name.replace("\u202e", "") in s for s in sources)
