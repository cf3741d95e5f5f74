"""``merge_runs``: one row per run, whatever the runs' names hold, and no row left out unsaid."""

from __future__ import annotations

from pathlib import Path

import pandas
import pandas.testing
import pytest

from oomlens.triage.engine import TriageOptions, triage
from oomlens.triage.merge import merge_runs
from oomlens.triage.outputs import write_table
from tests.triage._trees import BASE_TIME, copy_case


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> pandas.DataFrame:
    """Three runs whose directory names differ only by a space, a tab and a line feed."""
    root = tmp_path_factory.mktemp("names")
    copy_case("fragmentation", root / "a b", moment=BASE_TIME)
    copy_case("fragmentation", root / "a\tb", moment=BASE_TIME)
    copy_case("other_process", root / "a\nb", moment=BASE_TIME)
    return triage([str(root)], TriageOptions(jobs=2, store=None)).table


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.sqlite"])
def test_runs_whose_names_differ_by_control_characters_stay_apart(
    table: pandas.DataFrame, tmp_path: Path, name: str
) -> None:
    path = str(tmp_path / name)
    write_table(table, path)
    merged = merge_runs([path])
    assert sorted(merged.table["run"]) == ["a\tb", "a\nb", "a b"]
    assert merged.repeated.empty
    pandas.testing.assert_frame_equal(merged.table, table)


def test_a_run_in_two_tables_is_kept_once_and_the_repeat_is_returned(
    table: pandas.DataFrame, tmp_path: Path
) -> None:
    write_table(table, str(tmp_path / "t.csv"))
    write_table(table.iloc[:1], str(tmp_path / "t.jsonl"))
    merged = merge_runs([str(tmp_path / "t.csv"), str(tmp_path / "t.jsonl")])
    pandas.testing.assert_frame_equal(merged.table, table)
    assert list(merged.repeated["run"]) == [table["run"].iloc[0]]
