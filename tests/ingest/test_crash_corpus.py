"""The real crash corpus (``fixtures/crash_logs/<case>/``): every file is recognised by content,
every log parses, and the facts agree with what each run recorded in its ``case.json``
(exit code, failed ranks, every OOM message's numbers, phases, see_memory_usage series).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.analysis.ranks import rank_picture
from oomlens.ingest.detect import detect_kind, discover_run
from oomlens.ingest.log import read_log
from oomlens.ingest.log.kernel import read_kernel_log
from tests._corpus import case_dir, case_names, manifest
from tests.ingest._reading import problems, read_run

CASES = [case_dir(name) for name in case_names()]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_corpus_files_are_recognised_by_content(case: Path) -> None:
    expected = {
        "train.log": "training_log",
        "ds_config.json": "ds_config",
        "kernel.log": "kernel_log",
    }
    for path in case.iterdir():
        if path.is_dir():
            continue
        kind = detect_kind(path).kind_id
        if path.name in expected:
            assert kind == expected[path.name], path
        elif path.suffix == ".pickle":
            assert kind == "snapshot_pickle", path


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_corpus_logs_parse_and_agree_with_the_run(case: Path) -> None:
    log = case / "train.log"
    if not log.exists():
        pytest.skip("no train.log")
    facts = read_log(log)
    assert facts.lines > 0
    run = manifest(case.name)
    kernel = [read_kernel_log(case / "kernel.log")] if (case / "kernel.log").exists() else []
    failure_facts = (
        len(facts.oom_events)
        + len(facts.exceptions)
        + len(facts.process_failures)
        + len(facts.launcher_exits)
        + len(facts.batch_assertions)
        + len(facts.fatal_signals)
        + sum(len(k.oom_kills) for k in kernel)
    )
    if run.get("exit_code", 0) != 0 and not run.get("timed_out"):
        # a failed run leaves some trace the reader must find
        assert failure_facts > 0, (case.name, facts.notes)
    for exit_line in facts.launcher_exits:
        assert exit_line.return_code != 0
    picture = rank_picture([facts], kernel_logs=kernel)
    if facts.oom_events and run.get("exit_code", 0) != 0:
        assert picture.first_failed is not None


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_corpus_oom_numbers_ranks_and_phases_match_the_manifest(case: Path) -> None:
    record = manifest(case.name)
    expected, measured = record["expected"], record.get("measured", {})
    run = read_run(discover_run(case).files)
    assert not problems(run)
    picture = rank_picture(run.logs, run.error_files, run.kernel_logs)
    by_rank = {status.rank: status for status in picture.ranks}
    caught = [e for log in run.logs for e in log.caught_oom_events]
    for rank_text, numbers in measured.get("oom_messages_by_rank", {}).items():
        if expected["verdict"] == "no_failure":
            # OOMs the program caught and retried: read, but not what ended the run
            events = caught
        else:
            status = by_rank.get(int(rank_text))
            assert status is not None and status.outcome == "oom", (case.name, rank_text)
            events = list(status.oom_events)
        matching = []
        for event in events:
            message = event.message
            fields = {name: getattr(message, name) for name in numbers if name != "other_processes"}
            if "other_processes" in numbers:
                fields["other_processes"] = {str(p.pid): p.bytes for p in message.other_processes}
            if fields == numbers:
                matching.append(event)
        assert matching, (case.name, rank_text, [e.message for e in events])
        if expected.get("phase") and expected["verdict"] == "gpu_oom":
            assert {e.phase.value for e in matching} == {expected["phase"]}, case.name
    failed = expected.get("failed_ranks")
    if failed and expected["verdict"] != "no_failure":
        own = sorted(s.rank for s in picture.ranks if s.own_failure and s.rank is not None)
        assert own == sorted(failed), case.name
    if expected["verdict"] == "no_failure":
        assert picture.first_failed is None and not picture.peer_victims, case.name
        assert all(not log.oom_events and not log.exceptions for log in run.logs), case.name


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_corpus_memory_series_and_exit_codes_match_the_manifest(case: Path) -> None:
    record = manifest(case.name)
    run = read_run(discover_run(case).files)
    ma = record.get("measured", {}).get("see_memory_usage_MA_GB")
    if ma:
        series = [s for log in run.logs for s in log.memory]
        assert sum(s.total_samples for s in series) == ma["count"], case.name
        first = min(series, key=lambda s: s.samples[0].source.line or 0)
        assert round(first.allocated.first / 1024**3, 2) == ma["first"]
        assert round(series[-1].allocated.last / 1024**3, 2) == ma["last"]
    exits = [e.return_code for log in run.logs for e in log.launcher_exits]
    if exits:
        # the DeepSpeed runner exits with its launcher's return code (-9 is 247 to a shell)
        assert exits[-1] % 256 == record["exit_code"] % 256, case.name
    if record["exit_code"] != 0:
        assert any(
            log.oom_events or log.exceptions or log.launcher_exits or log.process_failures
            for log in run.logs
        ), case.name


def _picture(name: str):
    case = case_dir(name)
    run = read_run(discover_run(case).files)
    return run, rank_picture(run.logs, run.error_files, run.kernel_logs)


def test_host_oom_kill_is_attributed_through_the_launchers_pids() -> None:
    # deepspeed's launcher names each rank's pid; dmesg names the pid it killed
    run, picture = _picture("checkpoint_save_host_oom")
    assert picture.first_failed is not None
    assert (picture.first_failed.rank, picture.first_failed.outcome) == (0, "host_oom_kill")
    assert picture.first_failed.kernel_kills[0].cgroup
    assert picture.peer_victims == (1,)
    assert [e.return_code for e in picture.launcher_exits] == [-9]
    (log,) = run.logs
    assert any("Killing subprocess" in text for _, text in log.tail)


def test_collective_timeout_points_at_the_rank_that_did_not_time_out() -> None:
    _, picture = _picture("nccl_timeout")
    assert picture.first_failed is None
    assert picture.timed_out_ranks == (0,) and picture.suspected_stragglers == (1,)


def test_not_an_oom_cublas_status_error_is_an_exception() -> None:
    run, picture = _picture("device_side_assert")
    assert all(not log.oom_events for log in run.logs)
    assert picture.first_failed is not None and picture.first_failed.outcome == "exception"
    assert picture.first_failed.rank == 1 and picture.first_failed.signal == "SIGABRT"


def test_tee_and_log_dir_copies_of_one_oom_count_once() -> None:
    # generation_oom ran under torchrun --tee 3 --log-dir: each OOM is in train.log and in the
    # rank's own stderr.log
    run, picture = _picture("generation_oom")
    assert len(run.logs) > 1
    assert [len(s.oom_events) for s in picture.ranks if s.rank in (0, 1)] == [1, 1]
