"""Whether a log file is one launch of a job, and when it ran: what tells two runs' logs in
one directory apart (``attempt1.log`` and ``attempt2.log`` of a job started twice).

A launcher prints a header when it starts a job, with the time on its lines:

* DeepSpeed's runner: ``[<time>] [INFO] [runner.py:<n>:main] cmd = ... -m
  deepspeed.launcher.launch --world_info=...``, and its per-node launcher's ``[launch.py:<n>:
  main] WORLD INFO DICT: {...}``;
* torchrun (``torch.distributed.run``): ``W<mmdd> <time> <pid> torch/distributed/run.py:<n>]
  Setting OMP_NUM_THREADS environment variable for each process ...``, and at INFO level
  ``Starting elastic_operator with launch configs:``.

``launch_span(path)`` gives the launcher and the first and last time the log prints when its
head holds such a header; None otherwise (no header, no time after the first one, or a
compressed log too long to read its end cheaply).  Logs whose spans do not overlap are
separate launches (``separate_launches``); the logs of one multi-node job each carry a header
too, but they run at the same time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from oomlens.errors import InputError
from oomlens.ingest.textstream import HEAD_BYTES, Compression, open_text, read_head
from oomlens.lazyregex import lazy_regex

_LAUNCHER_LINES = (
    ("deepspeed", lazy_regex(r"runner\.py:\d{1,6}:main\] cmd = .{0,4000}deepspeed\.launcher")),
    ("deepspeed", lazy_regex(r"launch\.py:\d{1,6}:main\] WORLD INFO DICT: \{")),
    ("torchrun", lazy_regex(r"Setting OMP_NUM_THREADS environment variable for each process")),
    ("torchrun", lazy_regex(r"Starting elastic_operator with launch configs")),
)
_SUMMARY_TIME = lazy_regex(r"\s{0,8}time\s{0,8}: (?P<time>\d{4}-\d\d-\d\d[_ T]\d\d:\d\d:\d\d)")
"""torchrun's failure summary (``time      : 2026-11-30_06:30:15``), often a log's last time."""
TAIL_BYTES = 256 * 1024
"""How much of a log's end is read for its last time."""


@dataclass(frozen=True, slots=True)
class LaunchSpan:
    """A log that starts with a launcher's header, and the times it prints."""

    launcher: str
    """``deepspeed`` or ``torchrun``."""
    start: datetime
    end: datetime


def launch_span(path: str | os.PathLike[str]) -> LaunchSpan | None:
    """The launch ``path`` logs (see the module docstring), or None.  Never raises for an
    unreadable file (None)."""
    try:
        head = read_head(path, HEAD_BYTES)
        compression = open_text(path).compression
        size = os.path.getsize(path)
        year = datetime.fromtimestamp(os.path.getmtime(path)).year
    except (InputError, OSError, ValueError, OverflowError):
        return None
    lines = head.decode("utf-8", "replace").splitlines()
    if len(head) >= HEAD_BYTES:
        lines = lines[:-1]  # the head may have cut its last line
    launcher = next(
        (name for line in lines for name, pattern in _LAUNCHER_LINES if pattern.search(line)),
        None,
    )
    if launcher is None:
        return None
    year = _first_year(lines) or year
    start = next((t for t in (_time(line, year) for line in lines) if t is not None), None)
    if start is None:
        return None
    if len(head) < HEAD_BYTES:
        tail = lines
    elif compression is Compression.NONE:
        tail = _tail_lines(path, size)
    else:
        return None  # its end is known only by decompressing all of it
    end = next((t for t in (_time(line, year) for line in reversed(tail)) if t is not None), None)
    if end is None or end <= start:
        return None  # no time after its first: when it ended is unknown
    return LaunchSpan(launcher, start, end)


def separate_launches(spans: Sequence[LaunchSpan]) -> bool:
    """True when ``spans`` (two or more) ran one after another, none overlapping another."""
    if len(spans) < 2:
        return False
    ordered = sorted(spans, key=lambda s: (s.start, s.end))
    pairs = zip(ordered, ordered[1:], strict=False)
    return all(later.start > earlier.end for earlier, later in pairs)


def _time(line: str, year: int) -> datetime | None:
    # imported when used: the log package loads numpy, which must not start its threads before
    # the CLI has set OPENBLAS_NUM_THREADS (oomlens.cli.main)
    from oomlens.ingest.log import timestamps

    found, _ = timestamps.leading_timestamp(line.lstrip()[:60], year)
    if found is not None:
        return found
    match = _SUMMARY_TIME.match(line)
    return timestamps.parse_any(match.group("time")) if match is not None else None


def _first_year(lines: Sequence[str]) -> int | None:
    """The year of the first full date, for the lines that print none (glog's ``W1130``)."""
    from oomlens.ingest.log import timestamps

    for line in lines:
        found, has_year = timestamps.leading_timestamp(line.lstrip()[:60], None)
        if found is not None and has_year:
            return found.year
    return None


def _tail_lines(path: str | os.PathLike[str], size: int) -> list[str]:
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, size - TAIL_BYTES))
            data = stream.read(TAIL_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if size > TAIL_BYTES else lines
