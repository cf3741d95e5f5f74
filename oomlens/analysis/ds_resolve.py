"""Resolve a ds_config the way DeepSpeed 0.19.8 does: the values the engine will use.

``resolve_effective_config`` applies DeepSpeed's defaults, aliases, deprecated keys and
derived values, and treats Hugging Face ``"auto"`` placeholders as the HF Trainer / Accelerate
would when the model's hidden size (or the precision) is known, else marks them unresolved with
the value DeepSpeed alone would use.  ``reconcile_with_dump`` merges a file's reading with the
configuration the run itself printed (``oomlens.ingest.ds_config`` reads both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from oomlens.facts import SourceRef
from oomlens.facts.config import (
    BatchSettings,
    ConfigDocument,
    ConfigValue,
    EffectiveDsConfig,
    OffloadOptimizerSettings,
    OffloadParamSettings,
    OptimizerSettings,
    Origin,
    Precision,
    PrecisionSettings,
    ZeroSettings,
    settings_fields,
    show_value,
)
from oomlens.facts.ds_keys import canonical_dtype
from oomlens.facts.ds_schema import (
    BF16,
    FP16,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    ZERO,
    ModelSpec,
    ValidatedModel,
    given_key,
    validate_model,
)

#: ``optimizer.type`` values DeepSpeed lower-cases (``DEEPSPEED_OPTIMIZERS`` in config.py).
DEEPSPEED_OPTIMIZERS = frozenset(
    {"adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon"}
)


def find_auto_keys(data: object, prefix: str = "") -> list[str]:
    """Dotted key paths whose value is the string ``"auto"``."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, str) and value == "auto":
                found.append(path)
            else:
                found.extend(find_auto_keys(value, path))
    return found


# -- resolution ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolutionContext:
    """What is known outside the config that decides ``"auto"`` values.

    ``hidden_size`` fills the three HF bucket keys (``reduce_bucket_size = h*h``,
    ``stage3_prefetch_bucket_size = int(0.9*h*h)``, ``stage3_param_persistence_threshold =
    10*h``, zero-3 only for the last two), as ``HfTrainerDeepSpeedConfig`` and Accelerate do.
    ``precision`` fills ``fp16.enabled``/``bf16.enabled`` (the Trainer's ``--fp16``/``--bf16``).
    ``integration="deepspeed"`` says the config goes to DeepSpeed directly, so no ``"auto"`` is
    resolved.  The ``*_source`` strings say where the value came from, for notes.
    """

    hidden_size: int | None = None
    hidden_size_source: str = ""
    precision: Precision | None = None
    precision_source: str = ""
    integration: str | None = None


def _hf_bucket_value(json_key: str, hidden: int, stage: int) -> int | None:
    if json_key == "reduce_bucket_size":
        return hidden * hidden
    if stage != 3:
        return None
    if json_key == "stage3_prefetch_bucket_size":
        return int(0.9 * hidden * hidden)
    if json_key == "stage3_param_persistence_threshold":
        return 10 * hidden
    return None


_HF_FORMULAS = {
    "reduce_bucket_size": "hidden_size*hidden_size",
    "stage3_prefetch_bucket_size": "int(0.9*hidden_size*hidden_size)",
    "stage3_param_persistence_threshold": "10*hidden_size",
}


class _Resolver:
    def __init__(self, doc: ConfigDocument, context: ResolutionContext) -> None:
        self.doc = doc
        self.context = context
        self.notes: list[str] = []

    def src(self, key_path: str) -> SourceRef:
        return self.doc.source(key_path)

    def model_values(
        self,
        spec: ModelSpec,
        block: object,
        prefix: str,
        validated: ValidatedModel | None,
        overrides: Mapping[str, ConfigValue[Any]] | None = None,
        resolve_auto: Mapping[str, tuple[object, str]] | None = None,
    ) -> dict[str, ConfigValue[Any]]:
        """One ConfigValue per field of ``spec``; invalid fields fall back to their default."""
        given = block if isinstance(block, dict) else {}
        result: dict[str, ConfigValue[Any]] = {}
        for fspec in spec.fields:
            if overrides and fspec.name in overrides:
                result[fspec.name] = overrides[fspec.name]
                continue
            key, raw = given_key(fspec, given)
            path = f"{prefix}.{key or fspec.json_key}"
            if key is not None and isinstance(raw, str) and raw == "auto":
                if resolve_auto and fspec.json_key in resolve_auto:
                    filled, how = resolve_auto[fspec.json_key]
                    result[fspec.name] = ConfigValue(
                        filled, path, Origin.AUTO_RESOLVED, self.src(path), how
                    )
                else:
                    result[fspec.name] = ConfigValue(
                        fspec.default,
                        path,
                        Origin.AUTO_UNRESOLVED,
                        self.src(path),
                        'DeepSpeed drops "auto": its default applies',
                    )
                continue
            if key is None:
                result[fspec.name] = ConfigValue(fspec.default, path, Origin.DEFAULT)
                continue
            origin = Origin.USER if key == fspec.json_key else Origin.ALIAS
            value: object = fspec.default
            note = ""
            if validated is not None and fspec.name in validated.fields_set:
                if any(err.loc[:1] == (key,) for err in validated.errors):
                    note = f"invalid value {raw!r}: DeepSpeed refuses it; default shown"
                else:
                    value = validated.values.get(fspec.name, fspec.default)
            result[fspec.name] = ConfigValue(value, path, origin, self.src(path), note)
        return result


def resolve_effective_config(
    doc: ConfigDocument, context: ResolutionContext | None = None
) -> EffectiveDsConfig:
    """The config DeepSpeed 0.19.8 would run with, each value with its key path and origin.

    Never raises on an invalid config: fields DeepSpeed would refuse show their default with a
    note (``oomlens.analysis.ds_validation`` reports the problems).  The batch triple is kept
    as written; ``oomlens.analysis.batch`` derives the missing value with the world size.
    """
    ctx = context or ResolutionContext()
    res = _Resolver(doc, ctx)
    data = doc.data
    zero = _resolve_zero(res, data, ctx)
    precision = _resolve_precision(res, data, ctx)
    batch = BatchSettings(
        train_batch_size=_top_level(res, "train_batch_size"),
        micro_batch_per_gpu=_top_level(res, "train_micro_batch_size_per_gpu"),
        gradient_accumulation_steps=_top_level(res, "gradient_accumulation_steps"),
    )
    optimizer = _resolve_optimizer(res, data)
    return EffectiveDsConfig(
        source=doc.source(),
        zero=zero,
        precision=precision,
        batch=batch,
        optimizer=optimizer,
        world_size=None,
        auto_keys=tuple(find_auto_keys(data)),
    )


def _top_level(res: _Resolver, key: str, default: object = None) -> ConfigValue[Any]:
    data = res.doc.data
    if key not in data:
        return ConfigValue(default, key, Origin.DEFAULT)
    value = data[key]
    if isinstance(value, str) and value == "auto":
        return ConfigValue(
            value,
            key,
            Origin.AUTO_UNRESOLVED,
            res.src(key),
            'top-level "auto" is only filled by the HF Trainer/Accelerate; DeepSpeed alone '
            "fails on it",
        )
    return ConfigValue(value, key, Origin.USER, res.src(key))


def _resolve_zero(
    res: _Resolver, data: Mapping[str, object], ctx: ResolutionContext
) -> ZeroSettings:
    raw = data.get("zero_optimization")
    overrides: dict[str, ConfigValue[Any]] = {}
    block: object = raw
    if isinstance(raw, bool):
        # Legacy format: "zero_optimization": true means stage 1 (read_zero_config_deprecated).
        stage = 1 if raw else 0
        block = {"stage": stage}
        overrides["stage"] = ConfigValue(
            stage,
            "zero_optimization",
            Origin.DEPRECATED_KEY,
            res.src("zero_optimization"),
            "legacy boolean zero_optimization",
        )
        if stage:
            size = data.get("allgather_size", 500_000_000)
            block = {"stage": stage, "allgather_bucket_size": size}
            overrides["allgather_bucket_size"] = ConfigValue(
                int(size) if isinstance(size, int | float) else size,
                "allgather_size"
                if "allgather_size" in data
                else "zero_optimization.allgather_bucket_size",
                Origin.DEPRECATED_KEY if "allgather_size" in data else Origin.DEFAULT,
                res.src("allgather_size") if "allgather_size" in data else None,
            )
    elif isinstance(raw, str) and raw == "auto":
        overrides["stage"] = ConfigValue(
            0,
            "zero_optimization",
            Origin.AUTO_UNRESOLVED,
            res.src("zero_optimization"),
            'a top-level "auto" block is not resolved by anyone; DeepSpeed fails on it',
        )
        block = {}
    elif not isinstance(raw, dict):
        block = {}
    assert isinstance(block, dict)
    validated = validate_model(ZERO, block)
    stage_value = validated.values.get("stage", 0)
    stage = (
        stage_value if isinstance(stage_value, int) and not validated.errors else _safe_stage(block)
    )

    auto_fill: dict[str, tuple[object, str]] = {}
    integration_resolves = ctx.integration != "deepspeed"
    if ctx.hidden_size and integration_resolves:
        for json_key, formula in _HF_FORMULAS.items():
            filled = _hf_bucket_value(json_key, ctx.hidden_size, stage)
            if filled is not None:
                src = f" from {ctx.hidden_size_source}" if ctx.hidden_size_source else ""
                auto_fill[json_key] = (
                    filled,
                    f"as the HF Trainer/Accelerate fill it: {formula} with hidden_size="
                    f"{ctx.hidden_size}{src}",
                )
    values = res.model_values(ZERO, block, "zero_optimization", validated, overrides, auto_fill)

    # overlap_comm: None means "stage == 3" (validator overlap_comm_valid).
    oc = values["overlap_comm"]
    if oc.value is None:
        values["overlap_comm"] = ConfigValue(
            stage == 3,
            oc.key_path,
            Origin.DERIVED if oc.origin is Origin.DEFAULT else oc.origin,
            oc.source,
            "DeepSpeed sets overlap_comm = (stage == 3) when it is not given",
        )
    # stage3_gather_fp16_weights_on_model_save -> gather_16bit_weights_on_model_save.
    deprecated_save = values["stage3_gather_fp16_weights_on_model_save"]
    if deprecated_save.is_explicit and not values["gather_16bit_weights_on_model_save"].is_explicit:
        values["gather_16bit_weights_on_model_save"] = ConfigValue(
            deprecated_save.value,
            deprecated_save.key_path,
            Origin.DEPRECATED_KEY,
            deprecated_save.source,
            "deprecated key mapped to stage3_gather_16bit_weights_on_model_save",
        )

    offload_param = _resolve_offload(
        res, block, "offload_param", OFFLOAD_PARAM, validated, values["cpu_offload_param"]
    )
    offload_optimizer = _resolve_offload(
        res, block, "offload_optimizer", OFFLOAD_OPTIMIZER, validated, values["cpu_offload"]
    )
    return ZeroSettings(
        stage=values["stage"],
        contiguous_gradients=values["contiguous_gradients"],
        reduce_scatter=values["reduce_scatter"],
        reduce_bucket_size=values["reduce_bucket_size"],
        allgather_bucket_size=values["allgather_bucket_size"],
        overlap_comm=values["overlap_comm"],
        sub_group_size=values["sub_group_size"],
        prefetch_bucket_size=values["prefetch_bucket_size"],
        param_persistence_threshold=values["param_persistence_threshold"],
        model_persistence_threshold=values["model_persistence_threshold"],
        max_live_parameters=values["max_live_parameters"],
        max_reuse_distance=values["max_reuse_distance"],
        gather_16bit_weights_on_model_save=values["gather_16bit_weights_on_model_save"],
        allgather_sequential=values["allgather_sequential"],
        zero_hpz_partition_size=values["zero_hpz_partition_size"],
        zero_quantized_weights=values["zero_quantized_weights"],
        zero_quantized_nontrainable_weights=values["zero_quantized_nontrainable_weights"],
        offload_param=OffloadParamSettings(**settings_fields(offload_param, OffloadParamSettings)),
        offload_optimizer=OffloadOptimizerSettings(
            **settings_fields(offload_optimizer, OffloadOptimizerSettings)
        ),
    )


def _safe_stage(block: Mapping[str, object]) -> int:
    raw = block.get("stage", 0)
    if isinstance(raw, bool):
        return int(raw)
    if isinstance(raw, int | float) and raw in (0, 1, 2, 3):
        return int(raw)
    return 0


def _resolve_offload(
    res: _Resolver,
    zero_block: Mapping[str, object],
    name: str,
    spec: ModelSpec,
    validated: ValidatedModel,
    deprecated: ConfigValue[Any],
) -> dict[str, ConfigValue[Any]]:
    prefix = f"zero_optimization.{name}"
    raw = zero_block.get(name)
    if isinstance(raw, dict):
        child = validated.children.get(name)
        return res.model_values(spec, raw, prefix, child)
    values = res.model_values(spec, {}, prefix, None)
    if isinstance(raw, str) and raw == "auto":
        values["device"] = ConfigValue(
            "none",
            prefix,
            Origin.AUTO_UNRESOLVED,
            res.src(prefix),
            'DeepSpeed drops "auto": no offload',
        )
    elif deprecated.is_explicit and deprecated.value and raw is None:
        values["device"] = ConfigValue(
            "cpu",
            deprecated.key_path,
            Origin.DEPRECATED_KEY,
            deprecated.source,
            f"deprecated key mapped to {name}.device",
        )
    return values


def _resolve_precision(
    res: _Resolver, data: Mapping[str, object], ctx: ResolutionContext
) -> PrecisionSettings:
    fp16_block = data.get("fp16", {})
    bf16_key = "bf16"
    bf16_block = data.get("bf16")
    if bf16_block is None:
        bf16_key = "bfloat16"
        bf16_block = data.get("bfloat16", {})

    def auto_enabled(target: Precision, key: str) -> dict[str, tuple[object, str]]:
        # transformers' fill_match and Accelerate's fill the spellings "fp16.enabled" and
        # "bf16.enabled" only: an "auto" under the older "bfloat16" key is left for DeepSpeed,
        # which drops it (bf16 stays disabled).
        if ctx.precision is None or ctx.integration == "deepspeed" or key not in ("fp16", "bf16"):
            return {}
        src = f" from {ctx.precision_source}" if ctx.precision_source else ""
        return {
            "enabled": (
                ctx.precision is target,
                f"as the HF Trainer fills it: precision {ctx.precision.value}{src}",
            )
        }

    fp16_validated = validate_model(FP16, fp16_block) if isinstance(fp16_block, dict) else None
    bf16_validated = validate_model(BF16, bf16_block) if isinstance(bf16_block, dict) else None
    fp16 = res.model_values(
        FP16, fp16_block, "fp16", fp16_validated, resolve_auto=auto_enabled(Precision.FP16, "fp16")
    )
    bf16 = res.model_values(
        BF16,
        bf16_block,
        bf16_key,
        bf16_validated,
        resolve_auto=auto_enabled(Precision.BF16, bf16_key),
    )
    if bf16_key == "bfloat16":
        bf16 = {
            name: (
                ConfigValue(v.value, v.key_path, Origin.ALIAS, v.source, v.note)
                if v.origin is Origin.USER
                else v
            )
            for name, v in bf16.items()
        }

    data_types = data.get("data_types")
    if isinstance(data_types, dict) and "grad_accum_dtype" in data_types:
        gad = ConfigValue(
            canonical_dtype(data_types["grad_accum_dtype"]),
            "data_types.grad_accum_dtype",
            Origin.USER,
            res.src("data_types.grad_accum_dtype"),
        )
    else:
        gad = ConfigValue(None, "data_types.grad_accum_dtype", Origin.DEFAULT, None, "model dtype")
    if "communication_data_type" in data and data["communication_data_type"] is not None:
        cdt = ConfigValue(
            canonical_dtype(data["communication_data_type"]),
            "communication_data_type",
            Origin.USER,
            res.src("communication_data_type"),
        )
    else:
        cdt = ConfigValue(None, "communication_data_type", Origin.DEFAULT, None, "model dtype")
    autocast = data.get("torch_autocast")
    autocast_enabled = bool(isinstance(autocast, dict) and autocast.get("enabled", False))
    return PrecisionSettings(
        fp16_enabled=fp16["enabled"],
        bf16_enabled=bf16["enabled"],
        grad_accum_dtype=gad,
        communication_data_type=cdt,
        fp16_master_weights_and_grads=fp16["fp16_master_weights_and_grads"],
        bf16_master_weights_and_grads=bf16["bf16_master_weights_and_grads"],
        bf16_optimizer_states=bf16["bf16_optimizer_states"],
        torch_autocast_enabled=ConfigValue(
            autocast_enabled,
            "torch_autocast.enabled",
            Origin.USER if isinstance(autocast, dict) and "enabled" in autocast else Origin.DEFAULT,
            res.src("torch_autocast.enabled") if isinstance(autocast, dict) else None,
        ),
    )


def _resolve_optimizer(res: _Resolver, data: Mapping[str, object]) -> OptimizerSettings:
    block = data.get("optimizer")
    if isinstance(block, dict) and "type" in block:
        name = block["type"]
        if isinstance(name, str) and name.lower() in DEEPSPEED_OPTIMIZERS:
            name = name.lower()
        opt_type: ConfigValue[Any] = ConfigValue(
            name, "optimizer.type", Origin.USER, res.src("optimizer.type")
        )
    else:
        opt_type = ConfigValue(
            None, "optimizer.type", Origin.DEFAULT, None, "the client's optimizer"
        )
    force = data.get("zero_force_ds_cpu_optimizer", True)
    force_value = ConfigValue(
        force,
        "zero_force_ds_cpu_optimizer",
        Origin.USER if "zero_force_ds_cpu_optimizer" in data else Origin.DEFAULT,
        res.src("zero_force_ds_cpu_optimizer") if "zero_force_ds_cpu_optimizer" in data else None,
    )
    return OptimizerSettings(type=opt_type, zero_force_ds_cpu_optimizer=force_value)  # type: ignore[arg-type]


# -- a file and the dump of the run that used it ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigDifference:
    """A setting whose value in the ds_config file differs from what the run printed.

    Either the file was edited after the run, or something between the file and DeepSpeed
    (the HF Trainer, Accelerate, a launcher script) changed the value.
    """

    setting: str
    file_value: ConfigValue[Any]
    dump_value: ConfigValue[Any]

    def describe(self) -> str:
        """In words: ``zero_optimization.stage3_prefetch_bucket_size is 50_000_000 in the file
        (ds_config.json:22), but the run used 10_000_000_000 (its config dump, train.log:150)``."""
        key = self.file_value.key_path or self.dump_value.key_path or self.setting
        mine = self.file_value.source.describe() if self.file_value.source else "the file"
        theirs = self.dump_value.source.describe() if self.dump_value.source else "the log"
        return (
            f"{key} is {show_value(self.file_value.value)} in the file ({mine}), but the run "
            f"used {show_value(self.dump_value.value)} (its config dump, {theirs})"
        )


def reconcile_with_dump(
    file_config: EffectiveDsConfig, dump_config: EffectiveDsConfig
) -> tuple[EffectiveDsConfig, tuple[ConfigDifference, ...]]:
    """The config the run used, with the file's provenance where the two agree.

    Values are the dump's (what DeepSpeed ran with, exact).  Where they equal the file's, the
    file's key path, origin and line are kept (a rule can cite ``ds_config.json:14``); where the
    file said ``"auto"``, the origin becomes ``AUTO_RESOLVED`` ("filled by the integration, read
    from the log's config dump"); where the file had no value, ``DERIVED``; every other mismatch
    keeps the dump's value and is listed as a ``ConfigDifference``.
    """
    differences: list[ConfigDifference] = []

    def merge_group(prefix: str, file_group: Any, dump_group: Any) -> Any:
        updates: dict[str, Any] = {}
        for spec in fields(file_group):
            mine = getattr(file_group, spec.name)
            theirs = getattr(dump_group, spec.name)
            if not isinstance(mine, ConfigValue) or not isinstance(theirs, ConfigValue):
                continue
            if theirs.origin is Origin.DEFAULT:
                continue  # the dump did not print it: keep the file's reading
            if mine.origin in (Origin.AUTO_UNRESOLVED, Origin.AUTO_RESOLVED) and (
                isinstance(mine.value, str)
                or mine.origin is Origin.AUTO_UNRESOLVED
                or mine.value != theirs.value
            ):
                updates[spec.name] = ConfigValue(
                    theirs.value,
                    mine.key_path,
                    Origin.AUTO_RESOLVED,
                    theirs.source,
                    '"auto" in the file, filled by the integration: value from the log\'s '
                    "config dump",
                )
            elif mine.value == theirs.value:
                continue
            elif mine.value is None and not mine.is_explicit:
                updates[spec.name] = ConfigValue(
                    theirs.value,
                    mine.key_path,
                    Origin.DERIVED,
                    theirs.source,
                    "derived by DeepSpeed (config dump)",
                )
            else:
                differences.append(ConfigDifference(f"{prefix}.{spec.name}", mine, theirs))
                updates[spec.name] = theirs
        return replace(file_group, **updates) if updates else file_group

    zero = merge_group("zero", file_config.zero, dump_config.zero)
    zero = replace(
        zero,
        offload_param=merge_group(
            "zero.offload_param", file_config.zero.offload_param, dump_config.zero.offload_param
        ),
        offload_optimizer=merge_group(
            "zero.offload_optimizer",
            file_config.zero.offload_optimizer,
            dump_config.zero.offload_optimizer,
        ),
    )
    merged = replace(
        file_config,
        zero=zero,
        precision=merge_group("precision", file_config.precision, dump_config.precision),
        batch=merge_group("batch", file_config.batch, dump_config.batch),
        optimizer=merge_group("optimizer", file_config.optimizer, dump_config.optimizer),
        world_size=dump_config.world_size,
    )
    return merged, tuple(differences)
