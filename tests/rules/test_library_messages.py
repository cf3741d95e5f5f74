"""What a paste's library message and its frames say, read as the library means them: another
engine's CUDA check reporting "out of memory" is an out-of-memory error, the constructor it
leaves is the model being built, a traceback whose head the paste cut says nothing about what
ran before it, and a message cut after this process' holding still says its own demand filled
the card.  Real text: field pastes of the development split, public threads (cited),
the crash corpus."""

from __future__ import annotations

from pathlib import Path

from oomlens.report import Report
from oomlens.session import analyze

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "fixtures" / "field_logs"
CRASH = ROOT / "fixtures" / "crash_logs"


def _ids(report: Report) -> list[str]:
    return [d.id for d in report.diagnoses]


def test_an_engine_running_out_while_its_model_is_built_is_the_model_not_fitting() -> None:
    # faster-whisper's WhisperModel.__init__ (CTranslate2: "CUDA failed with error out of
    # memory"), then a second, unrelated exception while the frozen app exits
    report = analyze([FIELD / "buzz-439" / "paste.txt"])
    assert report.verdict.value == "gpu_oom"
    top = report.top
    assert top is not None and top.id == "model_states_too_large"
    assert top.confidence < 0.6  # one message and one frame: named, not certain
    assert "not_oom" not in _ids(report)
    assert any("__init__" in e.text for e in top.evidence)


def test_the_same_engine_failing_while_generating_is_an_oom_of_unknown_cause(
    tmp_path: Path,
) -> None:
    # github.com/SYSTRAN/faster-whisper/issues/442, the traceback as posted (generating)
    log = tmp_path / "fw.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/home/coder/.local/bin/whisper-ctranslate2", line 8, in <module>\n'
        "    sys.exit(main())\n"
        '  File "/home/coder/.local/lib/python3.8/site-packages/faster_whisper/transcribe.py", '
        "line 584, in generate_with_fallback\n"
        "    result = self.model.generate(\n"
        "RuntimeError: CUDA failed with error out of memory\n"
    )
    report = analyze([log])
    assert report.verdict.value == "gpu_oom"
    assert "not_oom" not in _ids(report)
    # no constructor, no step: the model is not named
    assert report.top is not None and report.top.id != "model_states_too_large"


def test_a_paste_cut_inside_its_traceback_does_not_say_the_job_had_not_started() -> None:
    # two driver OOMs in mmdetection's IoU assigner, the paste starting at a frame: nothing
    # shows whether steps had run, so the runtime's OOM is not read as "the card was full
    # before the job computed" (another process)
    report = analyze([FIELD / "mmdetection-188" / "paste.txt"])
    assert report.verdict.value == "gpu_oom"
    assert "other_process" not in _ids(report)


def test_a_whole_log_failing_at_its_first_computation_still_names_another_process() -> None:
    report = analyze([CRASH / "driver_oom_other_process"])
    assert report.top is not None and report.top.id == "other_process"


def test_generation_placed_by_its_own_log_line_is_named_but_not_confidently() -> None:
    # generate()'s input-length warning (46371 tokens) right before an 8.01 GiB request on an
    # 8 GiB card: generation named first, below the confident band (no frame says it)
    report = analyze([FIELD / "chatglm6b-1137" / "paste.txt"])
    top = report.top
    assert top is not None and top.id == "eval_or_generation"
    assert top.confidence <= 0.6


def _cut_after(line: str, words: str) -> str:
    """``line`` cut right after ``words`` (as a paste or a ticket's window cuts a message)."""
    return line[: line.index(words) + len(words)]


def _message(path: Path, marker: str) -> str:
    line = next(line for line in path.read_text().splitlines() if marker in line)
    return line[line.index("torch.") :] if "torch." in line else line


def test_a_message_cut_after_this_process_filling_the_card_names_the_batch_lowest(
    tmp_path: Path,
) -> None:
    # GIVEN a real complete 2.2+ message of a batch that did not fit (chatchat-4685), cut by
    # code after "this process has 21.92 GiB memory in use" (93% of the 23.48 GiB card)
    line = _message(FIELD / "chatchat-4685" / "paste.txt", "this process has")
    paste = tmp_path / "paste.txt"
    paste.write_text(_cut_after(line, "memory in use.") + "\n")
    report = analyze([paste])
    top = report.top
    assert top is not None and top.id == "activation_memory"
    assert top.confidence == 0.25  # the cached share is lost with the cut: the lowest named
    assert any("(93%)" in e.text for e in top.evidence)
    # AND the field paste cut by its writer (nemoautomodel-1975: 76.51 of 79.11 GiB)
    cut = analyze([FIELD / "nemoautomodel-1975" / "paste.txt"])
    assert cut.top is not None and cut.top.id == "activation_memory"


def test_a_cut_message_that_shows_others_or_a_small_holding_names_no_batch(
    tmp_path: Path,
) -> None:
    # another process listed (the crash corpus' other_process run), cut after this process
    other = _message(CRASH / "other_process" / "train.log", "Process 1652 has")
    # live tensors half the card (the lab's fragmentation message: 70 of 139.80 GiB), cut
    # before the 68 GiB it held unallocated
    lab = ROOT / "tests" / "assets" / "logs" / "lab_log_torch2.11_h200.txt"
    half = next(
        line
        for line in lab.read_text().splitlines()
        if line.startswith("torch.OutOfMemoryError")
        and "1.50 GiB" in line
        and "allowed" not in line
    )
    for text in (
        _cut_after(other, "this process has 13.98 GiB memory in use."),
        _cut_after(half, "70.00 GiB is allocated by PyTorch"),
    ):
        paste = tmp_path / "paste.txt"
        paste.write_text(text + "\n")
        assert "activation_memory" not in _ids(analyze([paste])), text
