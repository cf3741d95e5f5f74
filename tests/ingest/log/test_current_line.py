"""The innermost frame's current source line, and what it says when a traceback is cut before
the frames of the call it shows: rich's highlighted ``❱`` line, Python's source line under a
frame (not its carets).  Real pastes (development split) and windows of real GPU logs cut by
code."""

from __future__ import annotations

from pathlib import Path

from oomlens.facts.log import Phase
from oomlens.ingest.log import read_log
from oomlens.ingest.log.traceback import classify_phase, classify_traceback
from tests.ingest.log._field import paste_path

CRASH = Path(__file__).resolve().parents[3] / "fixtures" / "crash_logs"


def test_a_cut_rich_box_keeps_its_highlighted_line_and_reads_the_call() -> None:
    # bitsandbytes-324: "finetune.py:280 in train" with "❱ 280 │ model.save_pretrained(...)"
    facts = read_log(paste_path("bitsandbytes-324"))
    [cut] = facts.partial_tracebacks
    assert cut.traceback is not None and cut.traceback.cut
    assert cut.traceback.current_line == "model.save_pretrained(output_dir)"
    # the frame alone ("train") says nothing of a save; the call it shows does
    assert classify_phase(cut.traceback.frames)[0] is not Phase.CHECKPOINT_SAVE
    assert cut.phase is Phase.CHECKPOINT_SAVE
    assert cut.phase_evidence is not None
    assert "finetune.py:280 in train calls model.save_pretrained(output_dir)" in (
        cut.phase_evidence
    )


def _cut_after(log: Path, marker: str, tmp_path: Path) -> Path:
    """Rank 0's first traceback, cut after the first line holding ``marker`` and the caret
    line under it (what a paste keeps when it stops there)."""
    lines = [line for line in log.read_text().splitlines(keepends=True) if "[rank0]:" in line]
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    end = next(i for i in range(start, len(lines)) if marker in lines[i]) + 2
    window = tmp_path / "window.log"
    window.write_text("".join(lines[start:end]))
    return window


def test_a_python_traceback_cut_under_a_generate_call_is_generation(tmp_path: Path) -> None:
    # GIVEN the generation run's traceback cut after "out = model.module.generate(" and its
    # carets (built by code from the real log): frames <module> and main only
    window = _cut_after(CRASH / "generation_oom" / "train.log", "model.module.generate(", tmp_path)
    [cut] = read_log(window).partial_tracebacks
    assert cut.traceback is not None
    assert [f.function for f in cut.traceback.frames] == ["<module>", "main"]
    # THEN the source line is kept (not the carets) and it names the phase
    assert cut.traceback.current_line == "out = model.module.generate("
    assert cut.phase is Phase.GENERATION


def test_a_complete_traceback_is_placed_by_its_frames_only() -> None:
    # pytorch-64586: an IPython traceback that reaches its exception; its innermost line
    # ("Variable._execution_engine.run_backward(") adds nothing to what the frames say
    facts = read_log(paste_path("pytorch-64586"))
    [event] = facts.oom_events
    assert event.traceback is not None and not event.traceback.cut
    assert classify_traceback(event.traceback)[:2] == classify_phase(event.traceback.frames)
