#!/usr/bin/env python3
"""Generate ``oomlens/knowledge/library_frames.json`` from the libraries' own source.

What a traceback frame means (model loading, forward, backward, optimizer step, a ZeRO gather, a
config check, a save...) is read here from the function itself, at the versions users run: its
module path, its class and the class's bases, its name, and what its body does (the calls it
makes, the keywords it passes, the asserts it makes, the optimizer-state keys it touches).  No
frame list is copied from a corpus: ``classify`` below is the whole rule set, and each rule names
the mechanism it reads.

Sources (``SOURCES``): one public repository per library at named tags, read with ``git show`` /
``git ls-tree`` from a bare git directory (no work tree), or a released wheel / sdist where the
repository snapshot is too large to fetch (torch, transformers, vLLM).  Git directories are looked
up under ``--mirror`` as ``<owner>+<name>/repo`` (the layout the project's ``fetch`` tool lays
down) or ``<owner>+<name>``; archives under ``--dist`` by file name; torch also from an installed
``site-packages`` (``--site``).  A source that is missing is reported and skipped (the output
records only what was read).

Regenerate (one command)::

    python scripts/gen_library_knowledge.py --mirror /work/.mirror --dist DIR_OF_WHEELS \
        --site $(python -c 'import site; print(site.getsitepackages()[0])')

The output records every library, version and commit it covers.  Review its diff like code:
a role that changed says a rule or a library changed.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "oomlens" / "knowledge" / "library_frames.json"


@dataclass(frozen=True)
class Source:
    """One library at the versions read.

    ``packages`` are the package directories inside the repository (``src/accelerate``) and the
    name each has in an installed tree (``accelerate``): frame paths are matched by the latter.
    """

    library: str
    repo: str
    revs: tuple[str, ...]
    packages: tuple[tuple[str, str], ...]
    archives: tuple[str, ...] = ()
    """Wheel / sdist file names under ``--dist`` read instead of the repository."""
    site: bool = False
    """Read from ``--site`` (an installed tree) when no archive is given."""


SOURCES: tuple[Source, ...] = (
    Source(
        "deepspeed",
        "deepspeedai/DeepSpeed",
        ("v0.9.5", "v0.14.4", "v0.19.5"),
        (("deepspeed", "deepspeed"),),
    ),
    Source(
        "torch",
        "pytorch/pytorch",
        (),
        (("torch", "torch"),),
        site=True,
    ),
    Source(
        "transformers",
        "huggingface/transformers",
        (),
        (("transformers", "transformers"),),
        archives=("transformers-4.46.3-py3-none-any.whl", "transformers-5.25.0-py3-none-any.whl"),
    ),
    Source(
        "accelerate",
        "huggingface/accelerate",
        ("v0.34.2", "v1.14.0"),
        (("src/accelerate", "accelerate"),),
    ),
    Source("peft", "huggingface/peft", ("v0.13.2", "v0.20.0"), (("src/peft", "peft"),)),
    Source("trl", "huggingface/trl", ("v0.12.2", "v1.9.0"), (("trl", "trl"),)),
    Source("diffusers", "huggingface/diffusers", ("v0.40.0",), (("src/diffusers", "diffusers"),)),
    Source(
        "lightning",
        "Lightning-AI/pytorch-lightning",
        ("1.9.5", "2.2.5", "2.6.5"),
        (
            ("src/lightning", "lightning"),
            ("src/pytorch_lightning", "pytorch_lightning"),
            ("src/lightning_fabric", "lightning_fabric"),
            ("pytorch_lightning", "pytorch_lightning"),
        ),
    ),
    Source(
        "vllm",
        "vllm-project/vllm",
        (),
        (("vllm", "vllm"),),
        archives=(
            "vllm-0.6.3.post1-cp38-abi3-manylinux1_x86_64.whl",
            "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        ),
    ),
    Source(
        "megatron",
        "NVIDIA/Megatron-LM",
        ("core_r0.8.0", "core_v0.19.0"),
        (("megatron", "megatron"),),
    ),
    Source(
        "megatron-deepspeed",
        "deepspeedai/Megatron-DeepSpeed",
        ("v2.4",),
        (("megatron", "megatron"),),
    ),
    Source(
        "bitsandbytes",
        "bitsandbytes-foundation/bitsandbytes",
        ("0.41.0", "0.50.1"),
        (("bitsandbytes", "bitsandbytes"),),
    ),
)

NOT_READ = (
    r"(?:^|/)(?:tests?|testing|examples?|benchmarks?|docs|_vendor|third_party|commands|onnx)/"
    r"|/(?:modeling_tf_|modeling_flax_|convert_|tokenization_|image_processing_|"
    r"video_processing_|feature_extraction_|processing_|dummy_)\w*\.py$"
    r"|^torch/(?:_inductor|_dynamo|_decomp|_refs|_prims|_prims_common|fx|export|_export|ao|"
    r"_higher_order_ops|_meta_registrations\.py|_library|jit|package|_lazy|_subclasses|"
    r"utils/benchmark|utils/tensorboard|_logging|_strobelight|compiler|_numpy)"
    r"|^lightning/app/|^lightning_app/"
)
"""Not code of a training or inference phase: tests, examples, command-line tools, other
frameworks' models (TensorFlow, Flax), conversion scripts, tokenizers and image processors
(CPU work inside a data loader's frames, which place it), torch's compiler and tracing
internals (their ``generate``, ``load``, ``save`` are code generation and graph plumbing,
whatever phase compiled them), Lightning's app framework.  Recorded in the output: a frame
there is read by its name, not by the rest of its library."""
SKIP_DIRS = re.compile(NOT_READ)

# --- what a function body shows ------------------------------------------------------------


@dataclass
class Body:
    """What one function's own body does (nested functions are their own)."""

    calls: set[str] = field(default_factory=set)
    """Called names: the last component (``torch.save(...)``: ``save``) and the dotted name."""
    true_keywords: set[str] = field(default_factory=set)
    """Keywords passed a literal True (``pin_memory=True``)."""
    asserts: list[str] = field(default_factory=list)
    """Each assert's test, as source."""
    raises: int = 0
    subscripts: set[str] = field(default_factory=set)
    """String keys indexed (``state["exp_avg_sq"]``)."""
    attributes: set[str] = field(default_factory=set)
    """Attribute names read or written (``.exp_avg_sq``, ``.grad``)."""
    names: set[str] = field(default_factory=set)
    decorators: set[str] = field(default_factory=set)
    trivial: bool = False
    """One statement returning a name, an attribute or a constant: a getter."""


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        inner = _dotted(node.func)
        parts.append(f"{inner}()" if inner else "?")
    else:
        return ".".join(reversed(parts)) if parts else None
    return ".".join(reversed(parts))


class _BodyReader(ast.NodeVisitor):
    def __init__(self, body: Body) -> None:
        self.body = body

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # nested: not this body
        return

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        return

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name:
            self.body.calls.add(name)
            self.body.calls.add(name.rsplit(".", 1)[-1])
        for keyword in node.keywords:
            if (
                keyword.arg
                and isinstance(keyword.value, ast.Constant)
                and keyword.value.value is True
            ):
                self.body.true_keywords.add(keyword.arg)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.body.asserts.append(ast.unparse(node.test)[:200])
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.body.raises += 1
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.body.subscripts.add(node.slice.value)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.body.attributes.add(node.attr)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self.body.names.add(node.id)


def read_body(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Body:
    body = Body()
    reader = _BodyReader(body)
    for statement in node.body:
        reader.visit(statement)
    statements = [
        s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    body.trivial = len(statements) == 1 and (
        isinstance(statements[0], ast.Return)
        and isinstance(statements[0].value, ast.Name | ast.Attribute | ast.Constant | type(None))
        or isinstance(statements[0], ast.Pass)
    )
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = _dotted(target)
        if name:
            body.decorators.add(name.rsplit(".", 1)[-1])
    return body


# --- the rules -----------------------------------------------------------------------------

ROLES = (
    "config_check",
    "model_init",
    "model_load",
    "checkpoint_save",
    "checkpoint_load",
    "data_loading",
    "forward",
    "backward",
    "grad_reduce",
    "optimizer_step",
    "param_gather",
    "param_partition",
    "evaluation",
    "generation",
    "kv_cache",
    "pinning",
    "collective",
    "activation_checkpoint",
    "training_loop",
)

_CHECK_NAME = re.compile(
    r"(?:^|_)(?:assert\w*|check(?!point)\w*|validat\w*|verify\w*|sanity\w*)$|^_?(?:assert|check|validate|verify|ensure)_(?!point)"
)
_VALIDATOR_DECORATORS = {"validator", "root_validator", "field_validator", "model_validator"}
_SAVE_NAME = re.compile(
    r"(?:^|_)save(?:_|$)|(?:^|_)(?:state_dict|consolidated\w*|export\w*)$|^(?:_?get_)?\w*state_dict$|^_?consolidate"
)
_LOAD_NAME = re.compile(r"(?:^|_)(?:load|reload|restore|resume)(?:_|$)|from_pretrained$|^_?load")
_SAVE_CALLS = {
    "torch.save",
    "save_file",
    "safetensors.torch.save_file",
    "save_pretrained",
    "_save",
    "save_checkpoint",
    "save_state_dict",
    "save_model",
    "dcp.save",
    "_save_to_state_dict",
    "async_save",
}
_LOAD_CALLS = {
    "torch.load",
    "load_file",
    "safe_open",
    "load_state_dict",
    "_load_from_state_dict",
    "from_pretrained",
    "load_checkpoint",
    "safe_load_file",
    "load_sharded_checkpoint",
}
_GENERATE_NAME = re.compile(
    r"^_?(?:generate\w*|\w*_generate|sample|_sample|\w*(?:greedy|beam|contrastive|assisted)_\w*|\w*decod(?:e|ing)_step\w*|generate_until|prefill\w*)$"
)
_EVAL_NAME = re.compile(
    r"^_?(?:eval\w*|\w*_eval|evaluat\w*|\w*_evaluat\w*|predict\w*|\w*_predict\w*|prediction\w*|test_step|\w*_test_step|validation_step|validation_loop|\w*_validation_step|_?run_validation|_evaluation_step|val_step|validate|nested_(?:concat|numpify|truncate|gather)|_nested_gather|gather_for_metrics|torch_pad_and_concatenate)$"
)
_DATA_NAME = re.compile(
    r"^_?(?:__getitem__|__iter__|__next__|_next_data|_next_index|collate\w*|\w*_collate\w*|_get_data|fetch|_process_data|get_batch\w*|\w*dataloader\w*|\w*data_loader\w*)$"
)
_FORWARD_NAME = re.compile(r"^_?(?:forward\w*|\w*_forward\w*|_call_impl|_wrapped_call_impl)$")
_BACKWARD_NAME = re.compile(
    r"^_?(?:backward\w*|\w*_backward\w*|run_backward|_engine_run_backward|unpack_hook|recompute\w*|\w*_grad_hook|\w*grad_hook\w*|grad)$"
)
_REDUCE_NAME = re.compile(
    r"reduce\w*grad|grads?_(?:reduce|allreduce|reduction)|reduce_ipg|ipg\w*reduce|reduce\w*bucket|bucket\w*reduce|allreduce_gradients|reduce_gradients|average_tensor|reduce_partition|gradient_reduction|reduce_scatter_grad|_reduce_grad|reduce_\w*_grads?"
)
_STEP_NAME = re.compile(
    r"^_?(?:step|\w*_step|step_\w+|zero_grad|_init_group|_single_tensor_\w+|_multi_tensor_\w+|_fused_\w+|unscale\w*|\w*clip_grad\w*|_update_scale|update_scale|initialize_optimizer_states|_init_state\w*|init_state\w*|_apply_optimizer)$"
)
_GATHER_NAME = re.compile(
    r"all_gather_param|fetch_sub_module|_all_gather\w*|gather_param\w*|(?:^|_)fetch_params?|prefetch\w*|__all_gather\w*|_gather_params\w*|unshard|_unshard\w*|summon_full_params|all_gather_coalesced|all_gather_dp_groups|gathered_parameters"
)
_PARTITION_NAME = re.compile(
    r"(?:^|_)partition\w*|release_sub_module|_release\w*|reshard|_reshard\w*|_partition_param\w*|_create_fp\d+_partitions\w*|defragment"
)
_PIN_NAME = re.compile(r"(?:^|_)pin(?:_memory|ned)?(?:_|$)|pin_memory|pinned")
_INIT_NAME = re.compile(
    r"^_?(?:__init__|_post_init_method|post_init|init_weights|_init_weights|initialize_weights|reset_parameters|initialize|_initialize\w*|deepspeed_init|init_model|_init_model|build_model\w*|_build_model\w*|get_model|setup_model\w*|model_provider\w*|_configure_\w+|configure_\w+|_?prepare(?:_\w+)?|_?create_\w*(?:optimizer|model|scheduler|partition|group|buffer|param|flat|engine)\w*|_setup\w*|setup\w*|to|cuda|_apply|convert|_to_empty\w*|to_empty|materialize\w*|_materialize\w*|get_peft_model|inject_adapter\w*|_create_and_replace|prepare_model_for_kbit_training)$"
)
_STEP_TIME_PREPARE = re.compile(
    r"input|batch|data|grad|sub_group|fp32|_for_|step|loss|label|output|cache|attention|mask|position|token|prompt|logits|sample"
)
"""What a ``prepare`` / ``setup`` function made each step handles (inputs, gradients...)."""
_LOOP_NAME = re.compile(
    r"^_?(?:train|fit|_fit_impl|run|run_stage|_run_stage|advance|_inner_training_loop|training_step|train_step|run_training_batch|pretrain|train_epoch|_run_epoch|training_loop|run_training_epoch|train_batch)$"
)
_LOOP_CALLS = {
    "train",
    "backward",
    "step",
    "training_step",
    "train_step",
    "_inner_training_loop",
    "fit",
    "run",
    "advance",
    "train_batch",
    "forward_backward_func",
    "optimizer_step",
    "_run_epoch",
    "train_epoch",
    "run_training_batch",
    "_run_stage",
    "_fit_impl",
}
_COLLECTIVE_CALLS = {
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_reduce_coalesced",
    "_all_gather_base",
    "_reduce_scatter_base",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_to_all_single",
    "gather",
    "scatter",
}
_OPTIMIZER_STATE = {
    "exp_avg",
    "exp_avg_sq",
    "momentum_buffer",
    "square_avg",
    "acc_delta",
    "sum",
    "max_exp_avg_sq",
    "state1",
    "state2",
    "exp_inf",
    "ax",
    "mu",
    "eta",
}
_OPTIMIZER_MATH = {
    "addcdiv_",
    "addcmul_",
    "lerp_",
    "_foreach_addcdiv_",
    "_foreach_addcmul_",
    "_foreach_lerp_",
    "_foreach_sqrt",
    "adam",
    "adamw",
    "_fused_adam",
    "_fused_adamw",
    "optimizer_update_8bit",
    "optimizer_update_32bit",
    "optimizer_update_8bit_blockwise",
    "optimizer_update_32bit_blockwise",
    "adam_update",
    "step_fused",
    "multi_tensor_applier",
}
_MODULE_BASES = re.compile(
    r"(?:^|\.)(?:Module|\w+Module|\w+Model|PreTrainedModel|ModelMixin|LightningModule|\w+Layer|\w+Block|\w+Attention|\w+MLP|Linear\w*)$"
)
_OPTIMIZER_BASES = re.compile(
    r"(?:^|\.)(?:Optimizer|\w+Optimizer\w*|Optimizer8bit|Optimizer1State|Optimizer2State|LossScaler\w*|\w+Scaler)$"
)
_DATA_BASES = re.compile(
    r"(?:Dataset|DataLoader|Sampler|_BaseDataLoaderIter|DataCollator\w*|Iter\w*Dataset|\w+Iterator)$"
)


def _module_parts(path: str) -> str:
    return "/" + path.removesuffix(".py") + "/"


def classify(
    path: str, owner: str | None, bases: tuple[str, ...], name: str, body: Body
) -> tuple[str | None, list[str]]:
    """The role of function ``name`` (a method of class ``owner`` with ``bases`` when owner is
    not None) defined in package file ``path`` (``deepspeed/runtime/engine.py``), and the checks
    it makes (the asserts' tests of a config check).  ``(None, [])`` when nothing shows one."""
    module = _module_parts(path)
    calls = body.calls
    if body.trivial or re.match(
        r"^_?(?:register|remove|_maybe_warn|get_\w*hooks?$|_get_\w*hooks?$)", name
    ):
        # a getter or a hook registration runs nothing of the phase its name mentions
        return None, []
    optim_module = bool(
        re.search(
            r"/(?:optim|optimizers?|adam|lamb|lion|adagrad|fp16|bf16|zero|ops/adam|ops/lamb)\w*/",
            module,
        )
    )
    is_optimizer = any(_OPTIMIZER_BASES.search(b) for b in bases) or (
        owner is not None
        and re.search(r"Optimizer|Adam|Lamb|Lion|Adagrad|Zero\w*Stage|Stage\d", owner) is not None
    )

    # A config check: validator decorators of config models; functions named for a check whose
    # body asserts or raises (``_batch_assertion`` asserts the batch triple).
    if body.decorators & _VALIDATOR_DECORATORS:
        return "config_check", body.asserts[:4]
    checks = body.asserts[:4]
    if (
        _CHECK_NAME.search(name)
        and (body.asserts or body.raises)
        and not _EVAL_NAME.match(name.removesuffix("_config"))
        or (_CHECK_NAME.search(name) and "config" in module and (body.asserts or body.raises))
    ):
        return "config_check", checks

    # Data loading: torch's data package, and datasets / loaders / collators anywhere.
    if "/utils/data/" in module and ("pin_memory" in module or _PIN_NAME.search(name)):
        return "pinning", []
    if (
        "/utils/data/" in module
        and name.startswith("__")
        and name
        not in (
            "__iter__",
            "__next__",
            "__getitem__",
            "__getitems__",
        )
    ):
        return None, []  # __repr__, __len__, __add__ of a data pipe: no loading of their own
    if (
        "/utils/data/" in module
        or (
            (owner and _DATA_BASES.search(owner) or any(_DATA_BASES.search(b) for b in bases))
            and _DATA_NAME.match(name)
        )
        or (
            re.search(r"/(?:data|datasets?|dataloaders?|data_loader\w*)/", module)
            and _DATA_NAME.match(name)
        )
    ):
        return "data_loading", []

    activation_module = re.search(
        r"/(?:utils/checkpoint|activation_checkpointing/\w+|\w*checkpointing)/", module
    )
    if activation_module:
        # activation checkpointing "saves" tensors for backward and recomputes them: no file
        if re.match(r"^_?(?:checkpoint\w*|\w*_checkpoint|non_reentrant\w*)$", name):
            return "activation_checkpoint", []
        if _BACKWARD_NAME.match(name):
            return "backward", []
        if _FORWARD_NAME.match(name):
            return "forward", []
        return None, []

    # Saving: producing a state dict to write, or writing one.
    if _SAVE_NAME.search(name) and _EVAL_NAME.search(name.replace("save", "").strip("_")):
        return None, []  # both (``_maybe_log_save_evaluate``): the inner frame tells which
    if (
        _SAVE_NAME.search(name)
        and not name.startswith(("load", "_load"))
        and "load_state_dict" not in name
    ):
        if not re.search(r"set_state_dict|_load", name):
            return "checkpoint_save", []
    if _LOAD_NAME.search(name):
        if (
            name in ("from_pretrained", "_load_pretrained_model")
            or "model" in name
            or "/modeling" in module
        ):
            return "model_load", []
        return "checkpoint_load", []

    # Inference: generation and the KV cache it needs.
    if "/vllm/" in "/" + path and re.search(
        r"kv_cache|_cache|num_available_blocks|profile_run|num_gpu_blocks|cache_engine", name
    ):
        return "kv_cache", []
    if _GENERATE_NAME.match(name) and (
        name.endswith("generate")
        or re.search(r"generat|sampl|decod|pipeline|rollout", module)
        or "generate" in name
    ):
        return "generation", []
    if "/pipelines/" in module and name == "__call__" and "diffusers" in path:
        return "generation", []

    if re.search(
        r"/(?:utils/checkpoint|activation_checkpointing/\w+|\w*checkpointing)/", module
    ) and re.match(
        r"^_?(?:checkpoint\w*|\w*_checkpoint|non_reentrant\w*|CheckpointFunction)$", name
    ):
        return "activation_checkpoint", []
    if (
        _EVAL_NAME.match(name)
        or re.search(r"/loops/(?:evaluation|prediction)_loop/", module)
        or re.search(r"/loops/(?:evaluation|prediction)_epoch_loop/", module)
    ):
        return "evaluation", []

    # Training: backward (and the gradient reduction it triggers), the optimizer step, forward.
    if re.search(r"clip_grad", name):
        return "optimizer_step", []  # clipping the gradients is the step's first part
    if _REDUCE_NAME.search(name):
        return "grad_reduce", []
    if _BACKWARD_NAME.match(name) and (name != "grad" or "/autograd/" in module):
        return "backward", []
    if (
        "backward" in calls
        and owner is not None
        and name not in ("__init__",)
        and not _LOOP_NAME.match(name)
        and not _STEP_NAME.match(name)
        and name != "training_step"
    ):
        return "backward", []
    if (is_optimizer or optim_module or "/optim/" in module) and (
        _STEP_NAME.match(name)
        or (body.subscripts & _OPTIMIZER_STATE and name != "__init__" and "state_dict" not in name)
        or (calls & _OPTIMIZER_MATH and name != "__init__")
    ):
        return "optimizer_step", []
    if name in ("step", "optimizer_step", "_optimizer_step", "_take_model_step") and (
        is_optimizer
        or re.search(
            r"engine|trainer|accelerat|strateg|precision|optim", module + (owner or "").lower()
        )
    ):
        return "optimizer_step", []
    if _FORWARD_NAME.match(name) or (
        name == "__call__" and owner is not None and any(_MODULE_BASES.search(b) for b in bases)
    ):
        return "forward", []

    # ZeRO / FSDP parameter movement.
    if _GATHER_NAME.search(name):
        return "param_gather", []
    if (
        _PARTITION_NAME.search(name)
        and not re.match(r"^_?create_", name)
        and re.search(r"/(?:zero|fsdp|_fsdp|distributed|sharded\w*)/|stage", module)
    ):
        return "param_partition", []

    # Building the model and the engine around it.
    if _INIT_NAME.match(name):
        if name in ("to", "cuda", "_apply", "convert") and not re.search(
            r"/nn/modules/module/|/modeling_utils/", module
        ):
            return None, []
        if re.match(r"^_?(?:prepare|setup)", name) and (
            _STEP_TIME_PREPARE.search(name) or "/nn/" in module
        ):
            return None, []
        if name == "__init__" and not (
            is_optimizer
            or any(_MODULE_BASES.search(b) for b in bases)
            or re.search(
                r"Engine|Trainer|Model|Optimizer|Init|Stage|Offload|Partition|Buffer|Cache|Accelerator|Strategy",
                owner or "",
            )
        ):
            return None, []
        return "model_init", []

    # What the body does when the name said nothing; a loop that saves and loads on the way
    # (Megatron's ``train``, ``pretrain``) is the loop.
    if _LOOP_NAME.match(name) and calls & _LOOP_CALLS:
        return "training_loop", []
    # ... a save or load is what a short function does; a long one that saves or loads on
    # the way (a learning-rate finder restoring its checkpoint) does more
    focused = len({c for c in calls if "." not in c}) <= 12
    if calls & _SAVE_CALLS and focused:
        return "checkpoint_save", []
    if calls & _LOAD_CALLS and focused:
        return "checkpoint_load", []
    if "checkpoint" in calls or "CheckpointFunction.apply" in calls:
        return "activation_checkpoint", []  # torch.utils.checkpoint.checkpoint(fn, ...)
    if (
        "pin_memory" in calls
        or "pin_memory" in body.true_keywords
        or calls & {"cudaHostAlloc", "cudaHostRegister", "pin_memory_"}
    ):
        return "pinning", []
    if (calls & _COLLECTIVE_CALLS) and re.search(
        r"/(?:distributed|comm|parallel\w*|zero|fsdp)/", module
    ):
        return "collective", []
    return None, []


def _propagate_checks(
    defs: dict[str, tuple[str | None, list[str], Body]],
) -> None:
    """A short ``_configure_*`` / ``_set_*`` function that calls a config check of the same
    file makes that check (``_configure_train_batch_size`` -> ``_batch_assertion``)."""
    for name, (role, _, body) in list(defs.items()):
        if role not in (None, "model_init") or not re.match(
            r"^_?(?:configure|set|setup|init)_\w*", name
        ):
            continue
        called = [
            defs[c] for c in body.calls if c in defs and defs[c][0] == "config_check" and c != name
        ]
        if called and len({c for c in body.calls if "." not in c}) <= 4:
            # a short function that sets values up and checks them; a long one (an engine's
            # ``_configure_optimizer``) does more than the check it makes on the way
            checks = [check for _, found, _ in called for check in found][:4]
            defs[name] = ("config_check", checks, body)


# --- reading the sources -------------------------------------------------------------------


def functions(path: str, text: str) -> dict[str, tuple[str | None, list[str]]]:
    """Every function of one file (module-level, methods, nested) with its role (None when
    nothing shows one) and the checks it makes."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    found: dict[str, list[tuple[str | None, list[str], Body]]] = {}

    def visit(node: ast.AST, owner: str | None, bases: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                names = tuple(filter(None, (_dotted(b) for b in child.bases)))
                visit(child, child.name, names)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = read_body(child)
                role, checks = classify(path, owner, bases, child.name, body)
                found.setdefault(child.name, []).append((role, checks, body))
                visit(child, owner, bases)
            else:
                visit(child, owner, bases)

    visit(tree, None, ())
    merged: dict[str, tuple[str | None, list[str], Body]] = {}
    for name, entries in found.items():
        roles = {role for role, _, _ in entries if role is not None}
        if len(roles) == 1:
            role = roles.pop()
            checks = [c for r, cs, _ in entries if r == role for c in cs][:4]
            body = next(b for r, _, b in entries if r == role)
            merged[name] = (role, checks, body)
        elif roles:
            # one name, several roles in one file (a scheduler's and an optimizer's ``step``):
            # the frame's name cannot tell them apart
            merged[name] = ("ambiguous:" + "|".join(sorted(roles)), [], entries[0][2])
        else:
            merged[name] = (None, [], entries[0][2])
    _propagate_checks(merged)
    return {name: (role, checks) for name, (role, checks, _) in merged.items()}


def _git(gitdir: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", str(gitdir), *args], check=True, capture_output=True
    ).stdout


def read_git(
    gitdir: Path, rev: str, packages: Iterable[tuple[str, str]]
) -> Iterator[tuple[str, bytes]]:
    """``(installed path, source)`` of every Python file of ``packages`` at ``rev``."""
    for inside, installed in packages:
        try:
            listing = _git(gitdir, "ls-tree", "-r", "-z", rev, "--", inside + "/")
        except subprocess.CalledProcessError:
            continue
        blobs: list[tuple[str, str]] = []
        for entry in listing.split(b"\0"):
            if not entry:
                continue
            meta, _, name = entry.decode().partition("\t")
            if not name.endswith(".py") or meta.split()[1] != "blob":
                continue
            relative = installed + name[len(inside) :]
            if SKIP_DIRS.search(relative):
                continue
            blobs.append((relative, meta.split()[2]))
        if not blobs:
            continue
        batch = subprocess.run(
            ["git", "--git-dir", str(gitdir), "cat-file", "--batch"],
            input="".join(f"{sha}\n" for _, sha in blobs).encode(),
            check=True,
            capture_output=True,
        ).stdout
        stream = io.BytesIO(batch)
        for relative, _ in blobs:
            header = stream.readline().split()
            size = int(header[2])
            data = stream.read(size)
            stream.read(1)
            yield relative, data


def read_archive(path: Path, packages: Iterable[tuple[str, str]]) -> Iterator[tuple[str, bytes]]:
    roots = [installed for _, installed in packages]
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if (
                    name.endswith(".py")
                    and name.split("/", 1)[0] in roots
                    and not SKIP_DIRS.search(name)
                ):
                    yield name, archive.read(name)
        return
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            name = member.name.split("/", 1)[-1]
            if (
                name.endswith(".py")
                and name.split("/", 1)[0] in roots
                and not SKIP_DIRS.search(name)
            ):
                handle = archive.extractfile(member)
                if handle is not None:
                    yield name, handle.read()


def read_site(site: Path, packages: Iterable[tuple[str, str]]) -> Iterator[tuple[str, bytes]]:
    for _, installed in packages:
        for file in sorted((site / installed).rglob("*.py")):
            relative = file.relative_to(site).as_posix()
            if not SKIP_DIRS.search(relative):
                yield relative, file.read_bytes()


def _site_version(site: Path, package: str) -> str:
    for info in site.glob(f"{package}-*.dist-info"):
        return info.name.removeprefix(package + "-").removesuffix(".dist-info")
    return "unknown"


def generate(
    mirror: Path | None,
    dist: Path | None,
    site: Path | None,
    sources: tuple[Source, ...] = SOURCES,
) -> dict[str, object]:
    """The data file's content from ``sources``, read as the module docstring says."""
    files: dict[str, dict[str, str]] = {}
    checks: dict[str, dict[str, list[str]]] = {}
    covers: list[dict[str, str]] = []
    owners: dict[str, str] = {}

    defined: dict[tuple[str, str], set[str]] = {}
    """(package, function name) -> the files that define it, with a role or without."""

    def add(library: str, version: str, where: str, texts: Iterator[tuple[str, bytes]]) -> None:
        count = 0
        for relative, data in texts:
            count += 1
            found = functions(relative, data.decode("utf-8", "replace"))
            target = files.setdefault(relative, {})
            owners.setdefault(relative, library)
            for name, (role, made) in found.items():
                defined.setdefault((relative.split("/", 1)[0], name), set()).add(relative)
                if role is None:
                    target.pop(name, None)  # a later (newer) version's reading wins
                    continue
                target[name] = role
                if made:
                    checks.setdefault(relative, {})[name] = made
        covers.append({"library": library, "version": version, "from": where, "files": str(count)})
        print(f"{library} {version}: {count} files", file=sys.stderr)

    for source in sources:
        owner_name = source.repo.replace("/", "+")
        if source.archives and dist is not None:
            for archive in source.archives:
                path = dist / archive
                if not path.exists():
                    print(f"missing: {path}", file=sys.stderr)
                    continue
                version = archive.split("-")[1]
                add(
                    source.library,
                    version,
                    f"{archive} (PyPI)",
                    read_archive(path, source.packages),
                )
            continue
        if source.site:
            if site is None:
                print(f"missing: --site for {source.library}", file=sys.stderr)
                continue
            package = source.packages[0][1]
            version = _site_version(site, package)
            add(
                source.library,
                version,
                f"installed {package} {version}",
                read_site(site, source.packages),
            )
            continue
        gitdir = None
        if mirror is not None:
            for candidate in (
                mirror / owner_name / "repo",
                mirror / owner_name,
                mirror / owner_name / ".git",
            ):
                if (candidate / "HEAD").exists():
                    gitdir = candidate
                    break
        if gitdir is None:
            print(f"missing: git directory of {source.repo}", file=sys.stderr)
            continue
        for rev in source.revs:
            try:
                commit = _git(gitdir, "rev-parse", rev + "^{commit}").decode().strip()
            except subprocess.CalledProcessError:
                print(f"missing: {source.repo}@{rev}", file=sys.stderr)
                continue
            add(
                source.library,
                rev,
                f"github.com/{source.repo}@{commit}",
                read_git(gitdir, commit, source.packages),
            )

    kept: dict[str, dict[str, str]] = {}
    for path, roles in sorted(files.items()):
        by_role: dict[str, list[str]] = {}
        for name, role in roles.items():
            if not role.startswith("ambiguous:"):
                by_role.setdefault(role, []).append(name)
        if by_role:
            kept[path] = {role: " ".join(sorted(names)) for role, names in sorted(by_role.items())}
    return {
        "about": (
            "Library function -> role, derived from the libraries' source by "
            "scripts/gen_library_knowledge.py (its classify() holds every rule). "
            "files: package-relative file path as installed -> role -> the functions of that "
            "file with that role, space-separated (a name with two roles in one file is left "
            "out: the frame cannot tell which). checks: what a config check asserts. "
            "Regenerate with the command in that script's docstring; review the diff."
        ),
        "roles": list(ROLES),
        "not_read": NOT_READ,
        "covers": covers,
        "libraries": sorted({(path.split("/", 1)[0], owners[path]) for path in kept}),
        "files": kept,
        "checks": {path: checks[path] for path in sorted(checks) if path in kept},
        "distinctive": _distinctive(files, defined),
    }


DISTINCT_FILES = 3


def _distinctive(
    files: dict[str, dict[str, str]], defined: dict[tuple[str, str], set[str]]
) -> dict[str, dict[str, str]]:
    """Per package, the functions whose role a frame of a file the data lacks (another
    release moved or renamed it) can take from the rest of the library: names defined in at
    most ``DISTINCT_FILES`` files of the package, every one of which gives it the same role
    (a file defining it with no role, ``make_boxed_func``'s inner ``g``, rules it out); no
    protocol method (``__add__``, ``__len__``)."""
    roles: dict[tuple[str, str], set[str]] = {}
    holders: dict[tuple[str, str], set[str]] = {}
    for path, by_name in files.items():
        for name, role in by_name.items():
            key = (path.split("/", 1)[0], name)
            roles.setdefault(key, set()).add(role)
            holders.setdefault(key, set()).add(path)
    out: dict[str, dict[str, list[str]]] = {}
    for (package, name), found in sorted(roles.items()):
        dunder = name.startswith("__") and name.endswith("__")
        everywhere = defined.get((package, name), set())
        if (
            len(found) != 1
            or next(iter(found)).startswith("ambiguous:")
            or dunder
            or len(everywhere) > DISTINCT_FILES
            or everywhere != holders[package, name]  # a file defines it without that role
        ):
            continue
        out.setdefault(package, {}).setdefault(found.pop(), []).append(name)
    return {
        package: {role: " ".join(names) for role, names in sorted(by_role.items())}
        for package, by_role in sorted(out.items())
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--mirror", type=Path, help="folder of <owner>+<name>[/repo] git directories"
    )
    parser.add_argument("--dist", type=Path, help="folder of the wheels / sdists named in SOURCES")
    parser.add_argument("--site", type=Path, help="site-packages holding torch")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = generate(args.mirror, args.dist, args.site)
    text = json.dumps(data, indent=0, separators=(",", ":"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out} ({len(text):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
