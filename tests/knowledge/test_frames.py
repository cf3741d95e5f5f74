"""Tracebacks read through the library knowledge.

The frames are those of public threads (each URL given), printed by torch, DeepSpeed, FSDP and
Lightning at versions of their own: none of these threads prompted a rule (the data's rules read
the libraries' source, ``scripts/gen_library_knowledge.py``).
"""

from __future__ import annotations

import pytest

from oomlens.facts.log import Frame, Phase
from oomlens.ingest.log.traceback import classify_phase
from oomlens.knowledge.frames import covers, frame_role, library_file, phase_of_role


def stack(*spec: tuple[str, int, str]) -> list[Frame]:
    return [Frame(path, line, function) for path, line, function in spec]


SP = "/home/export/base/sc100010/sc100010/.conda/envs/torch/lib/python3.10/site-packages"
PL = "/.../path.../.conda/envs/environment/lib/python3.10/site-packages/pytorch_lightning"
OPT = "/opt/conda/lib/python3.11/site-packages/torch"
VG = "/home/baochaoqian/.conda/envs/videoGen/lib/python3.10/site-packages/torch"


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        # https://github.com/huggingface/trl/pull/2776 (GRPO, torch 2.x AdamW's foreach path:
        # the square root of exp_avg_sq is a new tensor per parameter group)
        (
            stack(
                (f"{SP}/torch/optim/optimizer.py", 487, "wrapper"),
                (f"{SP}/torch/optim/optimizer.py", 91, "_use_grad"),
                (f"{SP}/torch/optim/adamw.py", 220, "step"),
                (f"{SP}/torch/optim/optimizer.py", 154, "maybe_fallback"),
                (f"{SP}/torch/optim/adamw.py", 782, "adamw"),
                (f"{SP}/torch/optim/adamw.py", 606, "_multi_tensor_adamw"),
            ),
            Phase.OPTIMIZER_STEP,
        ),
        # https://github.com/bmaltais/kohya_ss/issues/1048 (a Windows venv)
        (
            stack(
                (
                    r"C:\kohya_ss\venv\lib\site-packages\torch\optim\adamw.py",
                    566,
                    "_multi_tensor_adamw",
                )
            ),
            Phase.OPTIMIZER_STEP,
        ),
        # https://github.com/bigcode-project/starcoder/issues/15 (a save recursing through
        # state_dict, cut to its innermost frames)
        (
            stack(
                (
                    "/home/gpu/.local/lib/python3.10/site-packages/torch/nn/modules/module.py",
                    1818,
                    "state_dict",
                ),
                (
                    "/home/gpu/.local/lib/python3.10/site-packages/torch/nn/modules/module.py",
                    1818,
                    "state_dict",
                ),
                (
                    "/home/gpu/.local/lib/python3.10/site-packages/torch/nn/modules/module.py",
                    1815,
                    "state_dict",
                ),
            ),
            Phase.CHECKPOINT_SAVE,
        ),
        # https://github.com/ByteDance-Seed/Bagel/issues/157 (FSDP full state dict for a save,
        # called from the user's own helper)
        (
            stack(
                ("/fsx/kuoalle/dev/Bagel/pretrain_unified_navit.py", 729, "main"),
                ("/fsx/kuoalle/dev/Bagel/train/fsdp_utils.py", 109, "fsdp_save_ckpt"),
                (f"{OPT}/nn/modules/module.py", 2215, "state_dict"),
                (f"{OPT}/utils/_contextlib.py", 116, "decorate_context"),
                (f"{OPT}/distributed/fsdp/_state_dict_utils.py", 782, "_pre_state_dict_hook"),
                (f"{OPT}/distributed/fsdp/_state_dict_utils.py", 303, "_full_pre_state_dict_hook"),
            ),
            Phase.CHECKPOINT_SAVE,
        ),
        # https://github.com/anveshane/Comfyui_turbodiffusion/issues/37 (activation
        # checkpointing around a block's forward: the forward's activations)
        (
            stack(
                (f"{VG}/distributed/algorithms/_checkpoint/checkpoint_wrapper.py", 171, "forward"),
                (f"{VG}/_compile.py", 53, "inner"),
                (f"{VG}/_dynamo/eval_frame.py", 1044, "_fn"),
                (f"{VG}/utils/checkpoint.py", 503, "checkpoint"),
                (f"{VG}/nn/modules/module.py", 1775, "_wrapped_call_impl"),
                (f"{VG}/nn/modules/module.py", 1786, "_call_impl"),
            ),
            Phase.FORWARD,
        ),
        # https://github.com/Lightning-AI/pytorch-lightning/issues/18059 (the pytorch_lightning
        # package name of Lightning 1.x / 2.x)
        (
            stack(
                (f"{PL}/loops/training_epoch_loop.py", 218, "advance"),
                (f"{PL}/loops/optimization/automatic.py", 185, "run"),
                (f"{PL}/loops/optimization/automatic.py", 261, "_optimizer_step"),
                (f"{PL}/trainer/call.py", 142, "_call_lightning_module_hook"),
                (f"{PL}/core/module.py", 1265, "optimizer_step"),
                (f"{PL}/core/optimizer.py", 158, "step"),
            ),
            Phase.OPTIMIZER_STEP,
        ),
    ],
)
def test_phase_from_library_frames(frames: list[Frame], phase: Phase) -> None:
    assert classify_phase(frames)[0] is phase


def test_batch_assertion_is_the_batch_check() -> None:
    """https://github.com/bigcode-project/starcoder/issues/77: a rich traceback ending in
    DeepSpeed's ``_batch_assertion``; the data names the condition it asserts."""
    found = frame_role(
        "/opt/conda/lib/python3.7/site-packages/deepspeed/runtime/config.py", "_batch_assertion"
    )
    assert found is not None
    assert found.role == "config_check" and found.library == "deepspeed"
    assert any("micro_batch * grad_acc" in check for check in found.checks)
    assert phase_of_role(found.role) is None  # a start-up check, not a training phase


def test_paths_are_matched_on_whole_components() -> None:
    assert library_file("/x/site-packages/torch/optim/adam.py") == "torch/optim/adam.py"
    assert library_file("/home/me/mytorch/optim/adam.py") is None
    assert library_file("train.py") is None


def test_a_frame_the_data_lacks_is_read_by_name() -> None:
    """User code, and a library function the data does not hold, still place the event."""
    assert classify_phase(stack(("/home/me/train.py", 10, "evaluate")))[0] is Phase.EVALUATION
    later = "/usr/lib/python3/site-packages/deepspeed/runtime/engine.py"
    assert frame_role(later, "_fused_backward_v2") is None
    assert classify_phase(stack((later, 1, "_fused_backward_v2")))[0] is Phase.BACKWARD


def test_the_data_records_what_it_covers() -> None:
    libraries = {cover["library"] for cover in covers()}
    assert {"deepspeed", "torch", "transformers", "accelerate", "peft", "trl"} <= libraries
    assert {"lightning", "vllm", "diffusers", "megatron", "bitsandbytes"} <= libraries
    assert all(cover["version"] and cover["from"] for cover in covers())


def test_a_file_of_another_release_is_read_by_the_library_s_names() -> None:
    """https://github.com/deepspeedai/DeepSpeed/issues/237: DeepSpeed 0.1's ``deepspeed/pt/``
    files, which no release the data reads has; their functions kept their names."""
    site = "/opt/conda/envs/python3.6/lib/python3.6/site-packages/deepspeed"
    frames = stack(
        ("pretrain_gpt2.py", 656, "main"),
        ("pretrain_gpt2.py", 171, "setup_model_and_optimizer"),
        (f"{site}/__init__.py", 98, "initialize"),
        (f"{site}/pt/deepspeed_light.py", 172, "__init__"),
        (f"{site}/pt/deepspeed_light.py", 496, "_configure_optimizer"),
        (f"{site}/pt/deepspeed_light.py", 591, "_configure_zero_optimizer"),
        (f"{site}/pt/deepspeed_zero_optimizer.py", 333, "__init__"),
    )
    found = frame_role(f"{site}/pt/deepspeed_light.py", "_configure_zero_optimizer")
    assert found is not None and found.role == "model_init" and found.file == "deepspeed/"
    assert classify_phase(frames)[0] is Phase.MODEL_INIT


def test_compiler_internals_are_not_read_as_phases() -> None:
    """torch's code generation has its own ``generate`` and ``load``: a frame there says
    nothing about the training phase (the frames around it do)."""
    inductor = "/usr/lib/python3/site-packages/torch/_inductor/codecache.py"
    assert frame_role(inductor, "load") is None
    assert frame_role(inductor, "generate") is None
