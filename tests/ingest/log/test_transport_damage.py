"""A crash's last line survives what terminals, transports and pastes do to a log.

Every input is made by code from real lines: the steps of a healthy run of the crash corpus
(``activation_memory_fixed``), then either the OOM traceback of a crashed one
(``activation_memory``, its rank prefix removed) or the shell's ``Killed`` of a field paste
(``videollava-13``, where it was glued to a progress bar).  Each damage is read at paste size
(line by line) and above ``LINE_BY_LINE_BYTES`` (the bulk scan).
"""

from __future__ import annotations

import gzip
import lzma
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from oomlens.facts.kernel import FatalSignalKind
from oomlens.ingest.detect import detect_kind
from oomlens.ingest.log import read_log
from oomlens.ingest.log.reader import LINE_BY_LINE_BYTES
from oomlens.session import AnalysisOptions, analyze
from tests.ingest.log._field import paste_path

CRASH = Path(__file__).resolve().parents[3] / "fixtures" / "crash_logs"

Lines = list[bytes]


def _healthy() -> tuple[Lines, Lines]:
    lines = (CRASH / "activation_memory_fixed" / "train.log").read_bytes().splitlines(True)
    header = [line for line in lines if not line.startswith(b"step ")]
    steps = [line for line in lines if line.startswith(b"step ")]
    return header, steps


def _oom_tail() -> Lines:
    lines = (CRASH / "activation_memory" / "train.log").read_bytes().splitlines(True)
    return [line[len(b"[rank0]: ") :] for line in lines if line.startswith(b"[rank0]: ")]


def _killed_tail() -> Lines:
    for line in paste_path("videollava-13").read_bytes().splitlines():
        if line.endswith(b"]Killed"):
            return [line.rsplit(b"]", 1)[1] + b"\n"]  # what the shell printed, on its own
    raise AssertionError("the paste's Killed line is gone")


def _body(size: int) -> Lines:
    """The healthy run's header, then its step lines renumbered until ``size`` bytes."""
    header, steps = _healthy()
    out = list(header)
    total = sum(map(len, out))
    number = 0
    while total < size:
        step = steps[number % len(steps)]
        number += 1
        line = re.sub(rb"^step \d+/\d+", b"step %d/100000" % number, step)
        out.append(line)
        total += len(line)
    return out


def _each(change: Callable[[bytes], bytes]) -> Callable[[Lines, Lines], Lines]:
    return lambda body, tail: [change(line) for line in body + tail]


DAMAGE: dict[str, Callable[[Lines, Lines], Lines]] = {
    # a hole of zeros (space preallocated, never written) right before the crash's line
    "zero_hole": lambda body, tail: [*body, b"\x00" * 300_000, *tail],
    # the file truncated under a writer that kept its offset: zeros, then the rest
    "zero_start": lambda body, tail: [b"\x00" * 200_000, *body[len(body) // 2 :], *tail],
    "tab_indent": _each(lambda line: b"\t" + line),
    "code_block_indent": _each(lambda line: b"    " + line),
    "indented_tail_only": lambda body, tail: body + [b"\t" + line for line in tail],
    "tab_after_rank_prefix": _each(lambda line: b"[rank2]:\t" + line),
    "crlf": _each(lambda line: line.replace(b"\n", b"\r\n")),
    "ansi_colours": _each(lambda line: b"\x1b[1;31m" + line.rstrip(b"\n") + b"\x1b[0m\n"),
    "osc_title": _each(lambda line: b"\x1b]0;train\x07" + line),
    # every word its own colour (rich's highlighter, a logger's level and number colours): the
    # sequences fall between the words an anchor is made of
    "ansi_each_word": _each(lambda line: re.sub(rb"(\S+)", b"\x1b[38;5;196m\\1\x1b[m", line)),
    "srun_label": _each(lambda line: b"5: " + line),
    "pdsh_host": _each(lambda line: b"gpu-node12: " + line),
    "default_prefix": _each(lambda line: b"[default1]:" + line),
    "markdown_fence": lambda body, tail: [b"```console\n", *body, *tail, b"```\n"],
    "two_runs_interleaved": lambda body, tail: (
        [line for pair in zip(body, reversed(body), strict=True) for line in pair] + tail
    ),
    # tqdm's bar left without its line end, the crash's first line glued to it
    "glued_to_a_progress_bar": lambda body, tail: [
        *body,
        b"  0%|          | 0/10 [00:00<?, ?it/s]" + tail[0],
        *tail[1:],
    ],
    "long_line": lambda body, tail: [*body, b"=" * 600_000 + b"\n", *tail],
    # a line over a mebibyte: the input is read in bulk whatever its other lines
    "megabyte_line": lambda body, tail: [*body, b"=" * ((1 << 20) + 4096) + b"\n", *tail],
}

SIZES = {"paste": 40_000, "bulk": LINE_BY_LINE_BYTES + (64 << 10)}


def _write(tmp_path: Path, name: str, damage: str, tail: Lines, size: str) -> tuple[Path, int]:
    """The damaged log, and the number of its line that holds the crash's last line."""
    data = b"".join(DAMAGE[damage](_body(SIZES[size]), tail))
    path = tmp_path / f"{name}.log"
    path.write_bytes(data)
    last = tail[-1].rstrip(b"\n")
    if last not in data:  # a damage that changes the line's own bytes: find it as changed
        last = DAMAGE[damage]([], tail[-1:])[-1].rstrip(b"\n")
    before = data[: data.rindex(last)]
    return path, before.count(b"\n") + 1


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_killed_line_survives(tmp_path: Path, damage: str, size: str) -> None:
    path, line = _write(tmp_path, "killed", damage, _killed_tail(), size)
    log = read_log(path)
    assert log.line_by_line is (path.stat().st_size <= LINE_BY_LINE_BYTES)
    kills = [s for s in log.fatal_signals if s.kind is FatalSignalKind.SIGKILL]
    assert [s.source.line for s in kills] == [line]


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_oom_traceback_survives(tmp_path: Path, damage: str, size: str) -> None:
    tail = _oom_tail()
    path, line = _write(tmp_path, "oom", damage, tail, size)
    log = read_log(path)
    assert [e.source.line for e in log.oom_events] == [line]
    assert not log.ended_in_traceback
    event = log.oom_events[0]
    assert event.traceback is not None and len(event.traceback.frames) == sum(
        1 for text in tail if text.startswith(b"  File ")
    )


@pytest.mark.parametrize("damage", ["zero_hole", "tab_indent", "code_block_indent"])
@pytest.mark.parametrize(("tail", "verdict"), [("killed", "host_oom"), ("oom", "gpu_oom")])
def test_the_verdict_reads_the_crash(tmp_path: Path, damage: str, tail: str, verdict: str) -> None:
    lines = _killed_tail() if tail == "killed" else _oom_tail()
    path, _ = _write(tmp_path, tail, damage, lines, "paste")
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == verdict


def _compress(kind: str, data: bytes) -> bytes:
    if kind == "gz":
        return gzip.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    program = shutil.which("zstd")
    if program is None:
        pytest.skip("no zstd program")
    return subprocess.run([program, "-c", "-q"], input=data, capture_output=True, check=True).stdout


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_a_cut_compressed_log_keeps_what_came_before_and_says_it_is_cut(
    tmp_path: Path, kind: str
) -> None:
    # two zstd blocks' worth (a zstd decoder hands over whole blocks only)
    body = b"".join(_body(400_000))
    whole = _compress(kind, body + b"".join(_killed_tail()))
    path = tmp_path / f"train.log.{kind}"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    log = read_log(path)
    assert log.stream_cut and any("ends early" in note for note in log.notes)
    assert log.lines > 100 and not log.fatal_signals
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    # the crash may be in what the cut lost: its silence says nothing of the run
    assert report.verdict.value == "unknown"
    assert "stops early" in report.verdict_reason


def test_a_cut_compressed_log_that_still_shows_the_crash(tmp_path: Path) -> None:
    data = b"".join([*_body(40_000), *_oom_tail()])
    whole = gzip.compress(data)
    path = tmp_path / "train.log.gz"
    path.write_bytes(whole[:-8])  # the trailer lost: every byte of text decodes
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "gpu_oom"


@pytest.mark.parametrize("size", sorted(SIZES))
def test_a_cut_traceback_glued_to_a_progress_bar_still_ends_the_log(
    tmp_path: Path, size: str
) -> None:
    # the bar's own leading spaces are no margin of the traceback's lines
    tail = _oom_tail()
    last_frame = max(i for i, line in enumerate(tail) if line.startswith(b"  File "))
    frames = tail[: last_frame + 1]
    frames[-1] = frames[-1][: frames[-1].index(b", line")]  # and cut mid-line
    lines = [
        *_body(SIZES[size]),
        b"  0%|          | 0/10 [00:00<?, ?it/s]" + frames[0],
        *frames[1:],
    ]
    path = tmp_path / "cut.log"
    path.write_bytes(b"".join(lines))
    log = read_log(path)
    assert log.ended_in_traceback and not log.oom_events


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_a_compressed_log_cut_inside_its_first_block_is_said_to_be_cut(
    tmp_path: Path, kind: str
) -> None:
    # a zstd decoder hands over whole blocks: a small log cut anywhere decodes to nothing
    whole = _compress(kind, b"".join([*_body(20_000), *_killed_tail()]))
    path = tmp_path / f"train.log.{kind}"
    path.write_bytes(whole[:20])
    detection = detect_kind(path)
    assert detection.kind is None
    assert "cut short before any of its text" in detection.reason


@pytest.mark.parametrize("size", sorted(SIZES))
def test_a_launchers_kill_coloured_word_by_word_is_read(tmp_path: Path, size: str) -> None:
    # a real host OOM kill under DeepSpeed's launcher ("exits with return code = -9"), every
    # word coloured: the colour sequences fall inside the anchors the lines are found by
    crash = (CRASH / "checkpoint_save_host_oom" / "train.log").read_bytes().splitlines(True)
    lines = DAMAGE["ansi_each_word"](_body(SIZES[size]) if size == "bulk" else [], crash)
    path = tmp_path / "coloured.log"
    path.write_bytes(b"".join(lines))
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "host_oom"
