"""Where an OOM message's exception class starts when line ends lie between it and the text
before: a wrap cut the class (the lines are joined), or the line before is a line of its own
(a short one a program printed, or a long one the reader cut at its line limit: the class
starts on its own line).

The exception line is a field paste's (``algoperf-426``, Python's own line of an uncaught
error: class, then message); the lines before it are a healthy run's of the crash corpus
(``prefetch_fits``), read at paste size and above ``LINE_BY_LINE_BYTES`` (the bulk scan).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.ingest.log import read_log
from oomlens.ingest.log.oom_text import exception_class_before
from oomlens.ingest.log.reader import LINE_BY_LINE_BYTES
from oomlens.ingest.log.torch_oom import message_starts
from oomlens.session import AnalysisOptions, analyze
from tests.ingest.log._field import paste

CRASH = Path(__file__).resolve().parents[3] / "fixtures" / "crash_logs"
CLASS = "torch.cuda.OutOfMemoryError"


def _exception_line() -> str:
    return next(x for x in paste("algoperf-426").splitlines() if x.startswith(CLASS))


def _healthy() -> list[str]:
    return (CRASH / "prefetch_fits" / "train.log").read_text().splitlines()


def _ending_in_a_word(lines: list[str]) -> list[str]:
    return [x for x in lines if x.rstrip()[-1:].isalnum()]


@pytest.mark.parametrize("before", _ending_in_a_word(_healthy())[:12])
def test_a_line_of_its_own_before_the_exception_line_is_not_its_class(before: str) -> None:
    line = _exception_line()
    text = f"{before}\n{line}\n"
    start = text.index("CUDA out of memory")
    assert exception_class_before(text, start) == CLASS
    assert message_starts(text) == [len(before) + 1]


@pytest.mark.parametrize("width", [20, 33, 47, 80])
def test_a_class_a_wrap_cut_is_joined(tmp_path: Path, width: int) -> None:
    # a terminal wraps every line at its width: the class's first part fills its line, the
    # line before ends short (where the program ended it)
    lines = [*_healthy()[-3:], _exception_line()]
    wrapped = [line[i : i + width] for line in lines for i in range(0, max(len(line), 1), width)]
    text = "\n".join(wrapped) + "\n"
    first = text.index("\n" + _exception_line()[:width] + "\n") + 1
    assert message_starts(text) == [first]
    assert exception_class_before(text, text.index("CUDA")) == CLASS
    path = tmp_path / "paste.txt"
    path.write_text(text)
    events = read_log(path).oom_events
    assert [e.message.exception_class for e in events] == [CLASS]


@pytest.mark.parametrize("size", [40_000, LINE_BY_LINE_BYTES + (64 << 10)])
@pytest.mark.parametrize("long_line", [30_000, 200_000])
def test_an_exception_line_after_a_long_line_is_read(
    tmp_path: Path, size: int, long_line: int
) -> None:
    # a run's lines joined into one (their line ends lost), ending inside a word, then the
    # crash's exception line; 200,000 characters: past the reader's line limit, which cuts it
    healthy = _healthy()
    lines: list[str] = []
    while sum(map(len, lines)) < size:
        lines += healthy
    joined = " ".join(healthy * (long_line // len(" ".join(healthy)) + 1))[:long_line]
    while not joined[-1].isalnum():
        joined = joined[:-1]
    path = tmp_path / "train.log"
    path.write_text("\n".join([*lines, joined, _exception_line()]) + "\n")
    facts = read_log(path)
    assert [e.source.line for e in facts.oom_events] == [len(lines) + 2]
    assert facts.oom_events[0].message.exception_class == CLASS
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "gpu_oom"
