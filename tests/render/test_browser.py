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
from pathlib import Path

import pytest

from oomlens.render.html import render_html
from oomlens.render.text import clean
from oomlens.session import analyze
from tests._corpus import case_dir, case_names
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
    # THEN nothing leaves the file, nothing errs, and the cause is on screen, first
    _assert_clean(result)
    assert result.screenshot is not None and png_is_not_blank(result.screenshot)
    (shots / f"{name}.png").write_bytes(result.screenshot)
    visible = " ".join(result.visible_text.split())
    assert report.verdict.value.replace("_", " ").upper() in visible
    if report.top is not None:
        title = " ".join(clean(report.top.title).split())
        assert title in visible
        assert visible.index(title) < visible.index("Diagnoses, most likely first")


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
