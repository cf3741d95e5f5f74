"""A traceback that stops inside a library's config check is that check failing."""

from __future__ import annotations

from oomlens.derive.rejections import check_rejection
from oomlens.facts import SourceRef
from oomlens.facts.log import ExceptionEvent, Frame, Phase, Traceback
from oomlens.facts.signals import Rejection

SRC = SourceRef("paste.txt", 12)
# https://github.com/deepspeedai/DeepSpeed/issues/3228: a rich traceback whose paste stops in
# DeepSpeed 0.9.0's _configure_train_batch_size (the frames above it: the engine building its
# DeepSpeedConfig)
SITE = "/home/chenmingrui/.local/lib/python3.10/site-packages/deepspeed"
FRAMES = (
    Frame(f"{SITE}/runtime/config.py", 764, "__init__"),
    Frame(f"{SITE}/runtime/config.py", 935, "_configure_train_batch_size"),
)


def _event(frames: tuple[Frame, ...], cls: str = "", text: str = "") -> ExceptionEvent:
    traceback = Traceback(SRC, frames, 0, cls or None, text or None, not cls, False, style="rich")
    return ExceptionEvent(SRC, cls, text, traceback, Phase.UNKNOWN, None, False, None, False)


def test_cut_inside_the_batch_check_is_a_batch_rejection() -> None:
    found = check_rejection(_event(FRAMES))
    assert found is not None and found.kind is Rejection.BATCH
    assert "_configure_train_batch_size" in found.text
    assert "micro_batch * grad_acc" in found.text  # the condition, read from DeepSpeed's code


def test_an_assertion_error_there_is_one_too() -> None:
    found = check_rejection(_event(FRAMES, "AssertionError", "AssertionError"))
    assert found is not None and found.kind is Rejection.BATCH


def test_another_error_inside_a_check_is_not_the_check_failing() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB"
    assert check_rejection(_event(FRAMES, "torch.OutOfMemoryError", oom)) is None


def test_a_frame_that_checks_nothing_says_nothing() -> None:
    frames = (Frame(f"{SITE}/runtime/engine.py", 1, "forward"),)
    assert check_rejection(_event(frames)) is None
