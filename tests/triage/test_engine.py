"""Triage of trees made of the real corpus: one correct row per run, incremental re-runs,
broken and hanging runs, HTML reports, and shards that merge into the single run's table."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import pandas
import pandas.testing
import pytest

from oomlens.triage import adapter
from oomlens.triage.engine import Shard, TriageOptions, TriageResult, triage
from oomlens.triage.merge import merge_tables
from oomlens.triage.outputs import write_table
from oomlens.triage.summary import group_table
from tests.triage import _tasks
from tests.triage._trees import BASE_TIME, COPIED_TWICE, copy_case, corpus_tree, expected


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("archive")
    return root, corpus_tree(root)


@pytest.fixture(scope="module")
def clean_run(tree: tuple[Path, dict[str, str]]) -> TriageResult:
    """One triage of the whole tree without a store: the reference table."""
    return triage([str(tree[0])], TriageOptions(jobs=2, store=None))


def test_one_row_per_run_with_the_case_s_expected_verdict_and_diagnosis(
    tree: tuple[Path, dict[str, str]], clean_run: TriageResult
) -> None:
    root, runs = tree
    table = clean_run.table
    assert sorted(table["run"]) == sorted(runs)
    assert clean_run.found == len(runs) and clean_run.analyzed == len(runs)
    for row in table.itertuples():
        want = expected(runs[row.run])
        assert row.path == str(root / row.run)
        assert row.verdict == want["verdict"], row.run
        allowed = {want["diagnosis"], *want.get("acceptable", [])} - {None}  # type: ignore[misc]
        if allowed:
            assert row.diagnosis in allowed, row.run
        failed = want.get("failed_ranks") or []
        if failed and not pandas.isna(row.first_failed_rank):
            assert row.first_failed_rank in failed, row.run
        assert pandas.isna(row.error), row.run


def test_rows_are_newest_first_by_the_runs_own_time(
    tree: tuple[Path, dict[str, str]], clean_run: TriageResult
) -> None:
    root, runs = tree
    table = clean_run.table
    times = list(table["time"])
    assert times == sorted(times, reverse=True)
    by_run = {row.run: row for row in table.itertuples()}
    logged = 0
    for row in table.itertuples():
        if row.time_source == "log":
            # the time the run's own log printed when it failed, not when its files were copied
            logged += 1
            clock = row.time[11:19]  # the log prints its own formats of date and time
            logs = [path for path in (root / row.run).rglob("*") if path.suffix != ".pickle"]
            assert any(
                clock in path.read_text(errors="replace") for path in logs if path.is_file()
            ) or clock in _captured_clocks(root / row.run), row.run
        else:
            assert row.time_source == "file" and row.time.endswith("Z"), row.run
    assert logged >= 5
    for case in COPIED_TWICE:
        # a copy made a day later failed when the original did
        copy, original = by_run[f"2026-12-01/{case}-copy"], by_run[f"cases/{case}"]
        if copy.time_source == "log":
            assert copy.time == original.time
        else:
            assert copy.time > original.time


def _captured_clocks(run: Path) -> set[str]:
    """The clock times of an oomlens capture's records under ``run`` (it writes seconds since
    the epoch; they read as local times, like a log's)."""
    clocks = set()
    for path in run.rglob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("t"), int | float):
                clocks.add(datetime.fromtimestamp(record["t"]).strftime("%H:%M:%S"))
    return clocks


def test_runs_that_failed_the_same_way_are_one_group(clean_run: TriageResult) -> None:
    groups = group_table(clean_run.table)
    assert groups["runs"].sum() == len(clean_run.table)
    table = clean_run.table
    for case in COPIED_TWICE:
        copies = table[table["run"].isin([f"cases/{case}", f"2026-12-01/{case}-copy"])]
        assert len(copies) == 2
        labels = set(copies["group"])
        assert len(labels) == 1, (case, labels)
        [label] = labels
        assert int(groups[groups["group"] == label]["runs"].iloc[0]) >= 2
    assert groups.iloc[-1]["verdict"] == "no_failure"  # healthy runs come last


def test_oom_rows_carry_the_message_numbers(
    tree: tuple[Path, dict[str, str]], clean_run: TriageResult
) -> None:
    _, runs = tree
    from tests._corpus import manifest

    row = clean_run.table.set_index("run").loc["cases/model_states_too_large"]
    measured = manifest("model_states_too_large")["measured"]["oom_messages_by_rank"]["0"]
    assert row["tried_to_allocate"] == measured["tried_to_allocate"]
    assert row["allocated_by_pytorch"] == measured["allocated_by_pytorch"]
    assert row["reserved_unallocated"] == measured["reserved_unallocated"]
    assert row["capacity"] == measured["allowed"]


def test_a_rerun_analyzes_only_what_is_new_or_changed(tmp_path: Path) -> None:
    # GIVEN three runs triaged once into a store
    store = str(tmp_path / "store.sqlite")
    archive = tmp_path / "archive"
    for n, case in enumerate(("fragmentation", "nccl_timeout", "memory_leak_fixed")):
        copy_case(case, archive / case, moment=BASE_TIME + n)
    options = TriageOptions(jobs=2, store=store)
    first = triage([str(archive)], options)
    assert (first.analyzed, first.reused) == (3, 0)
    # WHEN nothing changed, THEN nothing is analyzed and the table is the same
    again = triage([str(archive)], options)
    assert (again.analyzed, again.reused) == (0, 3)
    pandas.testing.assert_frame_equal(again.table, first.table)
    # WHEN a file is touched without changing its content, THEN its hash says it is the same
    os.utime(archive / "nccl_timeout" / "train.log", (BASE_TIME + 99, BASE_TIME + 99))
    touched = triage([str(archive)], options)
    assert touched.analyzed == 0
    # WHEN a log grows and a run is added, THEN those two are analyzed
    with open(archive / "fragmentation" / "train.log", "a") as log:
        log.write("Killed\n")
    copy_case("device_side_assert", archive / "device_side_assert", moment=BASE_TIME + 5)
    changed = triage([str(archive)], options)
    assert (changed.analyzed, changed.reused) == (2, 2)
    # WHEN a run is deleted, THEN its row goes
    shutil.rmtree(archive / "memory_leak_fixed")
    removed = triage([str(archive)], options)
    assert removed.analyzed == 0
    assert sorted(removed.table["run"]) == ["device_side_assert", "fragmentation", "nccl_timeout"]


def test_a_broken_run_is_a_row_with_its_error_and_the_batch_goes_on(tmp_path: Path) -> None:
    copy_case("fragmentation", tmp_path / "good", moment=BASE_TIME)
    broken = tmp_path / "broken"
    broken.mkdir()
    # binary garbage under a log's name: the walk takes it for a run, the analysis cannot
    (broken / "train.log").write_bytes(bytes(range(256)) * 64)
    result = triage([str(tmp_path)], TriageOptions(jobs=2, store=None))
    rows = result.table.set_index("run")
    assert rows.loc["good", "verdict"] == "gpu_oom" and pandas.isna(rows.loc["good", "error"])
    assert rows.loc["broken", "verdict"] == "unknown"
    assert "no usable input" in rows.loc["broken", "error"]
    assert rows.loc["broken", "group"] == "unknown"


def test_hostile_files_beside_a_good_log_cost_only_themselves(tmp_path: Path) -> None:
    # the fuzzer's deeply nested JSON as the run's config and error file, and a FIFO: the run
    # is still analyzed from its log, with no error
    run = copy_case("fragmentation", tmp_path / "run", moment=BASE_TIME)
    nested = '{"x":' + "[" * 1000 + "]" * 1000 + "}"
    (run / "ds_config.json").write_text(nested)
    (run / "error.json").write_text(nested.replace('"x"', '"message"'))
    os.mkfifo(run / "stderr.log")
    result = triage([str(tmp_path)], TriageOptions(jobs=1, store=None, timeout=60))
    row = result.table.set_index("run").loc["run"]
    assert row["verdict"] == "gpu_oom" and row["diagnosis"] == "fragmentation"
    assert pandas.isna(row["error"])


def test_a_hanging_analysis_is_stopped_and_recorded(tmp_path: Path) -> None:
    copy_case("fragmentation", tmp_path / "a", moment=BASE_TIME)
    copy_case("nccl_timeout", tmp_path / "b", moment=BASE_TIME)
    store = str(tmp_path / "s.sqlite")
    options = TriageOptions(jobs=2, store=store, timeout=1.0)
    result = triage([str(tmp_path)], options, analyze=_tasks.hang_on_nccl)
    rows = result.table.set_index("run")
    assert rows.loc["b", "error"] == "analysis took longer than 1 s and was stopped"
    assert rows.loc["a", "verdict"] == "gpu_oom"
    # a stored error is not retried unless asked
    assert triage([str(tmp_path)], options).analyzed == 0
    retried = triage([str(tmp_path)], TriageOptions(jobs=2, store=store, retry_errors=True))
    assert retried.analyzed == 1
    assert retried.table.set_index("run").loc["b", "verdict"] == "other_failure"


def test_shards_split_the_runs_and_merge_into_the_single_run_s_table(
    tree: tuple[Path, dict[str, str]], clean_run: TriageResult, tmp_path: Path
) -> None:
    root, runs = tree
    shard_tables = []
    seen: list[str] = []
    for index, suffix in zip((1, 2, 3), (".jsonl", ".parquet", ".sqlite"), strict=True):
        part = triage([str(root)], TriageOptions(jobs=2, store=None, shard=Shard(index, 3)))
        assert part.found == len(runs)
        seen.extend(part.table["run"])
        path = str(tmp_path / f"shard-{index}{suffix}")
        write_table(part.table, path)
        shard_tables.append(path)
    assert sorted(seen) == sorted(runs)  # every run in exactly one shard
    merged = merge_tables(shard_tables)
    pandas.testing.assert_frame_equal(merged, clean_run.table)


def test_html_reports_are_written_and_reused(tmp_path: Path) -> None:
    copy_case("fragmentation", tmp_path / "runs" / "a", moment=BASE_TIME)
    reports = tmp_path / "reports"
    options = TriageOptions(jobs=1, store=str(tmp_path / "s.sqlite"), reports_dir=str(reports))
    first = triage([str(tmp_path / "runs")], options)
    report = first.table["report"].iloc[0]
    if not adapter.html_available():
        assert pandas.isna(report)
        assert any("HTML reports are not available" in w for w in first.warnings)
        return
    assert os.path.isfile(report) and os.path.dirname(report) == str(reports)
    assert triage([str(tmp_path / "runs")], options).analyzed == 0
    os.unlink(report)  # a deleted report is made again
    assert triage([str(tmp_path / "runs")], options).analyzed == 1
    assert os.path.isfile(report)


def test_a_config_override_is_part_of_what_was_analyzed(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    copy_case("prefetch_overshoot", archive / "a", moment=BASE_TIME)
    copy_case("prefetch_fits", archive / "b", moment=BASE_TIME + 1)
    store = str(tmp_path / "s.sqlite")
    assert triage([str(archive)], TriageOptions(jobs=2, store=store)).analyzed == 2
    # GIVEN the default settings' config forced on every run
    config = str(archive / "b" / "ds_config.json")
    forced = TriageOptions(jobs=2, store=store, config=config)
    result = triage([str(archive)], forced)
    # THEN both runs are analyzed again, with it, and the next call reuses that
    assert result.analyzed == 2
    assert triage([str(archive)], forced).analyzed == 0
    assert triage([str(archive)], TriageOptions(jobs=2, store=store)).analyzed == 2
