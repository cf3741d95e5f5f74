"""DeepSpeed 0.19.8's top-level config keys, as data: those it refuses outright, every one it
reads (it ignores the others, silently), and the spellings of the dtypes it names.

Sources: ``deepspeed/runtime/config.py`` and the sub-configs it builds from the top-level dict;
``tests/analysis/test_ds_validation.py`` checks these tables against the installed DeepSpeed.
"""

from __future__ import annotations

#: Top-level blocks and keys that DeepSpeed 0.19.8 refuses outright
#: (``_REMOVED_TOP_LEVEL_CONFIG_KEYS`` / ``_REMOVED_ZERO_CONFIG_KEYS`` in runtime/config.py).
REMOVED_TOP_LEVEL_KEYS: tuple[str, ...] = (
    "nebula",
    "compression_training",
    "amp",
    "quantize_training",
    "sparse_gradients",
    "eigenvalue",
    "sparse_attention",
    "elasticity",
    "graph_harvesting",
    "curriculum_learning",
    "progressive_layer_drop",
)
REMOVED_ZERO_KEYS: tuple[str, ...] = (
    "mics_shard_size",
    "mics_hierarchical_params_gather",
    "zeropp_loco_param",
)


#: Every top-level key DeepSpeed 0.19.8's ``DeepSpeedConfig`` (and the sub-configs it builds
#: from the top-level dict) reads.  DeepSpeed does not reject other keys: it ignores them,
#: which is how a misspelled ``zero_optimization`` silently means ZeRO stage 0.
KNOWN_TOP_LEVEL_KEYS: frozenset[str] = frozenset(
    {
        "activation_checkpointing",
        "aio",
        "allgather_size",
        "autotuning",
        "bf16",
        "bfloat16",
        "checkpoint",
        "comet",
        "comms_logger",
        "communication_data_type",
        "compile",
        "csv_monitor",
        "data_efficiency",
        "data_types",
        "dataloader_drop_last",
        "datastates_ckpt",
        "disable_allgather",
        "disable_python_gc",
        "dump_state",
        "expert_parallel",
        "flops_profiler",
        "fp16",
        "gradient_accumulation_steps",
        "gradient_allreduce_op",
        "gradient_clipping",
        "gradient_predivide_factor",
        "hybrid_engine",
        "log_level",
        "managed_gradient_accumulation",
        "memory_breakdown",
        "optimizer",
        "pipeline",
        "prescale_gradients",
        "scheduler",
        "seq_parallel_communication_data_type",
        "sequence_parallel_size",
        "steps_per_print",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "torch_autocast",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "use_data_before_expert_parallelism",
        "vocabulary_size",
        "wall_clock_breakdown",
        "wandb",
        "weight_quantization",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "zero_optimization",
    }
)


_CANONICAL_DTYPES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "int8": "int8",
    "torch.int8": "int8",
}


def canonical_dtype(value: object) -> str | None:
    """``"BF16"``, ``"bfloat16"``, ``"torch.bfloat16"`` -> ``"bf16"``; None stays None; anything
    else comes back lower-cased (DeepSpeed fails on it later, the validator says so)."""
    if value is None:
        return None
    text = str(value).strip().lower()
    return _CANONICAL_DTYPES.get(text, text)
