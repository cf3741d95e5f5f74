"""What a run prints as it ends and only the paste table finds (``reader.END_OF_RUN``:
``torch.cuda.memory_summary()``'s table, a trainer's closing line) is read whatever the log's
size: a log read in bulk has its last lines read for it too, so the verdict those lines decide
is the same for the paste and for the same text at the end of a long log."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.diagnosis import Verdict
from oomlens.ingest.log.reader import LINE_BY_LINE_BYTES, read_log
from oomlens.session import analyze

ROOT = Path(__file__).resolve().parents[3]
FIELD = ROOT / "fixtures" / "field_logs"
CRASH = ROOT / "fixtures" / "crash_logs"


def _summary_table() -> str:
    """A real ``memory_summary()`` table, as a user pasted it (its OOM count: 1)."""
    text = (FIELD / "pytorch-35901" / "paste.txt").read_text()
    assert "CUDA OOMs: 1" in text
    return text


def _healthy_lines(size: int) -> str:
    """Real lines of a healthy run (its own log, repeated) up to ``size`` bytes."""
    lines = (CRASH / "prefetch_fits" / "train.log").read_text().splitlines(keepends=True)
    lines = [line for line in lines if "rror" not in line]
    out: list[str] = []
    total = 0
    while total < size:
        for line in lines:
            out.append(line)
            total += len(line)
    return "".join(out)


@pytest.mark.parametrize("padding", [0, LINE_BY_LINE_BYTES + 200_000, 3 * LINE_BY_LINE_BYTES])
def test_a_memory_summary_at_the_end_counts_its_ooms_at_any_size(
    tmp_path: Path, padding: int
) -> None:
    log = tmp_path / "train.log"
    log.write_text(_healthy_lines(padding) + _summary_table() if padding else _summary_table())
    facts = read_log(log)
    assert [s.ooms for s in facts.allocator_summaries] == [1]
    report = analyze([log])
    assert report.verdict is Verdict.GPU_OOM
    assert "memory_summary() counts 1 CUDA OOM" in report.verdict_reason


def test_a_trainers_closing_line_is_read_at_the_end_of_a_long_log(tmp_path: Path) -> None:
    # Lightning's closing line, as a real run printed it
    closing = next(
        line
        for line in (CRASH / "lightning_batch_finder_recovers" / "train.log")
        .read_text()
        .splitlines()
        if "`Trainer.fit` stopped" in line
    )
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    small.write_text(_healthy_lines(50_000) + closing + "\n")
    large.write_text(_healthy_lines(2 * LINE_BY_LINE_BYTES) + closing + "\n")
    read_small, read_large = read_log(small).completion, read_log(large).completion
    assert read_small is not None and read_large is not None
    assert read_large.kind == read_small.kind
    assert read_large.source.line == len(large.read_text().splitlines())
