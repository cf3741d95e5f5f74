"""What a person reads from triage: the capacity and free memory of one kind, one time
format with its zone, per-run reports named after their runs, ``-o`` into a folder that does
not exist yet, and an index that reads on a phone-wide window."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.triage.engine import report_file_name
from oomlens.triage.outputs import read_table, shown_time
from oomlens.triage.table import summarize_report
from oomlens.triage.walk import FileEntry, RunSpec
from tests.triage._trees import BASE_TIME, copy_case

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def _oom(**figures: int | None) -> dict[str, object]:
    return {"verdict": "gpu_oom", "oom_events": [figures]}


@pytest.mark.parametrize(
    ("figures", "capacity", "free"),
    [
        # a memory fraction of a big card: the card is mostly free, the limit is not
        (
            {
                "total_capacity": 94 * GiB,
                "free": 80 * GiB,
                "allowed": 20 * GiB,
                "allocated_by_pytorch": 17 * GiB,
                "reserved_unallocated": 2 * GiB,
            },
            20 * GiB,
            1 * GiB,
        ),
        # reserved over the limit (rounding in the printed sizes): nothing left, not negative
        (
            {
                "total_capacity": 40 * GiB,
                "free": 30 * GiB,
                "allowed": 8 * GiB,
                "allocated_by_pytorch": 8 * GiB,
                "reserved_unallocated": GiB // 2,
            },
            8 * GiB,
            0,
        ),
        # a limit without what was reserved: the room is unknown, not the card's free
        ({"total_capacity": 40 * GiB, "free": 30 * GiB, "allowed": 8 * GiB}, 8 * GiB, None),
        # no limit: the card and its free memory
        (
            {"total_capacity": 24 * GiB, "free": GiB // 8, "allocated_by_pytorch": 20 * GiB},
            24 * GiB,
            GiB // 8,
        ),
    ],
)
def test_capacity_and_free_are_of_one_kind(
    figures: dict[str, int], capacity: int, free: int | None
) -> None:
    row = summarize_report(_oom(**figures))
    assert (row["capacity"], row["free"]) == (capacity, free)
    assert row["free"] is None or row["free"] <= row["capacity"]


def _run(name: str, identity_seed: str) -> RunSpec:
    entry = FileEntry("/x/train.log", 1, 0, 1)
    return RunSpec(name, "/x", "/x", (f"/x/{identity_seed}",), (("train.log", entry),))


def test_a_run_report_is_named_after_its_run() -> None:
    plain = report_file_name(_run("exp-7b.lr3e-4", "a"))
    assert plain.startswith("exp-7b.lr3e-4-") and plain.endswith(".html")
    nested = report_file_name(_run("sweep 2/run\t1/\udcff", "b"))
    assert nested.startswith("sweep_2_run_1__-")
    assert nested.isprintable() and "/" not in nested
    assert not report_file_name(_run("..hidden", "c")).startswith(".")
    # two runs whose names read the same still get a file each
    assert report_file_name(_run("a/b", "d")) != report_file_name(_run("a_b", "e"))
    assert len(report_file_name(_run("x" * 500, "f"))) < 120


def _triage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", "triage", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        timeout=300,
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("presentation")
    copy_case("other_process", root / "archive" / "node 3" / "job-41", moment=BASE_TIME)
    copy_case("memory_leak", root / "archive" / "job-42", moment=BASE_TIME + 60)
    # outputs into folders that do not exist yet
    done = _triage(
        "archive",
        "--no-store",
        "-q",
        "-j",
        "2",
        "-o",
        "new/deeper/table.csv",
        "-o",
        "new/site/index.html",
        "--reports",
        "new/reports",
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    return root / "new"


def test_outputs_go_into_folders_made_for_them_and_reports_carry_run_names(
    written: Path,
) -> None:
    table = read_table(str(written / "deeper" / "table.csv"))
    for run, report in zip(table["run"], table["report"], strict=True):
        name = os.path.basename(report)
        assert name.startswith(re.sub(r"[^\w.-]", "_", run) + "-"), (run, name)
        assert (written / "reports" / name).is_file()


def test_every_time_is_shown_in_one_format_with_its_zone(written: Path) -> None:
    table = read_table(str(written / "deeper" / "table.csv"))
    page = (written / "site" / "index.html").read_text()
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"
    zone = r"(?:Z|[+-]\d\d:\d\d| \(zone unknown\))"
    for time in table["time"]:
        # a log that printed no zone keeps none in the table (none is made up)...
        assert re.fullmatch(iso + r"(?:Z|[+-]\d\d:\d\d)?", time)
        # ...and the page says so beside it
        assert shown_time(time) in page
    # every date on the page is in that one format with its zone, the generation time too
    dates = re.findall(r"\d{4}-\d\d-\d\d[T ][^<]*?(?=<)", page)
    assert dates and all(re.fullmatch(iso + zone, d) for d in dates), dates
    assert shown_time("2026-01-02T03:04:05.678") == "2026-01-02T03:04:05.678 (zone unknown)"


_BEYOND_THE_WINDOW = """
() => {
  const found = [];
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && box.right > window.innerWidth + 1) {
      found.push("past the right edge: <" + el.nodeName + "> " + el.textContent.slice(0, 40));
    }
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible") {
      found.push("scrolls sideways: <" + el.nodeName + " class=" + el.className + ">");
    }
  }
  return found.slice(0, 10);
}
"""


def test_the_index_reads_at_400_pixels(written: Path) -> None:
    # everything within a 400 px window: no table to scroll sideways, no column squeezed
    # into a word per line (the layout audit of the report tests), at 1280 px still a table
    pytest.importorskip("playwright", reason="playwright (the test extra) is missing")
    from playwright.sync_api import sync_playwright

    from tests.render._browser import LAYOUT_AUDIT, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no chromium")
    url = (written / "site" / "index.html").resolve().as_uri()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        try:
            for width in (400, 1280):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(url, wait_until="load")
                assert page.evaluate(_BEYOND_THE_WINDOW) == [], width
                assert page.evaluate(LAYOUT_AUDIT) == [], width
                headers = page.locator("thead").first
                assert headers.is_visible() == (width > 640)
                page.close()
        finally:
            browser.close()
