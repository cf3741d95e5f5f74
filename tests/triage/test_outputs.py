"""Every output format holds the same table; the HTML index is inert whatever the paths say."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import stat
import threading
from pathlib import Path

import pandas
import pandas.testing
import pytest
from markupsafe import escape

from oomlens.errors import InputError, UsageError
from oomlens.triage import outputs
from oomlens.triage.engine import TriageOptions, triage
from oomlens.triage.outputs import read_table, write_table
from tests.triage._trees import BASE_TIME, copy_case

HOSTILE = '<img src=x onerror="alert(1)"> & co'


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> pandas.DataFrame:
    root = tmp_path_factory.mktemp("runs")
    copy_case("prefetch_overshoot", root / "ds" / "prefetch", moment=BASE_TIME)
    copy_case("fragmentation_fixed", root / "ok", moment=BASE_TIME + 60)
    copy_case("fragmentation", root / HOSTILE, moment=BASE_TIME + 120)
    broken = root / "broken"
    broken.mkdir()
    (broken / "train.log").write_bytes(bytes(range(256)) * 16)
    result = triage([str(root)], TriageOptions(jobs=2, store=None))
    assert len(result.table) == 4
    return result.table


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.ndjson", "t.parquet", "t.sqlite", "t.db"])
def test_each_table_format_reads_back_as_the_same_table(
    table: pandas.DataFrame, tmp_path: Path, name: str
) -> None:
    path = str(tmp_path / name)
    write_table(table, path)
    pandas.testing.assert_frame_equal(read_table(path), table)


def test_the_sqlite_output_has_runs_and_groups(table: pandas.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    write_table(table, str(path))
    with sqlite3.connect(path) as db:
        runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
        groups = db.execute("SELECT sum(runs) FROM groups").fetchone()[0]
    db.close()
    assert runs == groups == len(table)


def test_parquet_without_pyarrow_says_how_to_enable_it(
    table: pandas.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        outputs.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyarrow" else real(name, *a),
    )
    with pytest.raises(UsageError, match=r"pip install 'oomlens\[parquet\]'"):
        write_table(table, str(tmp_path / "t.parquet"))
    assert not (tmp_path / "t.parquet").exists()


def test_an_unknown_extension_is_a_usage_error(table: pandas.DataFrame, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"unknown output format \.xlsx"):
        write_table(table, str(tmp_path / "t.xlsx"))


def test_a_file_that_is_not_a_table_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not a triage table: no column"):
        read_table(str(path))


def test_the_html_index_escapes_paths_and_loads_nothing(
    table: pandas.DataFrame, tmp_path: Path
) -> None:
    index = tmp_path / "index.html"
    write_table(table, str(index), title="Monday <b>")
    page = index.read_text()
    # the hostile run name is there, as text
    assert str(escape(HOSTILE)) in page
    assert "<img" not in page and "Monday <b>" not in page and "Monday &lt;b&gt;" in page
    # nothing is fetched: no scripts, no remote URLs, a CSP that forbids loading
    assert "<script" not in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page)
    assert "default-src 'none'" in page
    assert page.count("<tr>") >= len(table)
    # missing values are empty cells, not pandas' NaN
    assert not re.search(r">\s*(?:nan|NaN|<NA>|None)\s*<", page)


def test_the_html_index_links_reports_relative_to_itself(
    table: pandas.DataFrame, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    linked = table.copy()
    linked["report"] = pandas.array(
        [str(reports / f"r {i}#?.html") for i in range(len(table))], dtype="string"
    )
    index = tmp_path / "site" / "index.html"
    index.parent.mkdir()
    write_table(linked, str(index))
    page = index.read_text()
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert sorted(hrefs) == sorted(f"../reports/r%20{i}%23%3F.html" for i in range(len(table)))


def test_a_write_that_fails_leaves_the_old_file(
    table: pandas.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("old\n")

    def explode(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pandas.DataFrame, "to_sql", explode)
    with pytest.raises(UsageError, match="No space left"):
        write_table(table, str(tmp_path / "t.sqlite"))
    assert not (tmp_path / "t.sqlite").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    assert path.read_text() == "old\n"


FORMULA_NAMES = ('=HYPERLINK("attacker.example","open me")', "@SUM(1+1)", "+1-1", "-2+3")


@pytest.fixture(scope="module")
def hostile_table(tmp_path_factory: pytest.TempPathFactory) -> pandas.DataFrame:
    """Runs named like spreadsheet formulas, one whose log's exception carries terminal
    escapes (ESC, BEL, C1 CSI) and a bidi override."""
    root = tmp_path_factory.mktemp("formulas")
    for n, name in enumerate(FORMULA_NAMES):
        copy_case("nccl_timeout" if n else "fragmentation", root / name, moment=BASE_TIME + n)
    dirty = root / "run\x1b[31mred\x07"
    dirty.mkdir()
    (dirty / "train.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "/home/u/\x1b]0;pwned\x07tr\u202eain\x9b2J.py", line 7, in train_step\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 3.06 MiB is free. Including non-PyTorch memory, "
        "this process has 79.09 GiB memory in use. Of the allocated memory 77.80 GiB is "
        "allocated by PyTorch, and 812.40 MiB is reserved by PyTorch but unallocated.\n"
    )
    return triage([str(root)], TriageOptions(jobs=2, store=None)).table


def test_csv_cells_cannot_start_a_formula_and_merge_reads_them_back(
    hostile_table: pandas.DataFrame, tmp_path: Path
) -> None:
    import csv

    path = tmp_path / "runs.csv"
    write_table(hostile_table, str(path))
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    # every text cell that a spreadsheet would take for a formula is guarded
    for row in rows:
        for name, cell in row.items():
            if cell and outputs.COLUMNS[name] == "string":
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, cell)
    names = {row["run"] for row in rows}
    assert {"'" + name for name in FORMULA_NAMES} <= names
    # and reading the table back (oomlens triage merge) gives the names as they are
    pandas.testing.assert_frame_equal(read_table(str(path)), hostile_table)


CONTROL_NAMES = (
    "a b",
    "a\tb",
    "a\nb",
    "a\\tb",
    "c\rd",
    "run\x1b[31mred\x07",
    "bidi\u202etxt.gol",
    "c1\x9bcsi",
    "'=not a formula",
    "'quoted",
)
"""Directory names that differ only by control characters, backslash escapes look-alikes, and
names a CSV's escapes and formula guard could confuse."""


@pytest.fixture(scope="module")
def control_table(tmp_path_factory: pytest.TempPathFactory) -> pandas.DataFrame:
    root = tmp_path_factory.mktemp("control")
    for n, name in enumerate(CONTROL_NAMES):
        case = "other_process" if name == "a\nb" else "fragmentation"
        copy_case(case, root / name, moment=BASE_TIME + n)
    return triage([str(root)], TriageOptions(jobs=2, store=None)).table


def test_run_names_and_paths_are_kept_exactly(control_table: pandas.DataFrame) -> None:
    assert sorted(control_table["run"]) == sorted(CONTROL_NAMES)
    for path in control_table["path"]:
        assert os.path.isdir(path), repr(path)
    assert control_table.set_index("run").loc["a\nb", "diagnosis"] == "other_process"


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.parquet", "t.sqlite"])
def test_exact_names_read_back_from_every_table_format(
    control_table: pandas.DataFrame, tmp_path: Path, name: str
) -> None:
    if name.endswith(".parquet") and importlib.util.find_spec("pyarrow") is None:
        pytest.skip("pyarrow is not installed")
    path = tmp_path / name
    write_table(control_table, str(path))
    pandas.testing.assert_frame_equal(read_table(str(path)), control_table)


def test_csv_writes_control_characters_as_backslash_escapes(
    control_table: pandas.DataFrame, tmp_path: Path
) -> None:
    import csv

    path = tmp_path / "runs.csv"
    write_table(control_table, str(path))
    raw = path.read_bytes()
    assert raw.count(b"\n") == len(control_table) + 1  # a line per row, one for the header
    with open(path, newline="", encoding="utf-8") as stream:
        names = {row["run"] for row in csv.DictReader(stream)}
    assert {"a\\tb", "a\\nb", "a\\\\tb", "c\\rd", "run\\x1b[31mred\\x07"} <= names
    assert {"bidi\\u202etxt.gol", "c1\\x9bcsi", "''=not a formula", "''quoted"} <= names


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.html"])
def test_no_text_output_carries_control_or_bidi_characters(
    control_table: pandas.DataFrame, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    write_table(control_table, str(path))
    text = path.read_text(encoding="utf-8")
    for character in ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\t"):
        assert character not in text, (name, repr(character))


def test_the_html_index_shows_names_escaped(
    control_table: pandas.DataFrame, tmp_path: Path
) -> None:
    path = tmp_path / "index.html"
    write_table(control_table, str(path))
    text = path.read_text(encoding="utf-8")
    for character in ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\t"):
        assert character not in text, repr(character)
    assert ">a\\tb<" in text and ">a\\nb<" in text and ">a\\\\tb<" in text


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_follow_the_umask(
    table: pandas.DataFrame, tmp_path: Path, umask: int, mode: int
) -> None:
    previous = os.umask(umask)
    try:
        for name in ("t.csv", "t.jsonl", "t.sqlite", "t.html"):
            write_table(table, str(tmp_path / name))
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    finally:
        os.umask(previous)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".sqlite", ".html"])
def test_a_device_or_fifo_output_is_written_through_not_replaced(
    table: pandas.DataFrame, tmp_path: Path, suffix: str
) -> None:
    # A table written to -o /dev/null replaced the device node with a regular file (a
    # temporary file renamed over it); a FIFO stands for the device here.
    fifo = tmp_path / f"runs{suffix}"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as stream:
            received.append(stream.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    write_table(table, str(fifo))
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received and received[0]
