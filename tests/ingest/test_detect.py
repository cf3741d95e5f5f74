"""Input kinds by content, and run-directory discovery."""

from __future__ import annotations

import bz2
import gzip
import json
import shutil
from pathlib import Path

import pytest

from oomlens.errors import InputError
from oomlens.ingest.detect import MAX_FILES, detect_kind, discover_run

ASSETS = Path(__file__).parents[1] / "assets" / "logs"
LAB = ASSETS / "lab_log_torch2.11_h200.txt"
ERROR_FILE = ASSETS / "torchelastic_error_file_example.json"
SAMPLE_PICKLE_HEAD = b"\x80\x04\x95"  # pickle protocol 4, as torch 2.11 writes snapshots


def _kernel_lines() -> str:
    # the kernel's formats (reference notes 1.11): dmesg, dmesg -T and journal stamps
    return (
        "\n".join(
            [
                "[ 5012.123456] python invoked oom-killer: gfp_mask=0x140cca, order=0, oom_score_"
                "adj=0",
                "[Mon Nov 30 04:58:18 2026] Out of memory: Killed process 4242 (python) total-vm:"
                "1024kB, "
                "anon-rss:512kB, file-rss:0kB, shmem-rss:0kB",
                "Nov 30 04:58:18 node-1 kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(nul"
                "l),task=python,pid=4242,uid=0",
            ]
        )
        + "\n"
    )


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (LAB.read_bytes(), "training_log"),
        (gzip.compress(LAB.read_bytes()), "training_log"),
        (bz2.compress(LAB.read_bytes()), "training_log"),
        (ERROR_FILE.read_bytes(), "elastic_error"),
        (
            json.dumps({"message": "OutOfMemoryError: x", "timestamp": 1796014820}).encode(),
            "elastic_error",
        ),
        (
            json.dumps(
                {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}
            ).encode(),
            "ds_config",
        ),
        (b'{"train_batch_size": 8, "bf16": {"enabled": true},}', "ds_config"),
        (SAMPLE_PICKLE_HEAD + b"\x00" * 64, "snapshot_pickle"),
        (gzip.compress(SAMPLE_PICKLE_HEAD + b"\x00" * 64), "snapshot_pickle"),
        (_kernel_lines().encode(), "kernel_log"),
        (bytes(range(256)) * 64, "unknown"),
        (b"# My project\nSome prose about torch and GPUs.\n", "unknown"),
        (b"", "unknown"),
        (b"[1, 2, 3]", "unknown"),
    ],
)
def test_kind_by_content_not_name(tmp_path: Path, content: bytes, kind: str) -> None:
    target = tmp_path / "misleading.pickle.log"
    target.write_bytes(content)
    detection = detect_kind(target)
    assert detection.kind_id == kind, detection.reason
    assert detection.reason


def test_real_snapshot_pickle_is_sniffed_without_loading_it() -> None:
    sample = Path(__file__).parents[1] / "assets" / "detect" / "snapshot_t211_enabled_state.pickle"
    detection = detect_kind(sample)
    assert detection.kind_id == "snapshot_pickle" and detection.reason == "pickle protocol 4"


def test_unreadable_input_raises() -> None:
    with pytest.raises(InputError):
        detect_kind("/nonexistent/run.log")


def _torchrun_log_dir(root: Path) -> None:
    """The ``--log-dir`` layout the lab run listed (E_logdir_listing), with the real contents."""
    run = root / "12eb2aba-c55e-4939-81ce-fe04c2057f58_bz6ra3wp" / "attempt_0"
    (run / "0").mkdir(parents=True)
    (run / "1").mkdir(parents=True)
    (run / "0" / "stderr.log").write_bytes(b"")
    (run / "0" / "stdout.log").write_bytes(b"")
    lines = LAB.read_text().splitlines()
    start = lines.index(
        "FILE /tmp/oomlab/trlogs/12eb2aba-c55e-4939-81ce-fe04c2057f58_bz6ra3wp/attempt_0/1/stderr"
        ".log 1032"
    )
    (run / "1" / "stderr.log").write_text("\n".join(lines[start + 1 : start + 10]) + "\n")
    (run / "1" / "stdout.log").write_text("hello from rank 1 stdout\n")
    shutil.copy(ERROR_FILE, run / "1" / "error.json")


def test_torchrun_log_dir_is_one_run_with_local_ranks(tmp_path: Path) -> None:
    _torchrun_log_dir(tmp_path)
    (tmp_path / "notes.png").write_bytes(b"\x89PNG")
    (tmp_path / ".git").mkdir()
    run = discover_run(tmp_path)
    assert run.layout == "torchrun_log_dir"
    kinds = sorted((f.location.local_rank, Path(f.path).name, f.kind.id) for f in run.files)
    assert kinds == [
        (1, "error.json", "elastic_error"),
        (1, "stderr.log", "training_log"),
        (1, "stdout.log", "training_log"),
    ]
    assert {f.location.attempt for f in run.files} == {0}
    reasons = {Path(p).name: why for p, why in run.skipped}
    assert (
        reasons["stderr.log"] == "empty"
        and "name" in reasons["notes.png"]
        and reasons[".git"] == "skipped directory"
    )


def test_deepspeed_each_rank_logs(tmp_path: Path) -> None:
    body = LAB.read_text().splitlines()[127:138]
    for rank in (0, 1):
        (tmp_path / f"20261130045900_rank{rank}.log").write_text(
            "\n".join(f"[rank{rank}]: {x}" for x in body) + "\n"
        )
    run = discover_run(tmp_path)
    assert run.layout == "deepspeed_rank_logs"
    assert sorted(f.location.rank for f in run.files) == [0, 1]


def test_directory_with_nothing_recognisable(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("nothing to see\n")
    run = discover_run(tmp_path)
    assert run.files == () and run.skipped
    with pytest.raises(InputError, match="not a directory"):
        discover_run(tmp_path / "README")


def _nested_json(levels: int, key: str = "x") -> bytes:
    """A small JSON object nested ``levels`` deep: the fuzzer's 1 KB RecursionError."""
    return ('{"' + key + '":' + "[" * levels + "]" * levels + "}").encode()


@pytest.mark.parametrize("levels", [70, 1000, 30_000])
def test_deeply_nested_json_is_told_not_crashed_on(tmp_path: Path, levels: int) -> None:
    target = tmp_path / "ds_config.json"
    target.write_bytes(_nested_json(levels))
    detection = detect_kind(target)
    assert detection.kind is None
    assert "nested" in detection.reason


def test_deeply_nested_json_beside_a_log_is_skipped_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes(LAB.read_bytes())
    (tmp_path / "ds_config.json").write_bytes(_nested_json(1000))
    (tmp_path / "error.json").write_bytes(_nested_json(1000, "message"))
    run = discover_run(tmp_path)
    assert [Path(f.path).name for f in run.files] == ["train.log"]
    reasons = {Path(p).name: why for p, why in run.skipped}
    assert "nested" in reasons["ds_config.json"] and "nested" in reasons["error.json"]


@pytest.mark.parametrize(
    "where", ["tail", "head", "middle"], ids=["zero-tail", "zero-head-over-64k", "zero-hole"]
)
def test_a_log_with_a_run_of_zero_bytes_is_still_a_log(tmp_path: Path, where: str) -> None:
    # What a crash leaves in a log file (a preallocated tail, a hole the writer never filled):
    # the zeros made the head "binary data" and the whole log, its OOM included, was refused.
    text = LAB.read_bytes()[:30000]
    zeros = b"\0" * 100_000
    data = {"tail": text + zeros, "head": zeros + text, "middle": text[:5000] + zeros + text}
    path = tmp_path / "train.log"
    path.write_bytes(data[where])
    detection = detect_kind(path)
    assert detection.kind is not None and detection.kind.id == "training_log", detection.reason


def test_zero_bytes_alone_are_no_log(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"\0" * 100_000)
    detection = detect_kind(path)
    assert detection.kind is None and detection.reason == "nothing but zero bytes"


def test_a_protocol_0_pickle_is_no_log_and_is_never_run(tmp_path: Path) -> None:
    # A text-like pickle that would run a command if unpickled: it was read as a quiet
    # training log ("the log ends mid-crash", exit 0).
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pickle"
    path.write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    detection = detect_kind(path)
    assert detection.kind is None and "pickle of protocol 0" in detection.reason
    assert not marker.exists()


@pytest.mark.parametrize("text", [b"Killed.", b"N.", b"step 1 loss 2.5\nI1\n."])
def test_text_that_ends_in_a_period_is_not_taken_for_a_pickle(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(text)
    assert "pickle" not in detect_kind(path).reason


def test_thousands_of_small_files_sorting_first_do_not_hide_the_runs_log(tmp_path: Path) -> None:
    # GIVEN a run directory where a job left more small files than discovery reads (one per
    # step, named so that they sort before everything else), beside its log and snapshot
    case = Path(__file__).resolve().parents[2] / "fixtures" / "crash_logs" / "memory_leak"
    run = tmp_path / "run"
    shutil.copytree(case, run)
    lines = (case / "train.log").read_text().splitlines()
    steps = MAX_FILES + 1
    for step in range(steps):
        (run / f"0_step{step:05d}").write_text(lines[step % len(lines)] + "\n")
    # WHEN it is walked
    found = discover_run(run)
    # THEN the log and the snapshots are read, and what was left out is said, with how many
    names = sorted(Path(f.path).name for f in found.files)
    assert "train.log" in names and "snapshot_rank0.pickle" in names
    assert found.truncated
    left_out = [why for _, why in found.skipped if why.startswith("not examined")]
    candidates = steps + len(list(case.iterdir()))
    assert len(left_out) == candidates - MAX_FILES
    assert left_out[0].startswith(f"not examined: one of {candidates - MAX_FILES} files left out")
