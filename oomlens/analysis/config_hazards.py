"""What DeepSpeed accepts in a config but probably should not (``find_config_hazards``):
misspelled top-level keys (a misspelled ``zero_optimization`` silently means stage 0),
``"auto"`` outside the HF/Accelerate integration, fp32 fallback, deprecated keys, settings
that only fail at engine start.
"""

from __future__ import annotations

import difflib
from typing import Any

from oomlens.analysis.findings_cap import capped_hazards
from oomlens.facts.config import (
    ConfigDocument,
    ConfigHazard,
    ConfigSeverity,
    EffectiveDsConfig,
    Origin,
)
from oomlens.facts.ds_keys import KNOWN_TOP_LEVEL_KEYS, REMOVED_TOP_LEVEL_KEYS

_DEPRECATED_ZERO_KEYS = {
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
    "cpu_offload_use_pin_memory": "offload_param.pin_memory / offload_optimizer.pin_memory",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}


MAX_COMPARED = 1000
"""Unknown top-level keys compared with DeepSpeed's for a misspelling (the rest are unknown)."""
_IMPORTANT_TOP_LEVEL = {
    "zero_optimization": ConfigSeverity.HIGH,
    "fp16": ConfigSeverity.HIGH,
    "bf16": ConfigSeverity.HIGH,
    "train_batch_size": ConfigSeverity.MEDIUM,
    "train_micro_batch_size_per_gpu": ConfigSeverity.MEDIUM,
    "gradient_accumulation_steps": ConfigSeverity.MEDIUM,
}


def find_config_hazards(
    doc: ConfigDocument, effective: EffectiveDsConfig, *, integration: str | None = None
) -> list[ConfigHazard]:
    """Config-only hazards (no memory numbers; ``oomlens.analysis.zero_model`` adds those).

    ``integration`` is ``"hf"``/``"accelerate"`` when the config is known to go through the HF
    Trainer or Accelerate (``"auto"`` is then expected), ``"deepspeed"`` when it goes to
    DeepSpeed directly, None when unknown.
    """
    data = doc.data
    hazards: list[ConfigHazard] = []
    hazards += capped_hazards(_unknown_top_level_keys(doc))
    hazards += _auto_hazards(doc, effective, integration)
    hazards += _precision_hazards(effective)
    hazards += _deprecated_hazards(doc)
    zero = data.get("zero_optimization")
    stage = effective.zero.stage.value
    op = effective.zero.offload_param
    if op.enabled and stage != 3:
        hazards.append(
            ConfigHazard(
                "offload_param_below_stage3",
                f"offload_param (device {op.device.value}) only works with ZeRO stage 3; at "
                f"stage {stage} "
                "DeepSpeed ignores it and the parameters stay on the GPU",
                ConfigSeverity.MEDIUM,
                (op.device.key_path, effective.zero.stage.key_path),
                _sources(op.device, effective.zero.stage),
            )
        )
    for offload in (effective.zero.offload_param, effective.zero.offload_optimizer):
        if offload.device.value == "nvme" and offload.nvme_path.value is None:
            hazards.append(
                ConfigHazard(
                    "nvme_without_path",
                    f"{offload.device.key_path} is 'nvme' but no nvme_path is set: DeepSpeed fails "
                    "when it creates the swap folder at engine start",
                    ConfigSeverity.HIGH,
                    (offload.device.key_path,),
                    _sources(offload.device),
                )
            )
    agb = effective.zero.allgather_bucket_size
    if stage in (1, 2) and isinstance(agb.value, int) and agb.value % 2 != 0:
        hazards.append(
            ConfigHazard(
                "allgather_bucket_size_odd",
                f"{agb.key_path} = {agb.value} is odd: the ZeRO stage 1/2 optimizer asserts it "
                "is a "
                "multiple of 2 at engine start",
                ConfigSeverity.HIGH,
                (agb.key_path,),
                _sources(agb),
            )
        )
    if isinstance(zero, bool):
        hazards.append(
            ConfigHazard(
                "legacy_zero_bool",
                f'"zero_optimization": {str(zero).lower()} is the deprecated format; it means '
                "stage "
                f"{int(zero)}",
                ConfigSeverity.LOW,
                ("zero_optimization",),
                (doc.source("zero_optimization"),),
            )
        )
    return hazards


def _sources(*values: Any) -> tuple[Any, ...]:
    return tuple(v.source for v in values if v.source is not None and v.is_explicit)


def _unknown_top_level_keys(doc: ConfigDocument) -> list[ConfigHazard]:
    out: list[ConfigHazard] = []
    known = sorted(KNOWN_TOP_LEVEL_KEYS)
    compared = 0
    for key in doc.data:
        if key in KNOWN_TOP_LEVEL_KEYS or key in REMOVED_TOP_LEVEL_KEYS:
            continue
        # difflib costs ~0.3 ms a key: only the first MAX_COMPARED unknown keys (more than
        # any written config has) are compared, so that 230,000 of them cost no minutes
        compared += 1
        close = (
            difflib.get_close_matches(key, known, n=1, cutoff=0.8)
            if compared <= MAX_COMPARED
            else []
        )
        if close and close[0] not in doc.data:
            target = close[0]
            severity = _IMPORTANT_TOP_LEVEL.get(target, ConfigSeverity.LOW)
            effect = "DeepSpeed ignores it and uses the default"
            if target == "zero_optimization":
                effect = (
                    "DeepSpeed ignores it, so ZeRO is off (stage 0): every GPU holds the full "
                    "model and optimizer states"
                )
            elif target in ("fp16", "bf16"):
                effect = f"DeepSpeed ignores it, so {target} stays disabled"
            out.append(
                ConfigHazard(
                    "misspelled_top_level_key",
                    f"top-level key {key!r} looks like a misspelled {target!r}: {effect}",
                    severity,
                    (key,),
                    (doc.source(key),),
                )
            )
        else:
            out.append(
                ConfigHazard(
                    "unknown_top_level_key",
                    f"top-level key {key!r} is not read by DeepSpeed 0.19.8 (ignored)",
                    ConfigSeverity.INFO,
                    (key,),
                    (doc.source(key),),
                )
            )
    return out


def _auto_hazards(
    doc: ConfigDocument, effective: EffectiveDsConfig, integration: str | None
) -> list[ConfigHazard]:
    unresolved = [v for v in effective.all_values() if v.origin is Origin.AUTO_UNRESOLVED]
    auto_keys = list(effective.auto_keys)
    if not auto_keys:
        return []
    out: list[ConfigHazard] = []
    if integration in ("hf", "accelerate"):
        if unresolved:
            out.append(
                ConfigHazard(
                    "auto_unresolved",
                    'the HF/Accelerate integration fills these "auto" values at launch from its '
                    "own arguments and the model, which the config alone does not give (bucket "
                    "sizes follow the hidden size, fp16/bf16 the precision flags): "
                    + ", ".join(v.key_path for v in unresolved),
                    ConfigSeverity.INFO,
                    tuple(v.key_path for v in unresolved),
                )
            )
        return out
    severity = ConfigSeverity.HIGH if integration == "deepspeed" else ConfigSeverity.LOW
    top_level = [k for k in auto_keys if "." not in k]
    effects = []
    if any(
        k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        for k in top_level
    ):
        effects.append("the batch keys fail with TypeError")
    stage = effective.zero.stage
    if stage.origin is Origin.AUTO_UNRESOLVED:
        effects.append("ZeRO falls back to stage 0")
    if any(
        v.key_path.endswith("enabled") and v.origin is Origin.AUTO_UNRESOLVED
        for v in (effective.precision.fp16_enabled, effective.precision.bf16_enabled)
    ):
        effects.append(
            "fp16/bf16 stay disabled, so training runs in fp32 (2x parameter and gradient memory)"
        )
    dropped = [v.key_path for v in unresolved if "." in v.key_path]
    if dropped:
        effects.append("DeepSpeed's defaults replace " + ", ".join(dropped))
    out.append(
        ConfigHazard(
            "auto_outside_hf",
            f'{len(auto_keys)} "auto" value(s) '
            f"({', '.join(auto_keys[:6])}{'...' if len(auto_keys) > 6 else ''}) are only "
            "filled in by the HF Trainer/Accelerate; launched with DeepSpeed directly, "
            + ("; ".join(effects) if effects else "they are dropped and defaults apply"),
            severity,
            tuple(auto_keys),
            tuple(doc.source(k) for k in auto_keys if k in doc.key_lines),
        )
    )
    return out


def _precision_hazards(effective: EffectiveDsConfig) -> list[ConfigHazard]:
    prec = effective.precision
    if prec.fp16_enabled.value or prec.bf16_enabled.value or prec.torch_autocast_enabled.value:
        return []
    if (
        effective.zero.stage.value == 0
        and prec.fp16_enabled.origin is Origin.DEFAULT
        and prec.bf16_enabled.origin is Origin.DEFAULT
    ):
        severity = ConfigSeverity.LOW
    else:
        severity = (
            ConfigSeverity.MEDIUM
            if Origin.AUTO_UNRESOLVED in (prec.fp16_enabled.origin, prec.bf16_enabled.origin)
            else ConfigSeverity.LOW
        )
    return [
        ConfigHazard(
            "fp32_fallback",
            "neither fp16 nor bf16 is enabled: parameters, gradients and all-gathers are fp32 "
            "(4 bytes per element instead of 2)",
            severity,
            (prec.fp16_enabled.key_path, prec.bf16_enabled.key_path),
            _sources(prec.fp16_enabled, prec.bf16_enabled),
        )
    ]


def _deprecated_hazards(doc: ConfigDocument) -> list[ConfigHazard]:
    zero = doc.data.get("zero_optimization")
    if not isinstance(zero, dict):
        return []
    out = []
    for key, replacement in _DEPRECATED_ZERO_KEYS.items():
        if key in zero:
            path = f"zero_optimization.{key}"
            out.append(
                ConfigHazard(
                    "deprecated_key",
                    f"{path} is deprecated (DeepSpeed: use {replacement})",
                    ConfigSeverity.INFO,
                    (path,),
                    (doc.source(path),),
                )
            )
    return out
