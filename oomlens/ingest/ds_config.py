"""Read a DeepSpeed config the way DeepSpeed 0.19.8 reads it: from a file, or from the
configuration dump DeepSpeed prints at startup.

Files.  DeepSpeed loads a path with ``hjson.load(open(path), object_pairs_hook=
dict_raise_error_on_duplicate_keys)``.  ``read_ds_config`` accepts JSON with comments and
trailing commas itself (with the line of every key), gives numbers the values hjson gives
(``5e8`` -> int), rejects duplicate keys, and hands anything else to the ``hjson`` module when it
is installed (it comes with the ``deepspeed`` extra).  Bad input is an ``InputError`` naming the
file, line and column.

Resolution.  ``resolve_effective_config`` applies DeepSpeed's defaults, aliases, deprecated
keys and derived values, and treats Hugging Face ``"auto"`` placeholders as the HF Trainer /
Accelerate would when the model's hidden size (or the precision) is known, else marks them
unresolved with the value DeepSpeed alone would use.

Dumps.  At startup rank 0 logs ``DeepSpeedEngine configuration:``, one ``  key ..... value``
line per engine attribute (pydantic reprs for ``zero_config`` and the precision configs), then
``  json = {...}``: the user's config after HF's ``"auto"`` substitution, printed by
``ScientificNotationEncoder`` (numbers above 1e3 as ``5.000000e+08`` - only 7 significant
digits -, lines ending in ``", "``, bare ``inf``/``nan``).  ``ConfigDumpScanner`` finds these
blocks in a stream of log lines; ``ConfigDump.effective`` turns one into an
``EffectiveDsConfig`` whose values are the engine's exact ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import regex

from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts import SourceRef
from oomlens.facts.config import (
    BatchSettings,
    ConfigValue,
    EffectiveDsConfig,
    OffloadOptimizerSettings,
    OffloadParamSettings,
    OptimizerSettings,
    Origin,
    Precision,
    PrecisionSettings,
    ZeroSettings,
)
from oomlens.facts.ds_schema import (
    BF16,
    FP16,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    ZERO,
    FieldSpec,
    ModelSpec,
    ValidatedModel,
    validate_model,
)
from oomlens.ingest._jsonpos import DuplicateKeyError, JsonSyntaxError, parse_json_with_positions
from oomlens.ingest._pyrepr import parse_model_repr, parse_scalar

#: A ds_config is a few KiB; anything this large is not one.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Lines a dump block may span before the scanner gives up on it (0.19.8 prints ~130).
MAX_DUMP_LINES = 4000
MAX_DUMP_LINE_CHARS = 200_000

_HJSON_HINT = (
    "DeepSpeed reads ds_config files as Hjson (JSON plus comments and trailing commas); "
    "fix the syntax there"
)

#: ``optimizer.type`` values DeepSpeed lower-cases (``DEEPSPEED_OPTIMIZERS`` in config.py).
DEEPSPEED_OPTIMIZERS = frozenset(
    {"adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon"}
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


# -- documents -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigDocument:
    """A ds_config as DeepSpeed would load it.

    ``data`` is the decoded top-level object.  ``key_lines`` maps dotted key paths to 1-based
    lines in ``path`` (empty when the line is unknown, e.g. after an hjson fallback).
    ``syntax`` is ``json``, ``json+comments``, ``hjson``, ``mapping`` or ``log_dump``.
    """

    path: str
    data: dict[str, object]
    key_lines: Mapping[str, int] = field(default_factory=dict)
    syntax: str = "json"

    def source(self, key_path: str | None = None) -> SourceRef:
        """Where ``key_path`` is written (its line when known), else the file itself."""
        if key_path is None:
            return SourceRef(self.path)
        return SourceRef(self.path, self.key_lines.get(key_path))


def parse_ds_config_text(text: str, path: str) -> ConfigDocument:
    """Decode ``text`` as DeepSpeed decodes a config file; ``path`` is only for messages.

    Raises ``InputError`` for bad syntax (with line and column), duplicate keys, a top level
    that is not an object.
    """
    syntax = "json"
    try:
        parsed = parse_json_with_positions(text)
        if _has_comments_or_trailing_commas(text):
            syntax = "json+comments"
        data, key_lines = parsed.value, parsed.key_lines
    except JsonSyntaxError as err:
        data = _try_hjson(text, path, err)
        key_lines = {}
        syntax = "hjson"
    if not isinstance(data, dict):
        raise InputError(
            path,
            f"the top-level value is a {type(data).__name__}, not an object",
            'a ds_config is a JSON object such as {"train_batch_size": 8, ...}',
        )
    return ConfigDocument(path=path, data=data, key_lines=key_lines, syntax=syntax)


def _has_comments_or_trailing_commas(text: str) -> bool:
    return bool(regex.search(r"(?:^|[\s,{\[])(?:#|//|/\*)|,\s*[}\]]", text, timeout=1.0))


def _try_hjson(text: str, path: str, json_error: JsonSyntaxError) -> object:
    """Second chance for Hjson-only syntax, when the hjson module is there; else the
    original error (which has the better position)."""
    if isinstance(json_error, DuplicateKeyError):
        raise InputError(path, str(json_error), "remove one of the two entries") from None
    try:
        import hjson  # type: ignore[import-untyped]
    except ImportError:
        raise InputError(
            path,
            f"not valid JSON: {json_error}",
            _HJSON_HINT + " (install oomlens[deepspeed] to accept other Hjson syntax)",
        ) from None

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result: dict[str, object] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    try:
        return hjson.loads(text, object_pairs_hook=no_duplicates)
    except (ValueError, OverflowError, RecursionError, IndexError):
        raise InputError(path, f"not valid JSON or Hjson: {json_error}", _HJSON_HINT) from None


def read_ds_config(path: str | Path, *, max_bytes: int = MAX_CONFIG_BYTES) -> ConfigDocument:
    """Read a ds_config file.  Raises ``InputError`` when it is missing, unreadable, larger than
    ``max_bytes`` (``ResourceLimitError``), not UTF-8, or not a config DeepSpeed would load."""
    name = str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as err:
        raise InputError(
            name, f"cannot read the file: {err.strerror or err}", "check the path"
        ) from None
    if len(raw) > max_bytes:
        raise ResourceLimitError(
            name,
            f"larger than {max_bytes} bytes, which no ds_config is",
            "pass the ds_config.json file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(name, f"line {line}: not UTF-8 text", "save the config as UTF-8") from None
    return parse_ds_config_text(text, name)


def document_from_mapping(
    data: Mapping[str, object], path: str = "<config dict>"
) -> ConfigDocument:
    """A config given as a mapping (as HF passes one to ``deepspeed.initialize``)."""
    return ConfigDocument(path=path, data=dict(data), key_lines={}, syntax="mapping")


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
            key, raw = _given_key(fspec, given)
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


def _given_key(fspec: FieldSpec, given: Mapping[str, object]) -> tuple[str | None, object]:
    """The key (alias first, as pydantic does) under which ``fspec`` is present, and its value."""
    for key in (fspec.alias, fspec.name):
        if key is not None and key in given:
            return key, given[key]
    return None, None


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
        offload_param=OffloadParamSettings(**_offload_fields(offload_param, OffloadParamSettings)),
        offload_optimizer=OffloadOptimizerSettings(
            **_offload_fields(offload_optimizer, OffloadOptimizerSettings)
        ),
    )


def _safe_stage(block: Mapping[str, object]) -> int:
    raw = block.get("stage", 0)
    if isinstance(raw, bool):
        return int(raw)
    if isinstance(raw, int | float) and raw in (0, 1, 2, 3):
        return int(raw)
    return 0


def _offload_fields(
    values: Mapping[str, ConfigValue[Any]], cls: type
) -> dict[str, ConfigValue[Any]]:
    return {name: values[name] for name in cls.__dataclass_fields__}  # type: ignore[attr-defined]


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

    def auto_enabled(target: Precision) -> dict[str, tuple[object, str]]:
        if ctx.precision is None or ctx.integration == "deepspeed":
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
        FP16, fp16_block, "fp16", fp16_validated, resolve_auto=auto_enabled(Precision.FP16)
    )
    bf16 = res.model_values(
        BF16, bf16_block, bf16_key, bf16_validated, resolve_auto=auto_enabled(Precision.BF16)
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


# -- the startup dump ------------------------------------------------------------------------

_LOGGER_PREFIX = regex.compile(r"^\[[^\]\n]{1,64}\] \[[A-Z]{3,8}\] \[[^\]\n]{1,200}\] ")
_DUMP_HEADER = "DeepSpeedEngine configuration:"
_KEY_LINE = regex.compile(r"^  (?P<key>[A-Za-z_][A-Za-z0-9_]{0,100}) (?:\.{1,40})? ?(?P<value>.*)$")
_JSON_START = "  json = "


def strip_logger_prefix(text: str) -> tuple[str, bool]:
    """``[2026-..] [INFO] [config.py:678:print]   key ... v`` -> (``  key ... v``, True)."""
    match = _LOGGER_PREFIX.match(text, timeout=1.0)
    if match is None:
        return text, False
    return text[match.end() :], True


@dataclass(frozen=True, slots=True)
class ConfigDump:
    """One ``DeepSpeedEngine configuration:`` block from a log.

    ``fields`` maps engine attribute names (``zero_config``, ``train_batch_size``,
    ``world_size``, ...) to their printed text and the line it was on.  ``user_config`` is the
    ``json = {...}`` part (the user's config after HF's ``"auto"`` substitution; numbers above
    1e3 only 7 significant digits precise), None when missing or unreadable.  ``complete`` is
    False when the block was cut (truncated log, interleaved output).  ``problems`` says what
    could not be read.
    """

    header: SourceRef
    fields: Mapping[str, tuple[str, SourceRef]]
    user_config: ConfigDocument | None
    complete: bool
    problems: tuple[str, ...] = ()

    def value_of(self, name: str) -> object:
        """The parsed scalar of an engine line (``train_batch_size`` -> 32), None if absent."""
        entry = self.fields.get(name)
        return None if entry is None else parse_scalar(entry[0])

    def effective(self) -> EffectiveDsConfig:
        """The config the engine ran with, every value ``Origin.LOG_DUMP`` with the line it was
        printed on.  Key paths use the user's spelling where the ``json`` part has the key."""
        return _dump_to_effective(self)


class ConfigDumpScanner:
    """Finds ``DeepSpeedEngine configuration:`` blocks in a stream of log lines.

    Feed it ``(SourceRef, text)`` for each line, in order, with transport prefixes (pdsh
    ``host: ``, torchrun ``[default0]:``) already removed; the DeepSpeed logger prefix may stay.
    ``feed`` returns a finished ``ConfigDump`` when a block closes; call ``finish`` at the end
    for a block cut short.  Memory is bounded by one block (``MAX_DUMP_LINES``).
    """

    def __init__(self) -> None:
        self._block: list[tuple[SourceRef, str]] | None = None
        self._in_json = False

    def feed(self, ref: SourceRef, text: str) -> ConfigDump | None:
        if self._block is None and _DUMP_HEADER not in text:
            return None  # the common case: a line outside any dump, skipped without a regex
        if len(text) > MAX_DUMP_LINE_CHARS:
            text = text[:MAX_DUMP_LINE_CHARS]
        body, _ = strip_logger_prefix(text.rstrip("\r\n"))
        if body.rstrip() == _DUMP_HEADER or body.endswith(" " + _DUMP_HEADER):
            finished = self.finish()
            self._block = [(ref, body)]
            self._in_json = False
            return finished
        if self._block is None:
            return None
        self._block.append((ref, body))
        if body.startswith(_JSON_START):
            self._in_json = True
            if body.rstrip().endswith("}") and body.count("{") == body.count("}"):
                return self.finish()
        elif self._in_json and body.rstrip() == "}":
            return self.finish()
        if len(self._block) >= MAX_DUMP_LINES:
            return self.finish()
        return None

    def finish(self) -> ConfigDump | None:
        block, self._block, self._in_json = self._block, None, False
        if block is None:
            return None
        return parse_config_dump(block)


def scan_log_for_config_dumps(path: str | Path) -> Iterator[ConfigDump]:
    """Every config dump in a log file, streaming (bounded memory).  Raises ``InputError`` when
    the file cannot be read."""
    scanner = ConfigDumpScanner()
    name = str(path)
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                dump = scanner.feed(SourceRef(name, number), raw.decode("utf-8", "replace"))
                if dump is not None:
                    yield dump
    except OSError as err:
        raise InputError(
            name, f"cannot read the file: {err.strerror or err}", "check the path"
        ) from None
    last = scanner.finish()
    if last is not None:
        yield last


def parse_config_dump(lines: Iterable[tuple[SourceRef, str]]) -> ConfigDump:
    """Parse one dump block: the header line, the ``  key .... value`` lines (with the
    unprefixed continuation lines of multi-line values), and the ``  json = {`` part.

    Lines may still carry the DeepSpeed logger prefix.  Never raises on odd content: what
    cannot be read is listed in ``ConfigDump.problems``.
    """
    items = [(ref, strip_logger_prefix(text.rstrip("\r\n"))[0]) for ref, text in lines]
    if not items:
        raise ValueError("empty dump block")
    header = items[0][0]
    fields: dict[str, tuple[str, SourceRef]] = {}
    problems: list[str] = []
    json_lines: list[str] = []
    json_ref: SourceRef | None = None
    json_closed = False
    multiline_open = False
    index = 1
    while index < len(items):
        ref, body = items[index]
        index += 1
        if json_ref is not None:
            json_lines.append(body)
            if body.rstrip() == "}":
                json_closed = True
                break
            continue
        if body.startswith(_JSON_START):
            json_ref = ref
            json_lines.append(body[len(_JSON_START) :])
            if body.rstrip().endswith("}") and body.count("{") == body.count("}"):
                json_closed = True
                break
            continue
        if multiline_open:
            if body.rstrip() == "}":
                multiline_open = False
            continue
        match = _KEY_LINE.match(body, timeout=1.0)
        if match is None:
            continue  # interleaved output from another process
        key, value = match.group("key"), match.group("value")
        fields.setdefault(key, (value, ref))
        if value.rstrip() == "{":
            multiline_open = True
    user_config: ConfigDocument | None = None
    if json_ref is None:
        problems.append(
            "no 'json = {...}' part: the user's config was not printed or the log was cut"
        )
    else:
        text = "\n".join(json_lines)
        try:
            parsed = parse_json_with_positions(text, dump_syntax=True)
        except JsonSyntaxError as err:
            problems.append(
                f"the 'json = {{...}}' part at {json_ref.describe()} is unreadable: {err}"
            )
        else:
            if isinstance(parsed.value, dict):
                base = json_ref.line or 0
                lines_map = (
                    {k: base + v - 1 for k, v in parsed.key_lines.items()} if json_ref.line else {}
                )
                user_config = ConfigDocument(
                    path=json_ref.path, data=parsed.value, key_lines=lines_map, syntax="log_dump"
                )
    if "zero_config" not in fields:
        problems.append("no zero_config line in the dump")
    complete = json_closed and "zero_config" in fields
    return ConfigDump(
        header=header,
        fields=fields,
        user_config=user_config,
        complete=complete,
        problems=tuple(problems),
    )


def _dump_to_effective(dump: ConfigDump) -> EffectiveDsConfig:
    user = dump.user_config
    user_data = user.data if user is not None else {}

    def ref_of(name: str) -> SourceRef | None:
        entry = dump.fields.get(name)
        return entry[1] if entry else None

    zero_entry = dump.fields.get("zero_config")
    zero_fields = parse_model_repr(zero_entry[0]) if zero_entry else {}
    zero_ref = zero_entry[1] if zero_entry else None
    user_zero = (
        user_data.get("zero_optimization")
        if isinstance(user_data.get("zero_optimization"), dict)
        else {}
    )
    assert isinstance(user_zero, dict)

    def dumped(
        spec: ModelSpec,
        values: Mapping[str, object],
        prefix: str,
        user_block: Mapping[str, object],
        ref: SourceRef | None,
    ) -> dict[str, ConfigValue[Any]]:
        out: dict[str, ConfigValue[Any]] = {}
        for fspec in spec.fields:
            key, _ = _given_key(fspec, user_block)
            path = f"{prefix}.{key or fspec.json_key}"
            if fspec.name in values:
                value = values[fspec.name]
                note = (
                    "set in the config"
                    if key is not None
                    else "not in the config: DeepSpeed's value"
                )
                out[fspec.name] = ConfigValue(
                    _normalise_dump_value(fspec, value), path, Origin.LOG_DUMP, ref, note
                )
            else:
                out[fspec.name] = ConfigValue(
                    fspec.default,
                    path,
                    Origin.DEFAULT,
                    None,
                    "not printed in the dump: DeepSpeed 0.19.8 default",
                )
        return out

    zvals = dumped(ZERO, zero_fields, "zero_optimization", user_zero, zero_ref)
    offload: dict[str, dict[str, ConfigValue[Any]]] = {}
    for name, spec in (("offload_param", OFFLOAD_PARAM), ("offload_optimizer", OFFLOAD_OPTIMIZER)):
        raw = zero_fields.get(name)
        user_block = user_zero.get(name) if isinstance(user_zero.get(name), dict) else {}
        assert isinstance(user_block, dict)
        if isinstance(raw, dict):
            offload[name] = dumped(spec, raw, f"zero_optimization.{name}", user_block, zero_ref)
        else:
            offload[name] = dumped(
                spec,
                {"device": "none"} if name in zero_fields else {},
                f"zero_optimization.{name}",
                user_block,
                zero_ref,
            )

    fp16_enabled, bf16_enabled, fp16_vals, bf16_vals = _dump_precision(dump)
    batch = BatchSettings(
        train_batch_size=_dump_scalar(dump, "train_batch_size", "train_batch_size"),
        micro_batch_per_gpu=_dump_scalar(
            dump, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu"
        ),
        gradient_accumulation_steps=_dump_scalar(
            dump, "gradient_accumulation_steps", "gradient_accumulation_steps"
        ),
    )
    gad_raw = dump.value_of("grad_accum_dtype")
    cdt_raw = dump.value_of("communication_data_type")
    precision = PrecisionSettings(
        fp16_enabled=fp16_enabled,
        bf16_enabled=bf16_enabled,
        grad_accum_dtype=ConfigValue(
            canonical_dtype(gad_raw),
            "data_types.grad_accum_dtype",
            Origin.LOG_DUMP,
            ref_of("grad_accum_dtype"),
        ),
        communication_data_type=ConfigValue(
            canonical_dtype(cdt_raw),
            "communication_data_type",
            Origin.LOG_DUMP,
            ref_of("communication_data_type"),
        ),
        fp16_master_weights_and_grads=fp16_vals.get(
            "fp16_master_weights_and_grads",
            _default_value(FP16, "fp16_master_weights_and_grads", "fp16"),
        ),
        bf16_master_weights_and_grads=bf16_vals.get(
            "bf16_master_weights_and_grads",
            _default_value(BF16, "bf16_master_weights_and_grads", "bf16"),
        ),
        bf16_optimizer_states=bf16_vals.get(
            "bf16_optimizer_states", _default_value(BF16, "bf16_optimizer_states", "bf16")
        ),
        torch_autocast_enabled=_dump_scalar(
            dump, "torch_autocast_enabled", "torch_autocast.enabled", default=False
        ),
    )
    opt_name = dump.value_of("optimizer_name")
    optimizer = OptimizerSettings(
        type=ConfigValue(
            None if opt_name is None else str(opt_name),
            "optimizer.type",
            Origin.LOG_DUMP,
            ref_of("optimizer_name"),
        ),
        zero_force_ds_cpu_optimizer=_dump_scalar(
            dump, "zero_force_ds_cpu_optimizer", "zero_force_ds_cpu_optimizer", default=True
        ),
    )
    zero = ZeroSettings(
        **{
            name: zvals[name]
            for name in ZeroSettings.__dataclass_fields__
            if name not in ("offload_param", "offload_optimizer")
        },
        offload_param=OffloadParamSettings(
            **_offload_fields(offload["offload_param"], OffloadParamSettings)
        ),
        offload_optimizer=OffloadOptimizerSettings(
            **_offload_fields(offload["offload_optimizer"], OffloadOptimizerSettings)
        ),
    )
    world = dump.fields.get("world_size")
    return EffectiveDsConfig(
        source=dump.header,
        zero=zero,
        precision=precision,
        batch=batch,
        optimizer=optimizer,
        world_size=ConfigValue(parse_scalar(world[0]), "world_size", Origin.LOG_DUMP, world[1])
        if world
        else None,
        auto_keys=(),
    )


def _default_value(spec: ModelSpec, name: str, prefix: str) -> ConfigValue[Any]:
    fspec = spec.field_named(name)
    return ConfigValue(
        fspec.default, f"{prefix}.{fspec.json_key}", Origin.DEFAULT, None, "not in the dump"
    )


def _normalise_dump_value(fspec: FieldSpec, value: object) -> object:
    if fspec.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if fspec.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if fspec.kind == "device" and isinstance(value, str):
        return value.split(".")[-1]  # OffloadDeviceEnum.cpu -> cpu
    if fspec.kind == "path" and value is not None:
        return str(value)
    return value


def _dump_scalar(
    dump: ConfigDump, name: str, key_path: str, default: object = None
) -> ConfigValue[Any]:
    entry = dump.fields.get(name)
    if entry is None:
        return ConfigValue(default, key_path, Origin.DEFAULT, None, "not in the dump")
    value = parse_scalar(entry[0])
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        value = int(value)
    return ConfigValue(value, key_path, Origin.LOG_DUMP, entry[1])


def _dump_precision(
    dump: ConfigDump,
) -> tuple[
    ConfigValue[Any], ConfigValue[Any], dict[str, ConfigValue[Any]], dict[str, ConfigValue[Any]]
]:
    fp16_vals: dict[str, ConfigValue[Any]] = {}
    bf16_vals: dict[str, ConfigValue[Any]] = {}
    for attr, spec, prefix, out in (
        ("float16_config", FP16, "fp16", fp16_vals),
        ("bfloat16_config", BF16, "bf16", bf16_vals),
    ):
        entry = dump.fields.get(attr)
        if entry is None:
            continue
        parsed = parse_model_repr(entry[0])
        for fspec in spec.fields:
            if fspec.name in parsed:
                out[fspec.name] = ConfigValue(
                    parsed[fspec.name], f"{prefix}.{fspec.json_key}", Origin.LOG_DUMP, entry[1]
                )
    if "enabled" in fp16_vals:
        fp16_enabled = fp16_vals["enabled"]
    else:
        fp16_enabled = _dump_scalar(dump, "fp16_enabled", "fp16.enabled", default=False)
    if "enabled" in bf16_vals:
        bf16_enabled = bf16_vals["enabled"]
    else:
        bf16_enabled = _dump_scalar(dump, "bfloat16_enabled", "bf16.enabled", default=False)
    return fp16_enabled, bf16_enabled, fp16_vals, bf16_vals


__all__ = [
    "ConfigDifference",
    "ConfigDocument",
    "ConfigDump",
    "ConfigDumpScanner",
    "ResolutionContext",
    "canonical_dtype",
    "document_from_mapping",
    "find_auto_keys",
    "parse_config_dump",
    "parse_ds_config_text",
    "read_ds_config",
    "reconcile_with_dump",
    "resolve_effective_config",
    "scan_log_for_config_dumps",
    "strip_logger_prefix",
]


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
