"""Family evidence read from partial pastes: where a cut traceback stops (a checkpoint save
shown only by the highlighted call), a signal, a failing component's own line.  Real pastes of
the development split, and windows of real GPU logs cut by code."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.session import analyze
from tests.ingest.log._field import paste_path

CRASH = Path(__file__).resolve().parents[2] / "fixtures" / "crash_logs"


def test_a_traceback_cut_inside_a_save_names_the_save_low() -> None:
    # bitsandbytes-324: a rich frame "finetune.py:280 in train" whose highlighted line is
    # "model.save_pretrained(output_dir)", and nothing after it
    report = analyze([paste_path("bitsandbytes-324")])
    top = report.top
    assert top is not None and top.id == "checkpoint_save_gather"
    assert top.confidence < 0.5  # what failed is cut off: a place, not a proven OOM
    assert any("model.save_pretrained(output_dir)" in e.text for e in top.evidence)
    assert any("exception line" in m for m in top.missing)
    assert report.verdict.value == "unknown"


def _generation_window(tmp_path: Path) -> Path:
    """The generation run's rank-0 traceback cut after its ``model.module.generate(`` call."""
    lines = [
        line
        for line in (CRASH / "generation_oom" / "train.log").read_text().splitlines(True)
        if "[rank0]:" in line
    ]
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent" in line)
    end = next(i for i in range(start, len(lines)) if "model.module.generate(" in lines[i])
    window = tmp_path / "window.log"
    window.write_text("".join(lines[start : end + 2]))
    return window


def test_a_traceback_cut_elsewhere_names_no_save(tmp_path: Path) -> None:
    # GIVEN the generation run's rank-0 traceback cut after its "model.module.generate(" call
    # (built by code from the real log)
    window = _generation_window(tmp_path)
    report = analyze([window])
    assert "checkpoint_save_gather" not in [d.id for d in report.diagnoses]
    assert report.verdict.value == "unknown"


def _launcher_end(tmp_path: Path, code: int) -> Path:
    """The pinned run's last lines (DeepSpeed's launcher killing the ranks and reporting
    ``exits with return code = -9``), the code changed by code to ``code``."""
    lines = (CRASH / "pinned_memory_exhaustion" / "train.log").read_text().splitlines(True)
    end = [line for line in lines if "sigkill_handler" in line]
    assert end and "return code = -9" in end[-1]
    window = tmp_path / f"exit{code}.log"
    window.write_text("".join(end).replace("return code = -9", f"return code = {code}"))
    return window


@pytest.mark.parametrize(
    ("code", "top", "verdict"),
    [
        (-9, "host_oom_killed", "host_oom"),
        (-7, "shm_exhausted", "host_oom"),
        (-11, "not_oom", "other_failure"),
    ],
)
def test_the_signal_of_a_silent_death_names_its_family(
    tmp_path: Path, code: int, top: str, verdict: str
) -> None:
    report = analyze([_launcher_end(tmp_path, code)])
    assert report.top is not None and report.top.id == top
    assert report.verdict.value == verdict
    ids = [d.id for d in report.diagnoses]
    if code != -9:  # a segfault or a bus error is not the OOM killer's doing
        assert "host_oom_killed" not in ids
        assert str(code) in report.verdict_reason or code == -7


@pytest.mark.parametrize(
    ("case", "rule", "where"),
    [
        # HF Trainer's evaluation_loop -> nested_concat, cut before its exception
        ("transformers-17089", "eval_or_generation", "nested_concat"),
        # vLLM sizing its KV cache (_initialize_kv_caches), cut
        ("trl-3128", "eval_or_generation", "_initialize_kv_caches"),
        # DeepSpeed's engine placing the model on the device (module.to), cut
        ("deepspeed-6737", "model_states_too_large", "engine.py"),
    ],
)
def test_a_cut_traceback_names_the_family_of_its_place_low(
    case: str, rule: str, where: str
) -> None:
    report = analyze([paste_path(case)])
    top = report.top
    assert top is not None and top.id == rule
    assert top.confidence <= 0.3  # a base rate of the place, not evidence of memory
    assert any(where in e.text for e in top.evidence)
    assert report.verdict.value == "unknown"


def test_a_cut_evaluation_beside_an_error_of_its_own_is_not_named(tmp_path: Path) -> None:
    # GIVEN transformers-17089's cut evaluation traceback followed by the device-side-assert
    # run's first exception line, its rank prefix removed (joined by code): the error that was
    # printed decides
    assert_line = next(
        line.split("]: ", 1)[1]
        for line in (CRASH / "device_side_assert" / "train.log").read_text().splitlines()
        if "]: RuntimeError: CUDA error:" in line
    )
    both = tmp_path / "both.txt"
    both.write_text(paste_path("transformers-17089").read_text() + "\n\n" + assert_line + "\n")
    report = analyze([both])
    assert "eval_or_generation" not in [d.id for d in report.diagnoses]


def test_where_a_cut_traceback_stops_is_cited_at_its_frame(tmp_path: Path) -> None:
    # audit: the quoted frame was cited at the traceback's first line; GIVEN the generation
    # run's rank-0 traceback cut after its "model.module.generate(" call (built by code from the
    # real log), whose frame "generate_samples.py:54 in main" is the window's fourth line
    window = _generation_window(tmp_path)
    report = analyze([window])
    [placed] = [
        e
        for d in report.diagnoses
        if d.id == "eval_or_generation"
        for e in d.evidence
        if "generate_samples.py:54 in main" in e.text
    ]
    assert placed.source is not None and placed.source.line == 4
    assert "line 54, in main" in window.read_text().splitlines()[3]


def test_the_phase_of_an_oom_is_cited_at_its_frame() -> None:
    # audit: "phase forward: ...parameter_offload.py:543 in pre_sub_module_forward_function"
    # was cited at train.log:187 ("Traceback (most recent call last):"); that frame is on 234
    log = CRASH / "prefetch_overshoot" / "train.log"
    report = analyze([log])
    placed = {
        (e.text, e.source)
        for d in report.diagnoses
        for e in d.evidence
        if e.text.startswith("phase forward: ")
    }
    assert placed
    text = log.read_text().splitlines()
    for quoted, source in placed:
        assert source is not None and source.line is not None
        frame = quoted.removeprefix("phase forward: ").rsplit(" in ", 1)
        path, number = frame[0].rsplit(":", 1)
        assert f'File "{path}", line {number}, in {frame[1]}' in text[source.line - 1]


@pytest.mark.parametrize("case", ["deepspeed-7150", "vllm-5376"])
def test_a_failure_that_is_not_memory_quotes_its_exception_line_once(case: str) -> None:
    # audit: the evidence read "RuntimeError: RuntimeError: CUDA error: ..."
    top = analyze([paste_path(case)]).top
    assert top is not None and top.id == "not_oom"
    quoted = top.evidence[0].text
    assert quoted.startswith("RuntimeError: CUDA error: ")
    assert "RuntimeError: RuntimeError" not in quoted
