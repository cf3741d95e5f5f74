"""The capture's files: headers, flushed appends, byte budgets, compaction, atomic whole files,
and a write error (a full disk) that stops everything with one line."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path
from typing import IO

from oomlens.capture.writer import (
    KEEP_RECENT_LINES,
    JsonLines,
    Stop,
    encode,
    write_whole,
)
from oomlens.ingest.kinds.capture import is_capture_head


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_header_then_records_each_flushed_on_write(tmp_path: Path) -> None:
    path = tmp_path / "rank0.events.jsonl"
    stop = Stop(io.StringIO())
    events = JsonLines(str(path), {"file": "events", "rank": 0}, 10_000, stop)
    events.write([encode({"kind": "start"}), encode({"kind": "exit", "code": 0})])
    # no close: what a killed process leaves is what was flushed
    assert _lines(path) == [
        {"oomlens_capture": 1, "file": "events", "rank": 0},
        {"kind": "start"},
        {"kind": "exit", "code": 0},
    ]
    assert is_capture_head(path.read_bytes())


def test_non_finite_numbers_are_written_as_null() -> None:
    assert json.loads(encode({"a": float("nan"), "b": [float("inf"), 1.5]})) == {
        "a": None,
        "b": [None, 1.5],
    }


def test_events_over_budget_are_counted_not_written(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    events = JsonLines(str(path), {"file": "events"}, 300, Stop(io.StringIO()))
    for index in range(50):
        events.write([encode({"kind": "note", "index": index})])
    assert path.stat().st_size <= 300
    written = len(_lines(path)) - 1
    assert written > 0 and events.dropped == 50 - written


def test_a_full_series_is_thinned_and_keeps_its_recent_part(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    budget = 400_000
    series = JsonLines(str(path), {"file": "series"}, budget, Stop(io.StringIO()), compact=True)
    halvings = 0
    total = 20_000
    for index in range(total):
        halvings += series.write([encode({"t": index, "alloc": index * 1000})])
    series.close()
    records = _lines(path)
    assert records[0]["file"] == "series"
    indices = [int(r["t"]) for r in records[1:]]  # type: ignore[call-overload]
    assert path.stat().st_size <= budget
    assert halvings == series.compactions >= 1
    assert indices == sorted(indices) and indices[0] == 0  # the start is kept, thinned
    assert indices[-KEEP_RECENT_LINES // 4 :] == list(range(total - KEEP_RECENT_LINES // 4, total))
    assert not list(tmp_path.glob("*.tmp"))


class _FailingFile(io.StringIO):
    def __init__(self, fail_after: int) -> None:
        super().__init__()
        self.fail_after = fail_after

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.fail_after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def test_a_write_error_stops_all_recording_with_one_line(tmp_path: Path) -> None:
    stderr = io.StringIO()
    stop = Stop(stderr)

    def opener(path: str, mode: str) -> IO[str]:
        return _FailingFile(200)

    events = JsonLines(str(tmp_path / "e"), {"file": "events"}, 10**6, stop, opener=opener)
    series = JsonLines(str(tmp_path / "s"), {"file": "series"}, 10**6, stop, opener=opener)
    for index in range(20):
        events.write([encode({"kind": "note", "text": "x" * 30, "i": index})])
        series.write([encode({"t": index})])
    assert stop.stopped
    assert stderr.getvalue().count("\n") == 1
    assert stderr.getvalue().startswith("oomlens capture: recording stopped: ")
    assert "No space left on device" in stderr.getvalue()
    assert not write_whole(str(tmp_path / "snapshot.pickle"), b"data", stop)


def test_whole_files_appear_complete_or_not_at_all(tmp_path: Path) -> None:
    stop = Stop(io.StringIO())
    target = tmp_path / "rank0.snapshot.pickle"
    assert write_whole(str(target), b"\x80\x04first", stop)
    assert write_whole(str(target), b"\x80\x04second", stop)
    assert target.read_bytes() == b"\x80\x04second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.snapshot.pickle"]
    missing = tmp_path / "no-such-dir" / "x.pickle"
    assert not write_whole(str(missing), b"data", stop) and stop.stopped
