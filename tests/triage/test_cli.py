"""``oomlens triage`` and ``oomlens triage merge`` as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas
import pandas.testing
import pytest

from oomlens.cli import main
from oomlens.triage.outputs import read_table
from tests.cli._terminal import on_terminal
from tests.triage._trees import BASE_TIME, copy_case

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


@pytest.fixture()
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    copy_case("prefetch_overshoot", root / "a", moment=BASE_TIME)
    copy_case("prefetch_overshoot", root / "b", moment=BASE_TIME + 60)
    copy_case("fragmentation_fixed", root / "c", moment=BASE_TIME + 120)
    return root


def test_triage_writes_the_table_and_prints_the_summary(
    archive: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(
        ["triage", str(archive), "-j", "2", "-o", "runs.csv", "-o", "index.html"], capsys
    )
    assert code == 0, err
    assert out.startswith("3 runs: 2 gpu_oom, 1 no_failure\n")
    assert "2  prefetch_overshoot" in out
    assert "Groups, largest first (failures before healthy runs):" in out
    assert "3 analyzed, 0 unchanged" in err
    assert len(read_table("runs.csv")) == 3
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "oomlens-triage.sqlite").is_file()  # the default store
    code, _, err = _run(["triage", str(archive), "-q"], capsys)
    assert code == 0 and err == ""


def test_shards_and_merge_from_the_command_line(
    archive: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for k in (1, 2):
        code, _, err = _run(
            ["triage", str(archive), "--shard", f"{k}/2", "-o", f"part{k}.jsonl", "-q"], capsys
        )
        assert code == 0, err
        assert (tmp_path / f"oomlens-triage.shard-{k}-of-2.sqlite").is_file()
    code, _, err = _run(["triage", str(archive), "--no-store", "-o", "all.csv", "-q"], capsys)
    assert code == 0, err
    code, out, err = _run(
        ["triage", "merge", "part1.jsonl", "part2.jsonl", "-o", "merged.parquet"], capsys
    )
    assert code == 0, err
    assert out.startswith("3 runs:")
    pandas.testing.assert_frame_equal(read_table("merged.parquet"), read_table("all.csv"))


def test_no_runs_is_exit_3_and_bad_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = _run(["triage", str(tmp_path / "empty"), "--no-store"], capsys)
    assert code == 3 and "no runs found under" in err
    code, _, err = _run(["triage", str(tmp_path), "--shard", "0/4"], capsys)
    assert code == 2 and "K must be between 1 and N" in err
    code, _, err = _run(["triage", str(tmp_path), "-o", "x.xlsx"], capsys)
    assert code == 2 and "unknown output format .xlsx" in err
    code, _, err = _run(["triage", str(tmp_path / "nope"), "--no-store"], capsys)
    assert code == 2 and "no such directory" in err
    code, _, err = _run(["triage", "merge", str(tmp_path / "missing.csv")], capsys)
    assert code == 3 and "missing.csv" in err


def test_without_outputs_the_store_goes_to_the_cache_not_the_current_directory(
    archive: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, _, err = _run(["triage", str(archive), "-q"], capsys)
    assert code == 0, err
    assert list(here.iterdir()) == []
    assert (tmp_path / "cache" / "oomlens" / "oomlens-triage.sqlite").is_file()
    # the second run finds its results there
    code, _, err = _run(["triage", str(archive)], capsys)
    assert code == 0 and "0 analyzed, 3 unchanged" in err


def test_a_leak_is_grouped_by_where_memory_piled_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The leak's OOM strikes in Adam's step (an innocent allocation); the runs that leak from
    # the same line of the model must group by that line.
    copy_case("memory_leak", tmp_path / "runs" / "leak", moment=BASE_TIME)
    code, _, err = _run(["triage", str(tmp_path / "runs"), "--no-store", "-o",
                         str(tmp_path / "t.csv"), "-q"], capsys)  # fmt: skip
    assert code == 0, err
    row = read_table(str(tmp_path / "t.csv")).iloc[0]
    assert row["diagnosis"] == "memory_leak"
    assert row["call_site"] == "model.py:104 in forward"
    assert row["group"] == "gpu_oom/memory_leak @ model.py:104 in forward"


def test_names_with_control_characters_stay_apart_and_reach_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    copy_case("fragmentation", tmp_path / "t" / "a b", moment=BASE_TIME)
    copy_case("fragmentation", tmp_path / "t" / "a\tb", moment=BASE_TIME)
    copy_case("other_process", tmp_path / "t" / "a\nb\x1b[2J", moment=BASE_TIME)
    code, out, err = _run(["triage", "t", "--no-store", "-o", "x.csv", "-o", "x.jsonl"], capsys)
    assert code == 0, err
    assert out.startswith("3 runs: 3 gpu_oom\n")
    assert "(newest: a\\nb\\x1b[2J)" in out
    assert not {"\t", "\x1b"} & set(out + err)
    assert all(
        line.startswith(("  ", "Top", "Groups", "3 runs")) for line in out.splitlines() if line
    )
    code, out, err = _run(["triage", "merge", "x.csv", "-o", "m.jsonl"], capsys)
    assert code == 0 and err == ""
    assert out.startswith("3 runs: 3 gpu_oom\n")
    assert sorted(read_table("m.jsonl")["run"]) == ["a\tb", "a\nb\x1b[2J", "a b"]
    # the same runs in two tables: kept once, and said so in one line
    code, out, err = _run(["triage", "merge", "x.csv", "x.jsonl", "-q"], capsys)
    assert code == 0
    assert err.count("\n") == 1 and "warning: 3 rows left out: the same run" in err


def test_a_tree_of_only_links_says_the_links_were_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = copy_case("fragmentation", tmp_path / "real", moment=BASE_TIME)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "run").symlink_to(target)
    code, _, err = _run(["triage", str(tmp_path / "tree"), "--no-store"], capsys)
    assert code == 3
    assert "symbolic link (to " in err and "which triage does not follow" in err
    assert "no runs found under" in err and "1 skipped, see the warnings above" in err


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet", "sqlite", "html"])
def test_a_name_that_is_not_utf8_is_triaged_and_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    # A directory named with a byte that is not UTF-8 (0xff): the store and the table's
    # string columns could not hold its name, and triage ended in an internal error.
    monkeypatch.chdir(tmp_path)
    odd = os.fsdecode(b"run\xff")
    copy_case("fragmentation", tmp_path / "t" / odd, moment=BASE_TIME)
    code, out, err = _run(["triage", "t", "-o", f"x.{suffix}"], capsys)
    assert code == 0, err
    assert out.startswith("1 run: 1 gpu_oom\n")
    if suffix != "html":
        assert list(read_table(f"x.{suffix}")["run"]) == ["run\\udcff"]
    # and again, from the store that the first run left
    assert _run(["triage", "t", "-o", f"y.{suffix}"], capsys)[0] == 0


def test_on_a_terminal_the_summary_is_wrapped_and_piped_it_is_not(tmp_path: Path) -> None:
    long = "a-rather-long-run-directory-name-for-a-prefetch-overshoot-run-2026-11-30T06-33-53"
    copy_case("prefetch_overshoot", tmp_path / "t" / long, moment=BASE_TIME)
    args = ["triage", "t", "--no-store"]
    code, shown = on_terminal(args, 80, cwd=tmp_path)
    assert code == 0, shown
    summary = [line for line in ANSI.sub("", shown).splitlines() if "newest" in line]
    assert summary and all(len(line) <= 80 for line in summary)
    piped = subprocess.run(
        [sys.executable, "-m", "oomlens", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
    )
    assert any(len(line) > 80 and "newest" in line for line in piped.stdout.splitlines())
