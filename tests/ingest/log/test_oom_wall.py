"""A wall of continuation lines of a wrapped OOM message (fuzz finding log-1206 of campaign D):
each line used to re-parse the message collected so far (27-35 s of CPU for a 968-byte xz
file).  The message is parsed again only once a line brings a word a complete message's last
clause holds; a message that completes is still closed where it completes."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from oomlens.ingest.log import reader as reader_module
from oomlens.ingest.log import torch_oom
from oomlens.ingest.log.reader import read_log

FIRST = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 198.00 MiB (GPU 0; 31.75"
)
MIDDLE = "GiB total capacity; 28.05 GiB already allocated; 137.69 MiB free; 28.08 GiB"
LAST = "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting"


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = torch_oom.wrapped_complete

    def counting(text: str) -> bool:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(reader_module.torch_oom, "wrapped_complete", counting)
    return calls


def test_a_wall_of_middle_lines_is_not_parsed_line_after_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.log.xz"
    path.write_bytes(lzma.compress(("\n".join([FIRST] + [MIDDLE] * 20_000) + "\n").encode()))
    calls = _count_parses(monkeypatch)
    facts = read_log(path)
    assert calls == []
    assert facts.oom_events and facts.oom_events[0].message.tried_to_allocate == 198 << 20


def test_the_line_with_the_last_clause_still_completes_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.log"
    path.write_text("\n".join([FIRST, MIDDLE, LAST, "next line of the log"]) + "\n")
    calls = _count_parses(monkeypatch)
    facts = read_log(path)
    assert len(calls) == 1  # parsed once, on the line that brought 'PyTorch'
    message = facts.oom_events[0].message
    assert message.complete
    assert message.reserved_total == round(28.08 * (1 << 30))
