"""The view model the HTML and Markdown reports are rendered from (``oomlens.render.view``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oomlens.render.view import build_view
from oomlens.session import analyze
from tests._corpus import case_dir, case_names

_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", case_names())
def test_an_excerpt_that_cites_a_line_shows_that_lines_own_words(name: str) -> None:
    # audit: "LOG / AGAINST 263 [rank 0] the failing allocation is a ZeRO-3 parameter gather":
    # oomlens' own account of a line, shown as an excerpt whose gutter numbered a line that
    # holds something else (the OOM message); a reader checking it could not find it
    report = analyze([case_dir(name)])
    view = build_view(report)
    for diagnosis, shown in zip(report.diagnoses, view.diagnoses, strict=False):
        for item, ev in zip(diagnosis.evidence, shown.evidence, strict=False):
            if not ev.quoted or ev.line is None:
                continue
            assert item.source is not None
            printed = [  # without the launcher's per-rank prefix, which the reader takes off
                _RANK_PREFIX.sub("", line)
                for line in Path(item.source.path).read_text(errors="replace").splitlines()
            ]
            cited = _flat(printed[ev.line - 1])
            following = _flat(" ".join(printed[ev.line - 1 : ev.line + 40]))
            # the line's words, whitespace collapsed, perhaps cut short or elided ("...", "…")
            pieces = [p.strip() for p in re.split(r"\.\.\.|…", _flat(ev.text)) if p.strip()]
            head = pieces[0]
            assert head[:40] in cited or any(
                head.startswith(cited[i:]) for i in range(len(cited) - 8)
            ), (diagnosis.id, ev.line, ev.text)
            at = 0
            for piece in pieces:
                at = following.find(piece, at)
                assert at >= 0, (diagnosis.id, ev.line, piece)


def test_oomlens_account_of_a_line_is_not_shown_as_an_excerpt_of_it() -> None:
    report = analyze([case_dir("model_states_too_large")])
    view = build_view(report)
    (fragmentation,) = [d for d in view.diagnoses if d.id == "fragmentation"]
    against = next(
        e
        for e in fragmentation.evidence
        if not e.supports and e.text.startswith("the failing allocation creates optimizer state")
    )
    assert "the failing allocation creates optimizer state" in against.text and not against.quoted
    assert against.where.endswith(f":{against.line} (rank 1)")  # still cites its line
    (message,) = [e for e in fragmentation.evidence if e.text.startswith("torch.OutOfMemoryError")]
    assert message.quoted  # the OOM message as printed still is one
