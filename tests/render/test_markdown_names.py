"""File and directory names are untrusted text: a run whose names hold Markdown (backticks,
brackets, pipes, angle brackets, line feeds, a heading or list marker at a line's start) gets
a Markdown report of the same structure as the same run under plain names, and an HTML report
where none of it is markup."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from oomlens.cli import main
from tests._corpus import case_dir

markdown_it = pytest.importorskip("markdown_it")

CASE = case_dir("fragmentation")
PLAIN = ("run", "train.log", "snapshot.pickle")
HOSTILE = (
    "1) r`u`n | [x](y) <xq>\n## h\n---",
    "- tr``ain\n| c | d |\n+ `e` ![i](j).log",
    "= s<xq>&amp;\n> q\n2. ```snap.pickle",
)
STRUCTURE = {
    "heading_open",
    "tr_open",
    "td_open",
    "link_open",
    "image",
    "code_inline",
    "fence",
    "html_inline",
    "html_block",
    "bullet_list_open",
    "ordered_list_open",
    "list_item_open",
    "blockquote_open",
    "hr",
    "em_open",
    "strong_open",
}


def _report(tmp_path: Path, names: tuple[str, str, str], fmt: str) -> str:
    folder, log, snapshot = names
    run = tmp_path / folder
    run.mkdir()
    shutil.copy(CASE / "train.log", run / log)
    shutil.copy(CASE / "snapshot_rank0.pickle", run / snapshot)
    with pytest.raises(SystemExit) as info:
        main(["analyze", folder, "--format", fmt])
    assert info.value.code == 0
    return run.name


def _structure(text: str) -> Counter[str]:
    parser = markdown_it.MarkdownIt("commonmark").enable("table")
    counts: Counter[str] = Counter()
    for token in parser.parse(text):
        counts[token.type] += token.type in STRUCTURE
        for child in token.children or ():
            counts[child.type] += child.type in STRUCTURE
    return +counts


def test_names_holding_markdown_make_no_structure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # relative names: the report shows them as given, so they start its lines
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    _report(tmp_path / "a", PLAIN, "markdown")
    plain = capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "b")
    _report(tmp_path / "b", HOSTILE, "markdown")
    hostile = capsys.readouterr().out
    assert "xq" in hostile  # the names are in the report
    assert _structure(hostile) == _structure(plain)


def test_names_holding_markup_are_text_in_the_html_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _report(tmp_path, HOSTILE, "html")
    page = capsys.readouterr().out
    assert "&lt;xq&gt;" in page
    assert "<xq>" not in page
