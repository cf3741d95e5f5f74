"""Tracebacks of every shape people paste: rich's boxes (wrapped frames, a window inside one),
IPython and Colab, Hydra's, and windows that start inside a traceback without its header.  A
text that is visibly inside a traceback is never "no failure"."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.facts.log import Phase
from oomlens.ingest.log import read_log
from oomlens.session import AnalysisOptions, analyze
from tests.ingest.log._field import paste, paste_path

NO_DEEPSPEED = AnalysisOptions(prefer_deepspeed=False)


def _verdict(path: Path) -> str:
    return analyze([path], options=NO_DEEPSPEED).verdict.value


def test_a_window_inside_a_rich_box_is_a_cut_crash() -> None:
    # bitsandbytes-324: six lines of a rich frame (save_pretrained), nothing else
    facts = read_log(paste_path("bitsandbytes-324"))
    assert facts.ended_in_traceback
    assert _verdict(paste_path("bitsandbytes-324")) == "unknown"


def test_rich_frames_wrapped_inside_the_box_are_joined() -> None:
    # transformers-24698: a window inside a rich box; ".../lib/py" and "thon3.9/site-packages/
    # torch/nn/functional.py:2238 in embedding" are one frame on two box lines
    facts = read_log(paste_path("transformers-24698"))
    assert facts.ended_in_traceback or facts.tracebacks_cut
    frames = [f for e in facts.partial_tracebacks if e.traceback for f in e.traceback.frames]
    assert any(
        f.filename.endswith("python3.9/site-packages/torch/nn/functional.py")
        and (f.line, f.function) == (2238, "embedding")
        for f in frames
    )
    assert all(e.traceback and e.traceback.headless for e in facts.partial_tracebacks)


def test_rich_box_with_its_header_gives_frames_and_style(tmp_path: Path) -> None:
    # deepspeed-3228's box, completed by code with rich's footer and an exception line
    box = paste("deepspeed-3228").split("\n\n", 1)[1].rstrip("\n").splitlines()
    box = box[:-1] + ["╰" + "─" * 98 + "╯", "ValueError: stop"]
    target = tmp_path / "paste.txt"
    target.write_text("\n".join(box) + "\n")
    facts = read_log(target)
    [exception] = facts.exceptions
    assert exception.exception_class == "ValueError"
    assert exception.traceback is not None and exception.traceback.style == "rich"
    assert exception.traceback.frames[0].filename == "/data/alpaca-lora/finetune_accelerate.py"
    assert exception.traceback.frames[0].line == 520


def test_ipython_traceback_cut_after_its_header_names_the_oom() -> None:
    # transformers-26203: "OutOfMemoryError   Traceback (most recent call last)", Cell In[8],
    # then from_pretrained frames, cut inside a frame line
    facts = read_log(paste_path("transformers-26203"))
    [event] = facts.oom_events
    assert event.message.message_format == "class_only"
    assert event.traceback is not None and event.traceback.style == "ipython"
    assert [f.function for f in event.traceback.frames][:2] == [
        "<cell>",
        "_BaseAutoModelClass.from_pretrained",
    ]
    assert _verdict(paste_path("transformers-26203")) == "gpu_oom"


def test_colab_link_frames_and_the_message_after_them() -> None:
    # unsloth-465: "[/usr/local/.../operations.py](https://localhost:8080/#) in
    # _convert_to_fp32(tensor)", "13 frames", then the OOM message
    facts = read_log(paste_path("unsloth-465"))
    [event] = facts.oom_events
    assert event.traceback is not None
    assert event.traceback.frames[-1].function == "_convert_to_fp32"
    assert event.message.tried_to_allocate == round(9.47 * 2**30)
    assert facts.tracebacks_cut == 0


def test_a_paste_that_starts_at_a_frame_is_a_headless_traceback() -> None:
    # qlora-82: starts at '  File ".../lr_scheduler.py", line 69, in wrapper'
    facts = read_log(paste_path("qlora-82"))
    [exception] = facts.exceptions
    assert exception.exception_class == "RuntimeError"
    assert exception.traceback is not None and exception.traceback.headless
    assert len(exception.traceback.frames) == 5
    assert exception.phase is Phase.OPTIMIZER_STEP


def test_every_window_of_a_traceback_is_never_no_failure(tmp_path: Path) -> None:
    lines = paste("qlora-82").splitlines()
    for start in range(len(lines)):
        for end in range(start + 1, len(lines) + 1):
            target = tmp_path / f"w{start}_{end}.txt"
            target.write_text("\n".join(lines[start:end]) + "\n")
            assert _verdict(target) != "no_failure", (start, end)


def test_hydra_wraps_a_standard_traceback(tmp_path: Path) -> None:
    # Hydra's own lines around a real traceback (qlora-82's), as hydra.main prints them
    lines = [
        "Error executing job with overrides: ['trainer.devices=1', 'model=llama']",
        "Traceback (most recent call last):",
        *paste("qlora-82").splitlines(),
        "",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ]
    target = tmp_path / "paste.txt"
    target.write_text("\n".join(lines) + "\n")
    facts = read_log(target)
    [exception] = facts.exceptions
    assert exception.exception_class == "RuntimeError"
    assert exception.traceback is not None and not exception.traceback.headless
    assert _verdict(target) == "other_failure"


@pytest.mark.parametrize(
    ("case", "cls"),
    [
        ("vllm-10439", "ValueError"),  # docker compose + vLLM logger prefix on every line
        ("vllm-5376", "RuntimeError"),  # journald prefix, a CJK month
        ("h2ollmstudio-945", "pydantic_core._pydantic_core.ValidationError"),
        ("lightning-17790", "pydantic.error_wrappers.ValidationError"),
    ],
)
def test_exceptions_behind_prefixes_or_without_their_header(case: str, cls: str) -> None:
    facts = read_log(paste_path(case))
    assert [e.exception_class for e in facts.exceptions][:1] == [cls]


def test_deepspeed_config_rejected_by_pydantic_is_a_config_error() -> None:
    for case in ("lightning-17790", "h2ollmstudio-945", "deepspeed-3827"):
        facts = read_log(paste_path(case))
        assert facts.config_errors, case
        assert _verdict(paste_path(case)) == "config_error", case


@pytest.mark.parametrize(
    ("case", "phase"),
    [
        ("alpaca-rlhf-6", Phase.MODEL_INIT),  # torch/nn/modules/module.py in convert (.to())
        ("transformers-26203", Phase.MODEL_INIT),  # IPython's "_BaseAutoModelClass.from_pretrained"
        ("qlora-82", Phase.OPTIMIZER_STEP),  # bitsandbytes/optim/optimizer.py in step
    ],
)
def test_phase_from_the_frames_of_a_paste(case: str, phase: Phase) -> None:
    facts = read_log(paste_path(case))
    events = [*facts.oom_events, *facts.exceptions]
    assert events and events[0].phase is phase


def test_vllm_cache_sizing_frames_are_generation() -> None:
    # vllm-10439: worker.py raise_if_cache_size_invalid (the KV cache does not fit)
    [exception] = read_log(paste_path("vllm-10439")).exceptions
    assert exception.phase is Phase.GENERATION


def test_the_words_wrapping_a_message_are_kept() -> None:
    # stanfordalpaca-65: FSDP's state_dict warning quotes the OOM after "Error: "
    [event] = read_log(paste_path("stanfordalpaca-65")).oom_events
    assert event.preamble is not None and "state_dict" in event.preamble
    assert event.message.tried_to_allocate == 502 * 2**20
    # a message after its own exception class has none
    [plain] = read_log(paste_path("deepspeed-3869")).oom_events
    assert plain.preamble is None


_FRAMES = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 251, in backward\n'
    "    loss.backward()\n"
    '  File "/usr/lib/python3.8/site-packages/torch/autograd/__init__.py", line 147, in backward\n'
    "    allow_unreachable=True)\n"
)


@pytest.mark.parametrize("cut", ["Runt", "ray.exceptions.OutOfMe", "torch.cuda.OutOfMem"])
def test_an_exception_line_cut_mid_word_is_a_cut_traceback(tmp_path: Path, cut: str) -> None:
    # transformers-12783 ends at "Runt", vllm-1765 at "ray.exceptions.OutOfMe": a word cut by
    # the paste is no exception, and was read as one: "not for lack of memory", 85%.
    path = tmp_path / "paste.txt"
    path.write_text(_FRAMES + cut)
    report = analyze([path])
    assert report.verdict.value == "unknown"
    assert [d.id for d in report.diagnoses][:1] == ["insufficient_evidence"]
    assert all(d.id != "not_oom" for d in report.diagnoses)


@pytest.mark.parametrize("line", ["KeyboardInterrupt", "SystemExit"])
def test_an_exception_printed_without_a_message_is_still_one(tmp_path: Path, line: str) -> None:
    path = tmp_path / "paste.txt"
    path.write_text(_FRAMES + line + "\n")
    [exception] = read_log(path).exceptions
    assert exception.exception_class == line


def test_a_memory_error_printed_without_a_message_is_a_host_allocation_failure(
    tmp_path: Path,
) -> None:
    path = tmp_path / "paste.txt"
    path.write_text(_FRAMES + "MemoryError\n")
    [event] = read_log(path).oom_events
    assert event.message.kind.value == "host" and event.message.exception_class == "MemoryError"


def test_a_message_cut_inside_out_of_memory_is_never_a_confident_not_oom(tmp_path: Path) -> None:
    path = tmp_path / "paste.txt"
    path.write_text(_FRAMES + "RuntimeError: CUDA out of mem")
    report = analyze([path])
    assert all(d.confidence < 0.5 for d in report.diagnoses if d.id == "not_oom")
