"""Reading capture files: recognised by content, merged with the log of the same run, and
hostile content (cut lines, wrong types, huge lines, unknown versions) never raises.

The records are written by the capture's own writer; the OOM message and traceback they carry
are the real ones of the corpus' fragmentation run (read from its log by oomlens)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from oomlens.capture.writer import JsonLines, Stop, encode
from oomlens.facts.capture import CaptureEnd
from oomlens.ingest import capture as capture_reader
from oomlens.ingest.capture import read_captures
from oomlens.ingest.detect import detect_kind
from oomlens.ingest.log import read_log
from oomlens.report import Verdict
from oomlens.session import analyze, gather_facts
from tests._corpus import case_dir

T0 = 1_796_000_000.0


def _write(path: Path, kind: str, records: list[dict[str, Any]], rank: int | None = 0) -> Path:
    writer = JsonLines(
        str(path),
        {"file": kind, "run": "r", "rank": rank, "host": "node-a", "pid": 4242},
        10**7,
        Stop(),
    )
    writer.write([encode(r) for r in records])
    writer.close()
    return path


def _real_oom() -> tuple[str, str, list[list[Any]]]:
    log = read_log(case_dir("fragmentation") / "train.log")
    event = log.oom_events[0]
    assert event.traceback is not None and event.message.exception_class is not None
    frames = [[f.filename, f.line, f.function] for f in event.traceback.frames]
    return event.message.exception_class, event.message.text, frames


def _oom_capture(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    cls, message, frames = _real_oom()
    _write(
        directory / "rank0.events.jsonl",
        "events",
        [
            {"t": T0, "kind": "start", "rank": 0, "python": "3.12.3"},
            {"t": T0 + 1, "kind": "torch", "version": "2.11.0+cu130", "cuda": "13.0"},
            {
                "t": T0 + 30,
                "kind": "oom",
                "device": 0,
                "requested": 44040192,
                "limit": 6979321856,
                "device_free": 142412480512,
                "total": 150109880320,
                "allowed": 6979321856,
                "counters": {"alloc": 3704000000, "reserved": 6950000000},
                "snapshot": None,
                "nvml": {"self_pid": 4242, "processes": [{"pid": 4242, "bytes": 7688000000}]},
            },
            {
                "t": T0 + 31,
                "kind": "exception",
                "chain": [{"class": cls, "message": message, "frames": frames}],
            },
            {"t": T0 + 31.5, "kind": "exit", "code": 1},
        ],
    )
    _write(
        directory / "rank0.series.jsonl",
        "series",
        [
            {
                "t": T0 + i,
                "src": "timer",
                "alloc": 2**30 + i * 2**24,
                "reserved": 2**31,
                "rss": 2**31,
            }
            for i in range(20)
        ],
    )
    return directory


def test_capture_files_are_recognised_by_content_even_with_deepspeed_keys(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "whatever.txt",
        "events",
        [{"kind": "deepspeed_config", "lines": ['  json = {"train_batch_size": 8}']}],
    )
    assert detect_kind(path).kind_id == "capture"


def test_a_captured_oom_is_an_oom_event_with_its_phase_and_time(tmp_path: Path) -> None:
    facts = gather_facts([_oom_capture(tmp_path)])
    (capture,) = facts.captures
    assert capture.end is CaptureEnd.EXCEPTION and capture.exit_code == 1
    (event,) = facts.oom_events()
    assert event.origin == "capture" and event.rank == 0
    assert event.message.tried_to_allocate == 42 * 2**20
    logged = read_log(case_dir("fragmentation") / "train.log").oom_events[0]
    assert (event.phase, event.phase_evidence) == (logged.phase, logged.phase_evidence)
    assert event.timestamp is not None and event.timestamp_exact
    (oom,) = capture.ooms
    assert oom.requested == 44040192 and not oom.other_processes
    assert capture.memory is not None and capture.memory.total_samples == 20
    assert facts.ranks.first_failed is not None and facts.ranks.first_failed.rank == 0


def test_the_log_and_the_capture_of_one_oom_are_one_event(tmp_path: Path) -> None:
    _oom_capture(tmp_path / "cap")
    shutil.copy(case_dir("fragmentation") / "train.log", tmp_path / "train.log")
    report = analyze([tmp_path])
    assert report.verdict is Verdict.GPU_OOM
    (event,) = report.facts.oom_events()
    assert event.origin == "log"  # the log's line is what the report cites
    (status,) = report.facts.ranks.ranks
    assert status.first_time is not None  # ...with the time only the capture knew


def test_a_cut_last_line_and_hostile_values_are_skipped(tmp_path: Path) -> None:
    events = _write(
        tmp_path / "rank3.events.jsonl",
        "events",
        [
            {"t": "yesterday", "kind": "start", "rank": [1]},
            {"t": 1e300, "kind": "model", "params": "many"},
            {"kind": "exception", "chain": [{"class": 5, "frames": [["f", "x", None]]}, "junk"]},
            {"kind": "oom", "counters": [], "nvml": {"processes": [{"pid": "1"}, 7]}},
            {"kind": "gone", "memory_events_before": [], "memory_events_after": {"oom_kill": 1}},
            {"kind": "policy", "stacks": "python", "reason": 42},
        ],
        rank=3,
    )
    with open(events, "a") as handle:
        handle.write('[1, 2]\nnot json\n{"t": 1, "kind": "exit", "co')  # cut by a kill
    series = _write(
        tmp_path / "rank3.series.jsonl",
        "series",
        [{"t": T0, "alloc": "x", "reserved": 1}, {"t": T0, "alloc": 5, "reserved": 7, "step": -1}],
        rank=3,
    )
    read = read_captures([(str(events), None), (str(series), None)])
    assert not read.problems
    (capture,) = read.ranks
    assert capture.rank == 3 and capture.end is CaptureEnd.KILLED
    assert capture.gone is not None and capture.gone.oom_kills is None
    assert capture.params is None and capture.started is None
    assert capture.memory is not None and capture.memory.total_samples == 1
    assert any("cut" in p for p in capture.problems)
    assert any("2 unreadable" in p for p in capture.problems)


def test_unknown_versions_and_huge_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    future = tmp_path / "rank0.events.jsonl"
    future.write_text(json.dumps({"oomlens_capture": 99, "file": "events"}) + "\n")
    read = read_captures([(str(future), None)])
    assert not read.ranks and "unknown format version" in read.problems[0].message
    monkeypatch.setattr(capture_reader, "MAX_LINE_BYTES", 200)
    events = _write(
        tmp_path / "rank1.events.jsonl",
        "events",
        [{"kind": "note", "text": "x" * 1000}, {"t": T0, "kind": "exit", "code": 0}],
        rank=1,
    )
    (capture,) = read_captures([(str(events), None)]).ranks
    assert capture.end is CaptureEnd.EXITED and capture.notes == ()


def test_a_series_without_its_events_file_still_counts(tmp_path: Path) -> None:
    series = _write(tmp_path / "rank0.series.jsonl", "series", [{"t": T0, "rss": 10}])
    (capture,) = read_captures([(str(series), None)]).ranks
    assert capture.end is CaptureEnd.VANISHED
    assert capture.host_memory is not None and capture.host_memory.total_samples == 1


@pytest.mark.parametrize("depth", [200, 3_000, 40_000])
def test_a_line_nested_too_deep_costs_that_line_only(tmp_path: Path, depth: int) -> None:
    directory = _oom_capture(tmp_path / "cap")
    nested = {
        "objects": '{"kind": "note", "v": ' + '{"a": ' * depth + "1" + "}" * depth + "}",
        "arrays": '{"t": 1, "alloc": ' + "[" * depth + "]" * depth + "}",
    }
    for name, bad in (("rank0.events.jsonl", nested["objects"]), ("rank0.series.jsonl", None)):
        path = directory / name
        lines = path.read_text().splitlines(keepends=True)
        # after the header, and once more among the records
        lines[1:1] = [(bad or nested["arrays"]) + "\n"]
        lines[4:4] = [nested["arrays"] + "\n"]
        path.write_text("".join(lines))

    facts = gather_facts([directory])

    (capture,) = facts.captures
    assert capture.end is CaptureEnd.EXCEPTION and capture.exit_code == 1
    (oom,) = capture.ooms
    assert oom.requested == 44040192
    assert capture.memory is not None and capture.memory.total_samples == 20
