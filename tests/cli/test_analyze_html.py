"""`oomlens analyze` writing the HTML report: --html, -o report.html, --format html."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests._corpus import case_dir

CASE = case_dir("fragmentation")
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_html_option_writes_the_page_besides_the_chosen_output(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = run("analyze", CASE, "--html", page)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("oomlens: GPU OOM")  # the terminal summary still printed
    assert f"HTML report written to {page}" in result.stderr
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'id="d1-fragmentation"' in html


def test_html_option_with_another_output_file_writes_both(tmp_path: Path) -> None:
    result = run("analyze", CASE, "-o", tmp_path / "r.md", "--html", tmp_path / "r.html")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r.md").read_text().startswith("# oomlens: GPU OOM")
    assert "<!DOCTYPE html>" in (tmp_path / "r.html").read_text()
    assert result.stdout == ""


def test_html_by_extension_and_by_format(tmp_path: Path) -> None:
    for target in (tmp_path / "a.html", tmp_path / "b.htm"):
        result = run("analyze", CASE, "-o", target)
        assert result.returncode == 0, result.stderr
        assert target.read_text().startswith("<!DOCTYPE html>")
    result = run("analyze", CASE, "--format", "html")
    assert result.returncode == 0 and result.stdout.startswith("<!DOCTYPE html>")


def test_unwritable_html_target_is_one_usage_error(tmp_path: Path) -> None:
    result = run("analyze", CASE, "--html", tmp_path / "missing-dir" / "r.html")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot write the report" in result.stderr
