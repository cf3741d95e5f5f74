"""DeepSpeed configs (``ds_config.json``), read the way DeepSpeed reads them
(``oomlens.ingest.ds_config``); the analysis resolves and validates them.  A run has one: the
first found is used (``--config`` names it)."""

from __future__ import annotations

from typing import ClassVar

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample

DS_KEYS = (
    "zero_optimization",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "fp16",
    "bf16",
    "optimizer",
    "scheduler",
    "gradient_clipping",
    "steps_per_print",
    "zero_allow_untested_optimizer",
    "wall_clock_breakdown",
    "activation_checkpointing",
    "zero_force_ds_cpu_optimizer",
    "memory_breakdown",
    "flops_profiler",
    "data_types",
)
"""Top-level keys only a DeepSpeed config has."""


class DsConfigKind(InputKind):
    id: ClassVar[str] = "ds_config"
    label: ClassVar[str] = "a DeepSpeed config"
    slot: ClassVar[str] = "configs"
    precedence: ClassVar[int] = 30
    order: ClassVar[int] = 50
    reader: ClassVar[str] = "oomlens.ingest.ds_config"
    names: ClassVar[tuple[str, ...]] = ("ds_config*.json", "*deepspeed*.json")
    from_workdir: ClassVar[bool] = True
    json_document: ClassVar[bool] = True
    one_per_run: ClassVar[str] = "name one with --config"

    def recognise(self, sample: Sample) -> str | None:
        data = sample.json_object
        if data is not None:
            keys = [key for key in DS_KEYS if key in data]
            return "JSON with DeepSpeed keys: " + ", ".join(keys[:4]) if keys else None
        if not sample.json_like:
            return None
        keys = [key for key in DS_KEYS if f'"{key}"' in sample.text]
        if not keys:
            return None
        return (
            "JSON-like with DeepSpeed keys: " + ", ".join(keys[:4]) + " (not strictly valid JSON)"
        )

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.ds_config import read_ds_config

        return Reading((read_ds_config(found.path),), found.reason)


KIND = DsConfigKind()
