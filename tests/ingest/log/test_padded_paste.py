"""A paste read after any length of other lines shows what it shows alone (issue 33: a field
paste padded past 1 MiB with a healthy run's lines is read in bulk, and lost the evidence only
the line-by-line reading finds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.ingest.log import read_log
from oomlens.ingest.log import reader as reader_module

ROOT = Path(__file__).resolve().parents[3]
FIELD = ROOT / "fixtures" / "field_logs"


def _padded(paste: Path, healthy: Path, tmp_path: Path) -> Path:
    """The paste after more than LINE_BY_LINE_BYTES of the healthy run's lines, repeated."""
    body = healthy.read_bytes().rstrip(b"\n") + b"\n"
    padding = body * (2 * reader_module.LINE_BY_LINE_BYTES // len(body) + 2)
    path = tmp_path / "padded.txt"
    path.write_bytes(padding + paste.read_bytes())
    return path


def test_an_oom_message_without_its_header_survives_padding(tmp_path: Path) -> None:
    # the paste: the middle of an OOM message, cut before "CUDA out of memory" (only the
    # paste reading's squeezed text finds its start); the padding: a real run that retried
    # thousands of caught OOMs (more than the reader keeps) and finished
    paste = FIELD / "fastmri-238" / "paste.txt"
    healthy = ROOT / "fixtures" / "crash_logs" / "oom_caught_and_retried" / "train.log"
    alone = read_log(paste)
    padded = read_log(_padded(paste, healthy, tmp_path))
    assert alone.line_by_line and not padded.line_by_line
    assert len(alone.oom_events) == 1
    last = padded.oom_events[-1]
    assert last.message == alone.oom_events[0].message
    assert last.source.line == padded.lines  # the paste's line, after the padding


@pytest.mark.parametrize("case", ["chatglm3-100", "deepspeed-6525", "openr1-217"])
def test_an_exception_without_a_traceback_header_survives_padding(
    case: str, tmp_path: Path
) -> None:
    # real pastes whose exception has no "Traceback" header above it (its line holds an
    # anchor only the paste table has), after a healthy run's lines
    paste = FIELD / case / "paste.txt"
    healthy = ROOT / "fixtures" / "crash_logs" / "oom_caught_and_retried" / "train.log"
    alone = read_log(paste)
    padded = read_log(_padded(paste, healthy, tmp_path))
    names = [e.exception_class for e in alone.exceptions]
    assert names and names == [e.exception_class for e in padded.exceptions][-len(names) :]
