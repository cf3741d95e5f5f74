"""Regenerate the ``dump_*.log`` files: DeepSpeed's startup configuration dump, printed by the
installed DeepSpeed (0.19.8) itself for real configs of this folder.

``DeepSpeedEngine`` calls ``self._config.print("DeepSpeedEngine configuration")`` on rank 0.
Here the same ``DeepSpeedConfig.print`` runs on a ``DeepSpeedConfig`` built the way its
``__init__`` builds it, with the world size a multi-GPU job would have (without a process
group DeepSpeed would use 1).  For the Hugging Face configs, the ``"auto"`` values are first
filled the way ``HfTrainerDeepSpeedConfig`` / Accelerate fill them, since the dump prints the
config after that substitution.

Run from the repository root:  python tests/assets/ds_configs/make_dumps.py
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

HERE = Path(__file__).parent


def hf_fill(config: dict, *, hidden: int, micro: int, gas: int, world: int, precision: str) -> dict:
    """What transformers' ``trainer_config_process``/``trainer_config_finalize`` do to "auto"."""
    filled = copy.deepcopy(config)

    def fill(path: str, value: object) -> None:
        node = filled
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.get(key, {})
        if node.get(keys[-1]) == "auto":
            node[keys[-1]] = value

    fill("train_micro_batch_size_per_gpu", micro)
    fill("gradient_accumulation_steps", gas)
    fill("train_batch_size", world * micro * gas)
    fill("gradient_clipping", 1.0)
    fill("fp16.enabled", precision == "fp16")
    fill("bf16.enabled", precision == "bf16")
    fill("bfloat16.enabled", precision == "bf16")
    fill("optimizer.params.lr", 5e-5)
    fill("optimizer.params.betas", [0.9, 0.999])
    fill("optimizer.params.eps", 1e-8)
    fill("optimizer.params.weight_decay", 0.0)
    fill("scheduler.params.warmup_min_lr", 0)
    fill("scheduler.params.warmup_max_lr", 5e-5)
    fill("scheduler.params.warmup_num_steps", 0)
    fill("zero_optimization.reduce_bucket_size", hidden * hidden)
    fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
    fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden)
    fill("zero_optimization.stage3_gather_16bit_weights_on_model_save", False)
    return filled


def dump(config: dict, world_size: int, target: Path) -> None:
    from deepspeed.runtime import config as ds_config
    from deepspeed.utils import logger

    cfg = ds_config.DeepSpeedConfig.__new__(ds_config.DeepSpeedConfig)
    cfg._param_dict = config
    cfg.global_rank = 0
    cfg.world_size = world_size
    ds_config._reject_removed_config_keys(config)
    cfg._initialize_params(copy.copy(config))
    cfg._configure_train_batch_size()
    cfg._do_sanity_check()

    formatter = logger.handlers[0].formatter
    handler = logging.FileHandler(target, mode="w")
    handler.setFormatter(formatter)
    saved = logger.handlers[:]
    level = logger.level
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    try:
        logger.info(f"Config mesh_device None world_size = {world_size}")
        cfg.print("DeepSpeedEngine configuration")
    finally:
        logger.handlers = saved
        logger.setLevel(level)
        handler.close()


def main() -> None:
    hf = json.loads((HERE / "hf_transformers_ds_config_zero3.json").read_text())
    dump(
        hf_fill(hf, hidden=4096, micro=4, gas=2, world=8, precision="fp16"),
        8,
        HERE / "dump_hf_transformers_zero3_ws8.log",
    )
    acc = json.loads((HERE / "hf_accelerate_ds_config_zero3.json").read_text())
    dump(
        hf_fill(acc, hidden=1536, micro=2, gas=1, world=2, precision="bf16"),
        2,
        HERE / "dump_hf_accelerate_zero3_ws2.log",
    )
    import hjson

    zero2 = hjson.loads((HERE / "dse_megatron_zero2.json").read_text())
    dump(zero2, 4, HERE / "dump_dse_megatron_zero2_ws4.log")


if __name__ == "__main__":
    main()
