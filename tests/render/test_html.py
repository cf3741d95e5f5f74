"""The HTML report and its Markdown twin on the real crash corpus, on hostile text and on huge
inputs, without a browser (``test_browser.py`` opens them in one)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from datetime import datetime
from html import unescape
from pathlib import Path

import pytest
from markupsafe import escape

from oomlens.diagnosis import Evidence, EvidenceKind
from oomlens.facts import SourceRef
from oomlens.facts.log import MemorySample
from oomlens.render.charts import MAX_POINTS, downsample
from oomlens.render.html import MAX_REPORT_BYTES, render_html
from oomlens.render.markdown import render_markdown
from oomlens.render.templates import template_dir
from oomlens.render.view import MAX_EVIDENCE, build_view
from oomlens.report import Report
from oomlens.rules.base import VERIFY_DEFAULT
from oomlens.rules.engine import INTERNAL_ERROR, RULES, docs
from oomlens.rules.uncertainty import INSUFFICIENT_EVIDENCE
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import case_dir, case_names, manifest
from tests.render._hostile import XSS_PAYLOADS, hostile_run
from tests.render._synthetic import huge_log

_ARTICLE = re.compile(r'<article class="diagnosis[^"]*" id="d(\d+)-([a-z_]+)">')
NON_RULE_IDS = ("insufficient_evidence", "internal_error")
SECTIONS = ("verdict", "diagnoses", "failure", "ranks", "memory", "config", "inputs", "missing")


@pytest.fixture(scope="module")
def corpus_reports() -> dict[str, Report]:
    return {name: analyze([case_dir(name)]) for name in case_names()}


# ------------------------------------------------------------------------------ templates


ALL_DOCS = {**docs(), INSUFFICIENT_EVIDENCE.id: INSUFFICIENT_EVIDENCE.doc}


@pytest.mark.parametrize("rule_id", sorted(ALL_DOCS))
def test_every_diagnosis_id_has_its_card_and_its_own_plain_words(rule_id: str) -> None:
    partial = template_dir() / "rules" / f"{rule_id}.html"
    assert partial.is_file(), f"add templates/rules/{rule_id}.html for the new rule"
    assert '{% extends "rules/_rule.html" %}' in partial.read_text()
    doc = ALL_DOCS[rule_id]
    assert doc.explanation and doc.verify and doc.verify != VERIFY_DEFAULT  # its own words
    for words in (doc.explanation, doc.verify, doc.reading):
        assert "<" not in words and "{" not in words  # plain text: the Markdown shows it too


def test_the_non_rule_ids_are_declared_where_they_are_made() -> None:
    assert {INTERNAL_ERROR.id, INSUFFICIENT_EVIDENCE.id} == set(NON_RULE_IDS)
    assert not set(NON_RULE_IDS) & {rule.spec.id for rule in RULES}


def test_no_template_or_renderer_marks_untrusted_text_safe() -> None:
    for path in template_dir().rglob("*"):
        if path.is_file():
            source = path.read_text()
            assert not re.search(r"\|\s*safe\b", source), path
            assert "autoescape false" not in source.replace("  ", " "), path
            assert "Markup(" not in source, path
    render_dir = Path(__file__).resolve().parents[2] / "oomlens" / "render"
    for path in render_dir.glob("*.py"):
        if path.name != "templates.py":  # md filters: escaped for Markdown, then marked safe
            assert "Markup(" not in path.read_text(), path


# ------------------------------------------------------------------------------ the corpus


@pytest.mark.parametrize("name", case_names())
def test_corpus_report_shows_the_expected_cause_first_with_evidence_and_fix(
    name: str, corpus_reports: dict[str, Report]
) -> None:
    report = corpus_reports[name]
    expected = manifest(name)["expected"]
    html = render_html(report)
    assert len(html.encode()) < MAX_REPORT_BYTES
    for section in SECTIONS:
        assert f'id="{section}"' in html
    articles = list(_ARTICLE.finditer(html))
    assert [m.group(2) for m in articles] == [d.id for d in report.diagnoses]
    if expected["diagnosis"] is None:
        assert report.top is None and not articles
        assert "NO FAILURE" in html
        return
    # the person opening it sees the expected cause first...
    first = articles[0]
    assert first.group(2) in {expected["diagnosis"], *expected.get("acceptable", [])}
    assert f"<h1>{escape(report.top.title)}" in html if report.top else False
    card = html[first.start() : articles[1].start() if len(articles) > 1 else len(html)]
    card = card.replace("<wbr>", "")  # where a path may wrap
    # ...the evidence under it, each item citing where it was read...
    assert '<ul class="evidence">' in card
    cited = [e for e in report.top.evidence if e.source is not None] if report.top else []
    for item in cited[:MAX_EVIDENCE]:
        assert str(escape(item.source.describe())) in card  # type: ignore[union-attr]
    # ...and a fix they can paste (a patch, an environment line or a command) when there is one
    pasteable = [f for f in report.top.fixes if f.config_patch or f.environment or f.command]
    if pasteable:
        assert re.search(r'<pre id="d1-[a-z_]+-fix\d+-(patch|env|cmd)">', card)
        assert 'class="copy"' in card


@pytest.mark.parametrize("name", ["fragmentation", "memory_leak", "prefetch_overshoot"])
def test_charts_are_inline_svg_with_bounded_points(
    name: str, corpus_reports: dict[str, Report]
) -> None:
    html = render_html(corpus_reports[name])
    charts = re.findall(r'<svg class="chart"', html)
    assert charts
    for points in re.findall(r'points="([^"]*)"', html):
        assert len(points.split()) <= MAX_POINTS
        assert re.fullmatch(r"[0-9.\-, ]+", points)


def test_fragmentation_report_draws_the_stuck_free_space(
    corpus_reports: dict[str, Report],
) -> None:
    view = build_view(corpus_reports["fragmentation"])
    snapshot = view.snapshots[0]
    assert snapshot.segments is not None
    stuck = [p for p in snapshot.segments.summary if p.style == "stuck"]
    assert stuck and stuck[0].value == "3.02 GiB"
    assert len(snapshot.segments.rows) == 20
    assert "did not fit" in snapshot.segments.request
    assert snapshot.timeline is not None and snapshot.sites is not None
    assert snapshot.sites.bars[0].label == "sample_cached.py:49 in attend"


def test_memory_leak_report_charts_the_growing_series_against_the_limit(
    corpus_reports: dict[str, Report],
) -> None:
    chart = build_view(corpus_reports["memory_leak"]).memory_chart
    assert chart is not None
    assert [h.label for h in chart.hlines] == ["allowed 8.00 GiB"]
    assert chart.summaries[0].first == "3.80 GiB" and chart.summaries[0].last == "5.75 GiB"


def test_self_contained_page_with_a_policy_that_admits_only_its_own_style_and_script(
    corpus_reports: dict[str, Report],
) -> None:
    html = render_html(corpus_reports["prefetch_overshoot"])
    assert not re.search(r"\s(src|href|action|data|srcdoc|xlink:href)=\"(?!#)", html)
    assert "@import" not in html and "url(" not in html
    assert html.count("<script") == 1 and html.count("<style") == 1
    found = re.search(r'Content-Security-Policy" content="([^"]+)"', html)
    assert found is not None
    policy = unescape(found.group(1))
    assert policy.startswith("default-src 'none';")
    for tag, directive in (("style", "style-src"), ("script", "script-src")):
        body = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        assert body is not None
        digest = base64.b64encode(hashlib.sha256(body.group(1).encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}';" in policy


@pytest.mark.parametrize("name", ["prefetch_overshoot", "checkpoint_save_host_oom", "nccl_timeout"])
def test_markdown_twin_carries_the_same_sections_without_charts(
    name: str, corpus_reports: dict[str, Report]
) -> None:
    report = corpus_reports[name]
    text = render_markdown(report)
    assert text.startswith("# oomlens: ")
    for heading in (
        "## Diagnoses, most likely first",
        "## The failure",
        "## Ranks",
        "## Config and memory budget",
        "## Inputs",
        "## What was missing",
        "## What the allocator cannot see",
    ):
        assert heading in text
    assert report.top is not None and f"(`{report.top.id}`)" in text
    assert "**After the fix:** " + report.docs[report.top.id].verify[:30] in (
        text.replace("\\", "")
    )
    assert "<svg" not in text and "<script" not in text.lower()


# ------------------------------------------------------------------------------ hostile text


def test_hostile_text_is_escaped_everywhere_in_html_and_markdown(tmp_path: Path) -> None:
    report = analyze([hostile_run(tmp_path / "run")])
    html = render_html(report)
    assert html.count("<script") == 1
    for payload in XSS_PAYLOADS:
        assert str(escape(payload.replace("\u202e", "").replace("\u202d", ""))) in html
    markdown = render_markdown(report)
    outside_code = re.sub(r"(?ms)^(`{3,})[a-z]*\n.*?^\1$", "", markdown)
    allowed = re.compile(r"</?(sub|details|summary)>")
    assert not re.search(r"(?<!\\)<(?!/?(sub|details|summary)>)", allowed.sub("", outside_code))


# ------------------------------------------------------------------------------ size bounds


def test_downsample_keeps_the_ends_and_each_stretch_peak() -> None:
    points = [(float(i), float(i % 97)) for i in range(100_000)]
    thinned = downsample(points, 300)
    assert len(thinned) == 300
    assert thinned[0] == points[0] and thinned[-1] == points[-1]
    assert max(y for _, y in thinned) == 96.0


def test_huge_facts_render_under_the_size_bound(corpus_reports: dict[str, Report]) -> None:
    """Facts far beyond what the log reader keeps (it bounds its lists itself): the renderer's
    own caps must hold alone."""
    base = corpus_reports["memory_leak"]
    facts = base.facts
    log = facts.logs[0]
    series = log.memory[0]
    start = datetime(2026, 1, 1)
    samples = tuple(
        MemorySample(
            SourceRef(log.path, 10 + i, rank=i % 64),
            "after step",
            4_000_000_000 + i * 1000,
            5_000_000_000,
            7_000_000_000,
            8_000_000_000,
            None,
            None,
            i,
            start,
        )
        for i in range(100_000)
    )
    many_series = tuple(
        dataclasses.replace(series, rank=r, samples=samples, total_samples=100_000)
        for r in range(64)
    )
    event = log.oom_events[0]
    events = tuple(
        dataclasses.replace(event, source=SourceRef(log.path, 1000 + i, rank=i % 512))
        for i in range(10_000)
    )
    huge_log_facts = dataclasses.replace(log, memory=many_series, oom_events=events)
    ranks = dataclasses.replace(
        facts.ranks,
        ranks=tuple(dataclasses.replace(facts.ranks.ranks[0], rank=r) for r in range(2000)),
    )
    inputs = tuple(
        dataclasses.replace(facts.inputs[0], path=f"/logs/rank{r}.log") for r in range(5000)
    )
    evidence = tuple(
        Evidence(EvidenceKind.LOG, "x" * 5000, SourceRef(log.path, i)) for i in range(2000)
    )
    diagnoses = tuple(
        dataclasses.replace(d, evidence=evidence, missing=("capture it",) * 500)
        for d in base.diagnoses
    )
    report = dataclasses.replace(
        base,
        facts=dataclasses.replace(facts, logs=(huge_log_facts,) * 10, ranks=ranks, inputs=inputs),
        diagnoses=diagnoses * 20,
        missing=tuple(f"item {i}" for i in range(1000)),
    )
    html = render_html(report)
    assert len(html.encode()) < MAX_REPORT_BYTES
    assert "more evidence items not shown" in html and "more ranks not shown" in html
    assert "What this report leaves out" in html
    assert len(render_markdown(report).encode()) < MAX_REPORT_BYTES


@pytest.mark.slow
def test_huge_synthetic_log_renders_under_two_megabytes(tmp_path: Path) -> None:
    # GIVEN a log of 100,000 see_memory_usage samples and 10,000 OOM tracebacks over 64 ranks,
    # generated from the corpus' real lines
    log = huge_log(tmp_path / "train.log", ranks=64, samples=100_000, ooms=10_000)
    # WHEN it is analyzed and rendered
    report = analyze([log])
    html = render_html(report)
    # THEN the page stays small and says what it left out
    assert len(html.encode()) < MAX_REPORT_BYTES
    assert report.facts.oom_events() and "more out-of-memory errors not listed" in html
    assert "more ranks&#39; series not drawn" in html


def test_memory_budget_shows_the_zero_model_when_the_parameter_count_is_known() -> None:
    report = analyze(
        [case_dir("prefetch_overshoot")],
        options=AnalysisOptions(params=350_000_000, gpu_memory=int(6.75 * 1024**3)),
    )
    view = build_view(report)
    assert view.budget.zero is not None and view.budget.zero.rows
    assert any("gpu capacity" in f.label for f in view.budget.zero.verdicts)
    html = render_html(report)
    assert "ZeRO memory model" in html and "GPU peak" in html
    without_config = build_view(analyze([case_dir("fragmentation")]))
    assert without_config.budget.zero is None and without_config.budget.zero_missing == ""


def test_the_failures_frames_are_numbered_with_their_own_lines_and_titled_as_frames() -> None:
    # audit: "The failure as printed" showed the File lines without the source lines under
    # them, and numbered only the first line (the traceback's header)
    log = case_dir("other_process") / "train.log"
    printed = log.read_text().splitlines()
    report = analyze([log])
    excerpt = build_view(report).traceback
    assert excerpt is not None and "as printed" not in excerpt.title.lower()
    assert "frames" in excerpt.title.lower()
    for line in excerpt.lines:
        assert line.number, line.text  # every frame, the header and the exception
        shown = line.text.splitlines()[0].strip()[:100]
        assert printed[int(line.number) - 1].strip().startswith(shown)
    assert sum(line.text.startswith("  File ") for line in excerpt.lines) == 6
    page = unescape(render_html(report))
    assert "The failure as printed" not in page and excerpt.title in page
    assert excerpt.title in render_markdown(report)


def test_a_paste_that_starts_inside_a_traceback_gets_no_header_it_did_not_print(
    tmp_path: Path,
) -> None:
    paste = tmp_path / "paste.txt"
    paste.write_text(
        '  File "/home/u/model.py", line 20, in forward\n'
        "    x = self.proj(x)\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
        "23.69 GiB total capacity; 20.00 GiB already allocated; 1.00 GiB free; 21.00 GiB "
        "reserved in total by PyTorch)\n"
    )
    excerpt = build_view(analyze([paste])).traceback
    assert excerpt is not None
    assert [(line.number, line.text[:20]) for line in excerpt.lines] == [
        ("1", '  File "/home/u/mode'),
        ("3", "torch.cuda.OutOfMemo"),
    ]


def _verdict_section(html: str) -> str:
    start = html.index('<section id="verdict"')
    return html[start : html.index("</section>", start)]


def test_the_verdict_box_carries_the_first_fix_of_the_top_diagnosis() -> None:
    # audit: the verdict box held only a link; the first fix started ~1,620 px down at 1280 wide
    report = analyze([case_dir("prefetch_overshoot")])
    assert report.top is not None
    fix = report.top.fixes[0]
    verdict = _verdict_section(render_html(report))
    assert str(escape(fix.summary)) in verdict
    assert fix.predicted_saving_bytes and "Saves about 2.45 GiB." in verdict
    assert f'href="#d1-{report.top.id}-fix1"' in verdict
    assert f'<div class="fix" id="d1-{report.top.id}-fix1">' in render_html(report)
    # escaped as all text is
    hostile = dataclasses.replace(fix, summary='<img src=x onerror="alert(1)"> & "fix"')
    top = dataclasses.replace(report.top, fixes=(hostile, *report.top.fixes[1:]))
    page = render_html(dataclasses.replace(report, diagnoses=(top, *report.diagnoses[1:])))
    verdict = _verdict_section(page)
    assert "<img" not in verdict and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp;" in verdict


def test_the_verdict_box_has_no_fix_line_when_the_top_diagnosis_has_none() -> None:
    report = analyze([case_dir("prefetch_overshoot")])
    assert report.top is not None
    top = dataclasses.replace(report.top, fixes=())
    page = render_html(dataclasses.replace(report, diagnoses=(top,)))
    verdict = _verdict_section(page)
    assert "top-fix" not in verdict and 'href="#d1-prefetch_overshoot"' in verdict


def test_tables_scroll_in_their_own_box_and_locators_wrap_between_folders() -> None:
    # audit: at 400 px the tables pushed the page to 971 px and "train.log:263" wrapped
    # mid-number; tables now sit in a box that scrolls sideways, and paths may wrap after
    # each "/" (a <wbr>, which copying leaves out) so that "name:line" stays whole
    html = render_html(analyze([case_dir("prefetch_overshoot")]))
    assert html.count("<table>") == html.count('<div class="scroll"><table>') > 0
    assert html.count("</table>") == html.count("</table></div>")
    verdict = _verdict_section(html)
    assert "fixtures/<wbr>crash_logs/<wbr>prefetch_overshoot/<wbr>train.log:263 (rank 0)" in verdict
    assert unescape(re.sub(r"<wbr>", "", verdict)).count("crash_logs/prefetch_overshoot/") >= 2


def _print_rules() -> dict[str, str]:
    """The stylesheet's print rules, each selector with its declarations."""
    css = (template_dir() / "html" / "style.css").read_text()
    start = css.index("@media print{body")
    body = css[start + len("@media print{") :]
    body = body[: re.search(r"\}\s*\}", body).end() - 1]  # type: ignore[union-attr]
    rules: dict[str, str] = {}
    for selectors, declarations in re.findall(r"([^{}]+)\{([^{}]*)\}", body):
        for selector in selectors.split(","):
            rules[selector.strip()] = rules.get(selector.strip(), "") + declarations
    return rules


def test_print_keeps_only_small_blocks_whole_and_headings_with_what_follows() -> None:
    # audit: a 19-page PDF, page 1 half blank (the first diagnosis card kept whole went to
    # page 2), a page three-quarters blank before a traceback kept whole, a heading alone at
    # a page's foot, and a 5-character "where" column
    rules = _print_rules()
    whole = {s for s, d in rules.items() if "break-inside:avoid" in d}
    assert whole and not whole & {".diagnosis", "table", "pre", "figure", "section", ".banner"}
    for heading in ("h2", "h3", "h4"):
        assert "break-after:avoid" in rules.get(heading, ""), heading
    assert "min-width" in rules.get("td.path", "")
    assert "overflow:visible" in rules.get(".scroll", "")  # a scrolling box would clip on paper
