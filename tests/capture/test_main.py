"""``python -m oomlens.capture`` on a CPU build: the training runs exactly as without it, and
leaves a capture directory ``oomlens analyze`` reads (real subprocesses, real torch)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.facts.capture import CaptureEnd
from oomlens.report import Verdict
from oomlens.session import analyze, gather_facts
from tests.capture._run import TRAIN, captured, clean_env, kinds, plain, records, run, wait_for

pytestmark = pytest.mark.torch


def _only_run_dir(base: Path) -> Path:
    runs = [p for p in base.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_training_runs_to_the_same_result_and_leaves_a_readable_capture(tmp_path: Path) -> None:
    args = ("--steps", "24", "--workers", "2", "--sleep", "0.05")
    without = plain(tmp_path, *args)
    with_capture = captured(tmp_path, *args, OOMLENS_CAPTURE_DIR=str(tmp_path / "cap"))
    assert without.returncode == 0, without.stderr
    assert with_capture.returncode == 0, with_capture.stderr
    assert with_capture.stdout == without.stdout  # same argv, same losses to the last bit
    assert "oomlens" not in with_capture.stderr
    run_dir = _only_run_dir(tmp_path / "cap")
    events = run_dir / "rank0.events.jsonl"
    series = run_dir / "rank0.series.jsonl"
    assert records(events)[0]["oomlens_capture"] == 1
    assert records(series)[0]["file"] == "series"
    assert kinds(events)[:2] == ["header", "start"]
    assert "exit" in kinds(events)
    exit_record = next(r for r in records(events) if r.get("kind") == "exit")
    assert exit_record["code"] == 0 and exit_record["step"] == 24
    model = next(r for r in records(events) if r.get("kind") == "model")
    assert model["params"] == 32 * 64 + 64 + 64 + 1  # the optimizer's parameters
    # the forked DataLoader workers wrote nothing of their own
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.endswith("kernel.log")) == [
        "rank0.events.jsonl",
        "rank0.series.jsonl",
    ]
    report = analyze([run_dir])
    assert report.verdict is Verdict.NO_FAILURE
    (capture,) = report.facts.captures
    assert capture.end is CaptureEnd.EXITED and capture.exit_code == 0
    assert capture.host_memory is not None and capture.host_memory.last is not None
    assert capture.host_memory.last.rss and capture.host_memory.last.rss > 10 * 2**20
    assert dict(capture.versions)["torch"].startswith("2.")


def test_an_exception_is_recorded_and_printed_as_python_prints_it(tmp_path: Path) -> None:
    without = plain(tmp_path, "--steps", "4", "--fail")
    with_capture = captured(tmp_path, "--steps", "4", "--fail", OOMLENS_CAPTURE_DIR="cap")
    assert without.returncode == with_capture.returncode == 1
    assert with_capture.stdout == without.stdout
    assert with_capture.stderr == without.stderr  # no wrapper frame in the traceback
    run_dir = _only_run_dir(tmp_path / "cap")
    exception = next(
        r for r in records(run_dir / "rank0.events.jsonl") if r.get("kind") == "exception"
    )
    (root,) = exception["chain"]
    assert root["class"] == "RuntimeError" and root["message"] == "boom at the end"
    assert [f[2] for f in root["frames"]] == ["<module>"]
    assert root["frames"][0][0] == str(TRAIN)
    report = analyze([run_dir])
    assert report.verdict is Verdict.OTHER_FAILURE
    assert report.top is not None and report.top.id == "not_oom"
    assert "RuntimeError" in report.top.summary or "RuntimeError" in report.top.evidence[0].text


def test_sys_exit_passes_its_code_through(tmp_path: Path) -> None:
    result = captured(tmp_path, "--steps", "2", "--exit", "3", OOMLENS_CAPTURE_DIR="cap")
    assert result.returncode == 3
    run_dir = _only_run_dir(tmp_path / "cap")
    exit_record = next(
        r for r in records(run_dir / "rank0.events.jsonl") if r.get("kind") == "exit"
    )
    assert exit_record["code"] == 3


def test_deepspeed_launcher_local_rank_reaches_the_script(tmp_path: Path) -> None:
    # DeepSpeed's launch.py runs: python -u -m oomlens.capture --local_rank=1 train.py ARGS
    env = clean_env(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", OOMLENS_CAPTURE_DIR="cap")
    result = run(
        [
            sys.executable,
            "-u",
            "-m",
            "oomlens.capture",
            "--local_rank=1",
            str(TRAIN),
            "--steps",
            "2",
        ],
        env,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "argv ['--local_rank=1', '--steps', '2']" in result.stdout
    run_dir = _only_run_dir(tmp_path / "cap")
    assert (run_dir / "rank1.events.jsonl").exists()
    start = records(run_dir / "rank1.events.jsonl")[1]
    assert (start["rank"], start["local_rank"], start["world_size"]) == (1, 1, 2)


def test_torchrun_ranks_meet_in_one_directory(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    env = clean_env(OOMLENS_CAPTURE_DIR=str(tmp_path / "cap"), OMP_NUM_THREADS="1")
    result = run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "oomlens.capture",
            str(TRAIN),
            "--steps",
            "6",
        ],
        env,
        tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = _only_run_dir(tmp_path / "cap")
    assert run_dir.name.startswith("torchrun-")
    names = {p.name for p in run_dir.iterdir()}
    assert {"rank0.events.jsonl", "rank1.events.jsonl", "rank0.series.jsonl"} <= names
    facts = gather_facts([run_dir])
    assert sorted(c.rank for c in facts.captures) == [0, 1]
    assert facts.world_size is not None and facts.world_size.value == 2


def test_a_killed_process_leaves_files_that_parse(tmp_path: Path) -> None:
    env = clean_env(OOMLENS_CAPTURE_DIR=str(tmp_path / "cap"), OOMLENS_CAPTURE_INTERVAL="0.2")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oomlens.capture",
            str(TRAIN),
            "--steps",
            "100000",
            "--sleep",
            "0.01",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def sampled() -> bool:
            found = list((tmp_path / "cap").glob("*/rank0.series.jsonl"))
            return bool(found) and len(found[0].read_text().splitlines()) >= 6

        assert wait_for(sampled, 60)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    run_dir = _only_run_dir(tmp_path / "cap")
    events = run_dir / "rank0.events.jsonl"
    assert wait_for(lambda: "gone" in kinds(events)), "the sentinel recorded no disappearance"
    assert "exit" not in kinds(events)
    facts = gather_facts([run_dir])
    (capture,) = facts.captures
    assert capture.end is CaptureEnd.KILLED
    assert capture.gone is not None and capture.gone.oom_kills == 0
    assert not capture.killed_for_memory  # a SIGKILL, but not the OOM killer's
    assert capture.host_memory is not None and capture.host_memory.total_samples >= 5
    report = analyze([run_dir])
    assert report.verdict is Verdict.UNKNOWN
    assert "without an exit record" in report.verdict_reason


def test_a_full_disk_stops_recording_with_one_line_and_training_goes_on(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    run_dir = tmp_path / "cap" / "fixed"
    run_dir.mkdir(parents=True)
    (run_dir / "rank0.series.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    args = ("--steps", "24", "--sleep", "0.05")
    without = plain(tmp_path, *args)
    result = captured(
        tmp_path, *args, OOMLENS_CAPTURE_DIR=str(tmp_path / "cap"), OOMLENS_CAPTURE_RUN="fixed"
    )
    assert result.returncode == 0
    assert result.stdout == without.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("oomlens")]
    assert len(lines) == 1, result.stderr
    assert "recording stopped" in lines[0] and "No space left on device" in lines[0]


def test_capture_off_and_bad_settings_leave_the_training_alone(tmp_path: Path) -> None:
    off = captured(tmp_path, "--steps", "2", OOMLENS_CAPTURE="0", OOMLENS_CAPTURE_DIR="cap")
    assert off.returncode == 0 and not (tmp_path / "cap").exists()
    bad = captured(tmp_path, "--steps", "2", OOMLENS_CAPTURE_MAX_MB="lots")
    assert bad.returncode == 0
    assert bad.stderr.strip().splitlines() == [
        "oomlens capture: not started: OOMLENS_CAPTURE_MAX_MB must be a number, got 'lots'"
    ]
    assert "final loss" in bad.stdout


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ([], ["--bogus", str(TRAIN)], [str(tmp_path / "missing.py")]):
        result = run([sys.executable, "-m", "oomlens.capture", *args], clean_env(), tmp_path)
        assert result.returncode == 2
        assert result.stderr.startswith("oomlens capture: ")


def test_install_from_the_script(tmp_path: Path) -> None:
    result = run(
        [sys.executable, str(TRAIN), "--install", "--steps", "3", "--fail"],
        clean_env(OOMLENS_CAPTURE_DIR="cap"),
        tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("RuntimeError: boom at the end")
    run_dir = _only_run_dir(tmp_path / "cap")
    assert kinds(run_dir / "rank0.events.jsonl").count("exception") == 1


def test_the_deepspeed_config_is_recorded_as_deepspeed_resolved_it(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    result = captured(
        tmp_path, "--steps", "2", "--deepspeed-config", OOMLENS_CAPTURE_DIR=str(tmp_path / "c")
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = _only_run_dir(tmp_path / "c")
    facts = gather_facts([run_dir])
    assert facts.config is not None and facts.config.origin == "capture"
    zero = facts.config.reading.effective.zero
    assert zero.stage.value == 3
    assert zero.prefetch_bucket_size.value == 10_000_000_000
    assert facts.config.reading.effective.precision.param_bytes == 2  # bf16


def test_a_module_runs_as_python_dash_m_runs_it(tmp_path: Path) -> None:
    package = tmp_path / "pkgx"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint(sys.argv[1:])\nraise SystemExit(4)\n")
    result = run(
        [sys.executable, "-m", "oomlens.capture", "-m", "pkgx.train", "--a", "1"],
        clean_env(OOMLENS_CAPTURE_DIR="cap", PYTHONPATH=f"{tmp_path}{os.pathsep}{os.getcwd()}"),
        tmp_path,
    )
    assert (result.returncode, result.stdout) == (4, "['--a', '1']\n"), result.stderr
    exit_record = next(
        r
        for r in records(_only_run_dir(tmp_path / "cap") / "rank0.events.jsonl")
        if r.get("kind") == "exit"
    )
    assert exit_record["code"] == 4
