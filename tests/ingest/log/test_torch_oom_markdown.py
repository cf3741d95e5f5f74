"""A ticket's Markdown inside an OOM message: bold around a figure is the writer's, not torch's,
and the message reads as it would without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import regex

from oomlens.ingest.log.torch_oom import parse_oom_message

ROOT = Path(__file__).resolve().parents[3]
FIGURE = regex.compile(r"\d[\d.,]*\s?[KMGT]?i?B\b")


def _first_message(path: Path) -> str:
    return next(
        ln.split("]: ", 1)[-1] for ln in path.read_text().splitlines() if "Tried to allocate" in ln
    )


@pytest.mark.parametrize(
    "source",
    [
        ROOT / "fixtures" / "field_logs" / "megatrondeepspeed-bigscience-384" / "paste.txt",
        ROOT / "fixtures" / "crash_logs" / "activation_memory" / "train.log",
    ],
)
@pytest.mark.parametrize("marker", ["**", "__"])
def test_bold_figures_read_as_the_plain_message(source: Path, marker: str) -> None:
    plain = _first_message(source)
    bold = FIGURE.sub(lambda m: f"{marker}{m.group(0)}{marker}", plain)
    assert bold != plain
    want, got = parse_oom_message(plain), parse_oom_message(bold)
    assert want is not None and got is not None
    for field in (
        "tried_to_allocate",
        "total_capacity",
        "free",
        "allocated_by_pytorch",
        "reserved_total",
        "reserved_unallocated",
        "allowed",
    ):
        assert getattr(got, field) == getattr(want, field), field
    assert want.tried_to_allocate is not None


def test_a_clause_whose_lead_in_the_writer_elided_is_read_by_its_own_words() -> None:
    """activation_memory's real 2.2+ message with "Of the allocated memory" cut to "...", as
    people shorten messages in tickets: the clause "X is allocated by PyTorch" is torch's own
    words and only this figure's."""
    plain = _first_message(ROOT / "fixtures" / "crash_logs" / "activation_memory" / "train.log")
    elided = plain.replace("Of the allocated memory ", "... ")
    assert elided != plain
    want, got = parse_oom_message(plain), parse_oom_message(elided)
    assert want is not None and got is not None
    assert want.allocated_by_pytorch is not None
    assert got.allocated_by_pytorch == want.allocated_by_pytorch
    assert got.reserved_unallocated == want.reserved_unallocated
