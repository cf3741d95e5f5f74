"""Who fills a ds_config's ``"auto"`` values, and from what.

``"auto"`` is not DeepSpeed's: its pydantic blocks drop the key (the default applies) and the
batch keys fail with ``TypeError``.  The HF Trainer replaces it before DeepSpeed starts
(transformers ``integrations/deepspeed.py``: ``HfTrainerDeepSpeedConfig.trainer_config_process``
from ``TrainingArguments``, ``trainer_config_finalize`` from the model and the step count), and
Accelerate fills the same keys from its own settings.  ``HF_TRAINER_FILLS`` is that list, with
the argument each value comes from; a key outside it stays ``"auto"`` whoever launches.
"""

from __future__ import annotations

from collections.abc import Iterable

HF_TRAINER_FILLS: dict[str, str] = {
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
    "train_batch_size": (
        "world size x --per_device_train_batch_size x --gradient_accumulation_steps"
    ),
    "gradient_clipping": "--max_grad_norm",
    "optimizer.params.lr": "--learning_rate",
    "optimizer.params.betas": "[--adam_beta1, --adam_beta2]",
    "optimizer.params.eps": "--adam_epsilon",
    "optimizer.params.weight_decay": "--weight_decay",
    "scheduler.params.warmup_min_lr": "0",
    "scheduler.params.warmup_max_lr": "--learning_rate",
    "scheduler.params.warmup_num_steps": "--warmup_steps / --warmup_ratio",
    "scheduler.params.total_num_steps": "the number of training steps",
    "fp16.enabled": "--fp16 / --fp16_full_eval",
    "amp.enabled": "--fp16 with --fp16_backend apex",
    "amp.opt_level": "--fp16_opt_level",
    "bf16.enabled": "--bf16 / --bf16_full_eval",
    "zero_optimization.reduce_bucket_size": "the model's hidden_size squared",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 x the model's hidden_size squared",
    "zero_optimization.stage3_param_persistence_threshold": "10 x the model's hidden_size",
}

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
PRECISION_KEYS = ("fp16.enabled", "bf16.enabled")


def filled_by_trainer(auto_keys: Iterable[str]) -> list[tuple[str, str]]:
    """``(key, what the Trainer fills it from)`` for each of ``auto_keys`` it fills."""
    return [(key, HF_TRAINER_FILLS[key]) for key in auto_keys if key in HF_TRAINER_FILLS]


def filled_by_nobody(auto_keys: Iterable[str]) -> list[str]:
    """The ``auto_keys`` no integration fills: DeepSpeed gets ``"auto"`` as written."""
    return [key for key in auto_keys if key not in HF_TRAINER_FILLS]


def describe_fills(auto_keys: Iterable[str]) -> list[str]:
    """Notes for a report: which ``"auto"`` keys the HF Trainer fills at launch and from what,
    and which it leaves."""
    keys = list(auto_keys)
    notes = []
    filled = filled_by_trainer(keys)
    if filled:
        notes.append(
            '"auto" values the HF Trainer fills at launch (TrainingArguments, the model): '
            + "; ".join(f"{key} <- {source}" for key, source in filled)
        )
    left = filled_by_nobody(keys)
    if left:
        notes.append(
            '"auto" values no integration fills (DeepSpeed gets "auto": a block key falls '
            "back to its default): " + ", ".join(left)
        )
    return notes
