"""The HTML report in a real headless Chromium: every corpus case loads offline, cleanly, and
shows its cause; script-injection payloads in the log, the config and the snapshot never run.

One browser for this module, driven by Playwright (``_browser``), reports loaded one after
another.  Chromium is Debian's package: installed by the tests when missing and running as root
(as CI does); elsewhere the tests skip with the reason, except under CI=true, where a missing
browser is a failure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from oomlens.render.html import render_html
from oomlens.render.text import clean
from oomlens.session import analyze
from tests._corpus import case_dir, case_names, manifest
from tests.render._browser import Browser, BrowserUnavailable, ensure_chromium, png_is_not_blank
from tests.render._hostile import XSS_PAYLOADS, hostile_run

pytestmark = pytest.mark.slow

_CSP_META = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>')


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module scope: Playwright's driver keeps a thread (asyncio's child watcher) until it
    # stops, and later tests fork (triage's pool forks only a single-threaded process).
    try:
        pytest.importorskip("playwright", reason="playwright (the test extra) is missing")
        binary = ensure_chromium()
        instance = Browser(binary)
    except (BrowserUnavailable, pytest.skip.Exception) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the browser tests: {exc}")
        pytest.skip(f"no headless browser: {exc}")
    yield instance
    instance.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def _assert_clean(result: object) -> None:
    from tests.render._browser import PageResult

    assert isinstance(result, PageResult)
    assert result.errors == [], result.errors
    assert result.console == [], result.console
    assert result.outside_requests == [], result.outside_requests
    assert result.traps == [], result.traps
    assert result.mutations == [], result.mutations
    assert result.dom_findings == [], result.dom_findings


@pytest.mark.parametrize("name", case_names())
def test_corpus_report_loads_offline_cleanly_and_shows_its_cause(
    name: str, browser: Browser, shots: Path
) -> None:
    # GIVEN the HTML report of a real crash
    report = analyze([case_dir(name)])
    page = shots / f"{name}.html"
    page.write_text(render_html(report), encoding="utf-8")
    # WHEN a browser opens it from disk
    result = browser.load(page, screenshot=True)
    # THEN nothing leaves the file, nothing errs, nothing is laid out broken at 1280 px, and
    # the cause is on screen, first
    _assert_clean(result)
    assert result.layout == [], result.layout
    assert result.screenshot is not None and png_is_not_blank(result.screenshot)
    (shots / f"{name}.png").write_bytes(result.screenshot)
    visible = " ".join(result.visible_text.split())
    assert report.verdict.value.replace("_", " ").upper() in visible
    if report.top is not None:
        title = " ".join(clean(report.top.title).split())
        assert title in visible
        assert visible.index(title) < visible.index("Diagnoses, most likely first")


@pytest.mark.parametrize("name", ["prefetch_overshoot", "fragmentation", "nccl_timeout"])
def test_a_narrow_window_scrolls_tables_not_the_page(
    name: str, browser: Browser, shots: Path
) -> None:
    # audit: at 400 px the report laid out 971 px wide (its tables), the verdict's locator ran
    # out of its box and "train.log:263" wrapped as "train.log:26 / 3"
    report = analyze([case_dir(name)])
    page = shots / f"{name}_400.html"
    page.write_text(render_html(report), encoding="utf-8")
    result = browser.load(page, screenshot=True, width=400, full_page=True)
    (shots / f"{name}_400.png").write_bytes(result.screenshot or b"")
    _assert_clean(result)
    assert result.layout == [], result.layout


def test_dark_mode_and_print_render(browser: Browser, shots: Path) -> None:
    page = shots / "fragmentation_dark.html"
    page.write_text(render_html(analyze([case_dir("fragmentation")])), encoding="utf-8")
    dark = browser.load(page, screenshot=True, dark=True)
    _assert_clean(dark)
    assert dark.screenshot is not None and png_is_not_blank(dark.screenshot)
    light = browser.load(page, screenshot=True)
    assert light.screenshot != dark.screenshot  # the colour scheme really changed
    pdf = browser.print_pdf(page)
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Type /Page") >= 2


def test_injection_payloads_never_run_and_show_as_text(browser: Browser, tmp_path: Path) -> None:
    # GIVEN a run whose log lines, traceback frames, OOM message, config keys and values and
    # snapshot frame names carry classic script-injection payloads
    report = analyze([hostile_run(tmp_path / "run")])
    assert report.top is not None and report.top.id == "fragmentation"
    html = render_html(report)
    with_csp = tmp_path / "report.html"
    with_csp.write_text(html, encoding="utf-8")
    # the page without its Content-Security-Policy: escaping alone must hold
    without_csp = tmp_path / "report_without_csp.html"
    without_csp.write_text(_CSP_META.sub("", html), encoding="utf-8")
    for page in (with_csp, without_csp):
        # WHEN a browser opens the report
        result = browser.load(page, settle=0.5)
        # THEN no payload ran, requested anything or changed the page...
        _assert_clean(result)
        # ...and every payload is there as text
        text = " ".join(result.text.split())
        for payload in XSS_PAYLOADS:
            assert " ".join(clean(payload).split()) in text, payload


def test_a_long_command_is_not_under_its_copy_button(browser: Browser, shots: Path) -> None:
    # GIVEN a fix whose command is the corpus run's own launch line, long enough to wrap
    report = analyze([case_dir("prefetch_overshoot")])
    command = manifest("prefetch_overshoot")["command"] + " --zero-stage 3 --gradient-checkpointing"
    top = report.diagnoses[0]
    fix = replace(top.fixes[0], command=command, config_patch=None)
    report = replace(report, diagnoses=(replace(top, fixes=(fix,)), *report.diagnoses[1:]))
    page = shots / "long_command.html"
    page.write_text(render_html(report), encoding="utf-8")
    # WHEN it is shown at 1280 px, THEN the copy button covers none of it
    result = browser.load(page, screenshot=True)
    (shots / "long_command.png").write_bytes(result.screenshot or b"")
    _assert_clean(result)
    assert command in " ".join(result.visible_text.split())
    assert result.layout == [], result.layout


@pytest.mark.parametrize("width", [1280, 400])
def test_the_triage_index_fits_the_window(
    width: int, browser: Browser, shots: Path, tmp_path: Path
) -> None:
    # GIVEN an archive of real runs under long experiment folders
    from oomlens.triage.engine import TriageOptions, triage
    from oomlens.triage.outputs import write_table
    from tests.triage._trees import BASE_TIME, copy_case

    root = tmp_path / "experiments" / "2026-11-30" / "llm-train-zero3-sweep-with-long-names"
    cases = ("prefetch_overshoot", "fragmentation", "memory_leak", "nccl_timeout")
    for n, case in enumerate(cases):
        copy_case(case, root / f"{case}-run-000{n}", moment=BASE_TIME + 60 * n)
    result = triage([str(tmp_path)], TriageOptions(jobs=1, store=None))
    index = shots / f"triage_index_{width}.html"
    write_table(result.table, str(index))
    # WHEN the index is shown at 1280 px or 400 px (where the audit saw it 1199 px wide),
    # THEN nothing runs past the right edge or is clipped: a narrow window scrolls the tables
    page = browser.load(index, screenshot=True, full_page=True, width=width)
    (shots / f"triage_index_{width}.png").write_bytes(page.screenshot or b"")
    assert page.errors == [] and page.outside_requests == []
    assert page.layout == [], page.layout
    assert "tried to allocate 24.00 MiB" in " ".join(page.visible_text.split())


def test_the_layout_audit_sees_each_defect(browser: Browser, tmp_path: Path) -> None:
    """The harness itself: a page with each defect the reports once had is seen to have it."""
    page = tmp_path / "defects.html"
    page.write_text(
        "<!DOCTYPE html><html><head><style>"
        "td{overflow-wrap:anywhere} .codebox{position:relative}"
        " button{position:absolute;top:0;right:0}"
        "</style></head><body>"
        "<table style='width:300px'><tr><td>allocator</td><td>"
        + "fixtures/crash_logs/prefetch_overshoot/"
        * 10
        + "</td></tr></table>"
        "<svg width='400' height='60'><text x='300' y='20' text-anchor='end'>allowed 6.75 GiB"
        "</text><text x='290' y='22' text-anchor='end'>OOM</text></svg>"
        "<div class='codebox' style='width:300px'>"
        "<pre style='white-space:pre-wrap;overflow-wrap:anywhere;margin:0'>deepspeed "
        + "--deepspeed_config=runs/prefetch_overshoot/ds_config.json"
        * 4
        + "</pre><button class='copy'>copy</button></div>"
        "<table><tr>"
        + "<td style='white-space:nowrap'>2026-11-30 06:44:31.453000</td>" * 60
        + "</tr></table></body></html>",
        encoding="utf-8",
    )
    found = " | ".join(browser.load(page).layout)
    assert "word broken: allocator" in found
    assert "labels overlap: 'allowed 6.75 GiB' and 'OOM'" in found
    assert "copy button over: deepspeed" in found
    assert "page wider than the window" in found


def test_the_traps_catch_a_payload_that_is_not_escaped(browser: Browser, tmp_path: Path) -> None:
    """The harness itself: an unescaped payload in a page is seen running."""
    page = tmp_path / "canary.html"
    page.write_text(
        "<!DOCTYPE html><html><head><style></style></head><body><p>canary</p>"
        "<script>alert('canary')</script><img src=x onerror=\"prompt('img')\">"
        "<script>setTimeout(function(){document.body.appendChild(document.createElement('b'))},10)"
        "</script></body></html>",
        encoding="utf-8",
    )
    result = browser.load(page, settle=0.3)
    assert "alert:canary" in result.traps and "prompt:img" in result.traps
    assert any(url.endswith("/x") for url in result.outside_requests)
    assert "added B" in result.mutations
    assert any("handler IMG.onerror" in f for f in result.dom_findings)
