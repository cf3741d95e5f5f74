"""Traceback assembly and phase classification."""

from __future__ import annotations

import pytest

from oomlens.facts import SourceRef
from oomlens.facts.log import Frame, Phase
from oomlens.ingest.log import read_log
from oomlens.ingest.log.traceback import TracebackAssembler, classify_phase
from tests._corpus import case_dir

DS = "/usr/lib/python3/site-packages/deepspeed/runtime"
TORCH = "/usr/lib/python3/site-packages/torch"
HF = "/usr/lib/python3/site-packages/transformers"


def frames(*spec: tuple[str, str]) -> list[Frame]:
    return [Frame(path, i + 1, func) for i, (path, func) in enumerate(spec)]


# Frame names and files are those the reference notes name as ZeRO-3 allocation sites (section
# 1.12) and the HF Trainer / torch call paths.
@pytest.mark.parametrize(
    ("stack", "phase"),
    [
        (
            [
                ("train.py", "<module>"),
                (f"{DS}/../__init__.py", "initialize"),
                (f"{DS}/engine.py", "__init__"),
                (f"{DS}/engine.py", "_configure_distributed_model"),
                (f"{TORCH}/nn/modules/module.py", "to"),
            ],
            Phase.MODEL_INIT,
        ),
        (
            [("train.py", "<module>"), (f"{DS}/zero/partition_parameters.py", "_post_init_method")],
            Phase.MODEL_INIT,
        ),
        (
            [
                ("train.py", "main"),
                (f"{TORCH}/nn/modules/module.py", "_call_impl"),
                ("model.py", "forward"),
                (f"{DS}/zero/parameter_offload.py", "_pre_forward_module_hook"),
                (f"{DS}/zero/partitioned_param_coordinator.py", "fetch_sub_module"),
            ],
            Phase.FORWARD,
        ),
        (
            # a gather handle built inside the forward's fetch (one GPU, offloaded parameters)
            [
                ("train_zero3.py", "main"),
                (f"{DS}/engine.py", "forward"),
                (f"{DS}/zero/parameter_offload.py", "_pre_forward_module_hook"),
                (f"{DS}/zero/partitioned_param_coordinator.py", "fetch_sub_module"),
                (f"{DS}/zero/partitioned_param_coordinator.py", "__all_gather_params_"),
                (f"{DS}/zero/partition_parameters.py", "all_gather_coalesced"),
                (f"{DS}/zero/partition_parameters.py", "__init__"),
            ],
            Phase.FORWARD,
        ),
        (
            [
                ("train.py", "main"),
                (f"{DS}/engine.py", "backward"),
                (f"{TORCH}/_tensor.py", "backward"),
                (f"{TORCH}/autograd/graph.py", "_engine_run_backward"),
                (f"{DS}/zero/stage3.py", "reduce_partition_and_remove_grads"),
            ],
            Phase.BACKWARD,
        ),
        (
            [
                ("train.py", "main"),
                (f"{TORCH}/_tensor.py", "backward"),
                (f"{TORCH}/utils/checkpoint.py", "unpack_hook"),
                (f"{TORCH}/nn/modules/module.py", "_call_impl"),
                ("model.py", "forward"),
            ],
            Phase.BACKWARD,
        ),
        (
            [
                ("train.py", "main"),
                (f"{DS}/engine.py", "step"),
                (f"{DS}/engine.py", "_take_model_step"),
                (f"{DS}/zero/stage3.py", "_optimizer_step"),
                (f"{TORCH}/optim/adam.py", "_multi_tensor_adam"),
            ],
            Phase.OPTIMIZER_STEP,
        ),
        (
            [
                ("train.py", "main"),
                (f"{HF}/trainer.py", "evaluate"),
                (f"{HF}/trainer.py", "evaluation_loop"),
                (f"{TORCH}/nn/modules/module.py", "_call_impl"),
                ("model.py", "forward"),
            ],
            Phase.EVALUATION,
        ),
        (
            [
                ("gen.py", "main"),
                (f"{TORCH}/utils/_contextlib.py", "decorate_context"),
                (f"{HF}/generation/utils.py", "generate"),
                (f"{HF}/generation/utils.py", "_sample"),
                ("model.py", "forward"),
            ],
            Phase.GENERATION,
        ),
        (
            [
                ("train.py", "main"),
                (f"{DS}/engine.py", "save_16bit_model"),
                (f"{DS}/engine.py", "_zero3_consolidated_16bit_state_dict"),
            ],
            Phase.CHECKPOINT_SAVE,
        ),
        (
            [
                ("train.py", "main"),
                (f"{TORCH}/utils/data/dataloader.py", "__next__"),
                (f"{TORCH}/utils/data/dataloader.py", "_next_data"),
            ],
            Phase.DATA_LOADING,
        ),
        ([("probe.py", "<module>")], Phase.UNKNOWN),
        (
            # nothing else speaks and the error leaves a constructor: the object being built
            # (github.com/chidiwilliams/buzz/issues/439: faster-whisper's model loading)
            [
                ("multiprocessing\\process.py", "run"),
                ("buzz\\transcriber.py", "transcribe_faster_whisper"),
                ("faster_whisper\\transcribe.py", "__init__"),
            ],
            Phase.MODEL_INIT,
        ),
        (
            # a constructor that is not where the error left is no model init
            [("app.py", "__init__"), ("app.py", "handle")],
            Phase.UNKNOWN,
        ),
        (
            # a constructor called inside a training step is no model init either
            [
                ("train.py", "main"),
                (f"{TORCH}/_tensor.py", "backward"),
                ("hooks.py", "__init__"),
            ],
            Phase.BACKWARD,
        ),
    ],
)
def test_phase_from_frames(stack: list[tuple[str, str]], phase: Phase) -> None:
    result, evidence = classify_phase(frames(*stack))
    assert result is phase
    assert (evidence is None) == (phase is Phase.UNKNOWN)


def _feed(assembler: TracebackAssembler, lines: list[str]):
    out = []
    for number, line in enumerate(lines, start=1):
        finished = assembler.feed(line, SourceRef("log", number))
        if finished is not None:
            out.append(finished)
    finished = assembler.close()
    if finished is not None:
        out.append(finished)
    return out


def test_chained_exceptions_and_multi_line_messages() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/tmp/oomlab/B9_cublas_full.py", line 17, in <module>',
        '    a = torch.ones(64, 64, device="cuda")',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB.",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/tmp/oomlab/B9_cublas_full.py", line 21, in <module>',
        "torch.AcceleratorError: CUDA error: out of memory",
        "Search for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
        "group__CUDART__TYPES.html for more information.",
        "",
    ]
    first, second = _feed(TracebackAssembler(), lines)
    assert first.exception_class == "torch.OutOfMemoryError" and not first.traceback.chained
    assert second.exception_class == "torch.AcceleratorError" and second.traceback.chained
    assert second.text.count("\n") == 1 and second.source.line == 10


def test_cut_traceback_is_reported_as_cut() -> None:
    (finished,) = _feed(
        TracebackAssembler(), ["Traceback (most recent call last):", '  File "a.py", line 1, in f']
    )
    assert (
        finished.traceback is not None and finished.traceback.cut and finished.exception_class == ""
    )


def test_long_traceback_keeps_head_and_tail_frames() -> None:
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "f{i}.py", line {i}, in g{i}' for i in range(5000)]
    lines += ["RecursionError: maximum recursion depth exceeded"]
    (finished,) = _feed(TracebackAssembler(), lines)
    tb = finished.traceback
    assert tb is not None and len(tb.frames) < 100
    assert tb.frames[0].function == "g0" and tb.frames[-1].function == "g4999"
    assert tb.frames_omitted == 5000 - len(tb.frames)


def test_the_captured_prefetch_overshoot_fails_in_the_forward_not_at_init() -> None:
    # the real traceback: its innermost frame is _no_gather_coalesced.__init__ (DeepSpeed's
    # runtime), called from the engine's forward
    log = read_log(case_dir("prefetch_overshoot_captured") / "train.log")
    (event,) = log.oom_events
    assert event.traceback is not None
    assert event.traceback.frames[-1].function == "__init__"
    assert event.phase is Phase.FORWARD


def test_a_found_allocator_start_is_not_searched_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # fuzz campaign I: every line of an unfinished OOM message squeezed the whole message
    # again (quadratic: 20,000 such 5 KB lines took 15 s of CPU, 8 of them here)
    from oomlens.ingest.log import traceback as tb

    squeezed: list[int] = []
    original = tb.squeezed_text

    def counting(text: str):  # type: ignore[no-untyped-def]
        squeezed.append(len(text))
        return original(text)

    monkeypatch.setattr(tb, "squeezed_text", counting)
    assembler = TracebackAssembler()
    first = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. " + "x" * 5000
    assembler.start_exception("torch.OutOfMemoryError", first, SourceRef("log", 1))
    for n in range(2, 60):
        assembler.feed("y" * 5000, SourceRef("log", n))
        assert assembler.may_hold_allocator_message()
    assert sum(squeezed) < 3 * len(first)


def test_each_frame_keeps_the_log_line_it_was_read_on() -> None:
    # audit: the phase's frame was cited at "Traceback (most recent call last):"; a frame
    # now says where it was printed, and a rich frame wrapped over two box lines, its first
    lines = [
        "╭──────── Traceback (most recent call last) ────────╮",
        "│ /home/user/train.py:12 in <module>                 │",
        "│ ❱ 12 │   main()                                    │",
        "│ /usr/lib/python3/site-packages/deepspeed/runtime/  │",
        "│ engine.py:1855 in forward                          │",
        "╰────────────────────────────────────────────────────╯",
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "",
        "Traceback (most recent call last):",
        '  File "/home/user/train.py", line 12, in <module>',
        "    main()",
        '  File "/home/user/train.py", line 8, in main',
        "    loss.backward()",
        "RuntimeError: boom",
    ]
    rich, python = _feed(TracebackAssembler(), lines)
    assert rich.traceback is not None and python.traceback is not None
    assert [(f.function, f.at) for f in rich.traceback.frames] == [("<module>", 2), ("forward", 4)]
    assert [(f.function, f.at) for f in python.traceback.frames] == [("<module>", 10), ("main", 12)]


def test_the_phase_is_cited_at_its_frame_not_at_the_traceback() -> None:
    # prefetch_overshoot: rank 0's traceback starts on line 187; the frame that places the
    # failure in the forward pass is printed on line 234
    log = read_log(case_dir("prefetch_overshoot") / "train.log")
    event = next(e for e in log.oom_events if e.rank == 0)
    assert event.traceback is not None and event.traceback.source.line == 187
    assert event.phase_evidence is not None
    assert event.phase_evidence.endswith(
        "parameter_offload.py:543 in pre_sub_module_forward_function"
    )
    assert event.phase_source == SourceRef(event.source.path, 234, 0)
