"""DeepSpeed 0.19.8's config models, restated as data, and pydantic's validation of them (its
lax coercion of scalars is in ``pydantic_lax``, DeepSpeed's top-level key tables in ``ds_keys``).

DeepSpeed validates ``zero_optimization`` (with ``offload_param``, ``offload_optimizer``,
``leaf_module``, ``zenflow``), ``fp16`` and ``bf16``/``bfloat16`` with pydantic v2 models
(``extra="forbid"``, ``populate_by_name=True``, ``validate_default=True``), after dropping every
key whose value is ``"auto"``.  This module lets oomlens apply the same rules when DeepSpeed is
not installed, and gives the resolver the defaults and aliases.  Sources:
``deepspeed/runtime/zero/config.py``, ``zero/offload_config.py``, ``zero/leaf_module_config.py``,
``runtime/zenflow/zenflow_config.py``, ``runtime/precision_config.py``, ``runtime/config_utils.py``
of DeepSpeed 0.19.8.  ``tests/analysis/test_ds_validation.py`` checks this restatement against the
installed DeepSpeed: same verdicts, same error types, same locations.

Error codes and messages are pydantic's (``int_from_float``: "Input should be a valid integer,
got a number with a fractional part").
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from oomlens.facts.pydantic_lax import CoercionError, lax_bool, lax_float, lax_int, lax_str

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class FieldError:
    """One pydantic-style error: location inside the model, error type, message."""

    loc: Loc
    code: str
    message: str


def _fmt_bound(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


# -- model description ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a DeepSpeed config model.

    ``kind``: ``int``, ``float``, ``bool``, ``str``, ``stage`` (``ZeroStageEnum``), ``device``
    (``OffloadDeviceEnum``), ``path`` (``pathlib.Path``), ``str_list``, ``str_or_int``,
    ``model`` (nested ``model``).  ``optional`` admits ``None``.  ``deprecated_to`` names the
    field a deprecated field is mapped onto (``set_new_param=False``: only warned about).
    ``before`` is a custom ``mode="before"`` validator returning an error message or None.
    """

    name: str
    kind: str
    default: object
    alias: str | None = None
    optional: bool = False
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    model: ModelSpec | None = None
    deprecated_to: str | None = None
    set_new_param: bool = True
    before: Callable[[object, str], str | None] | None = None

    @property
    def json_key(self) -> str:
        """The key documented for JSON (the alias when there is one)."""
        return self.alias or self.name


ModelCheck = Callable[[dict[str, object], frozenset[str]], FieldError | None]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A DeepSpeed config model: its fields in declaration order and its ``after`` validators."""

    class_name: str
    fields: tuple[FieldSpec, ...]
    checks: tuple[ModelCheck, ...] = ()
    coerce_str_lists: tuple[str, ...] = ()

    def field_named(self, name: str) -> FieldSpec:
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def by_key(self) -> dict[str, FieldSpec]:
        """Every accepted spelling (name and alias) -> field."""
        keys: dict[str, FieldSpec] = {}
        for spec in self.fields:
            keys[spec.name] = spec
            if spec.alias:
                keys[spec.alias] = spec
        return keys


@dataclass(slots=True)
class ValidatedModel:
    """The outcome of validating one mapping: values by field name (defaults filled), the
    fields the input set (by name), the key each field was given under, and the errors."""

    spec: ModelSpec
    values: dict[str, object] = field(default_factory=dict)
    fields_set: set[str] = field(default_factory=set)
    given_as: dict[str, str] = field(default_factory=dict)
    dropped_auto: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    children: dict[str, ValidatedModel] = field(default_factory=dict)


def drop_auto(data: Mapping[str, object]) -> dict[str, object]:
    """``DeepSpeedConfigModel.__init__``: keys whose value is ``"auto"`` are removed."""
    return {
        k: v
        for k, v in data.items()
        if not (isinstance(v, str) and v == "auto") or k == "replace_method"
    }


def _coerce(spec: FieldSpec, value: object, loc: Loc, out: ValidatedModel) -> object:
    if value is None and spec.optional:
        return None
    if spec.before is not None:
        problem = spec.before(value, spec.name)
        if problem is not None:
            raise CoercionError("value_error", f"Value error, {problem}")
    kind = spec.kind
    if kind == "int":
        result: object = lax_int(value)
    elif kind == "float":
        result = lax_float(value)
    elif kind == "bool":
        result = lax_bool(value)
    elif kind == "str":
        result = lax_str(value)
    elif kind == "str_or_int":
        if isinstance(value, str):
            result = value
        else:
            result = lax_int(value)
    elif kind == "stage":
        try:
            result = lax_int(value)
        except CoercionError:
            result = None
        if result not in (0, 1, 2, 3):
            raise CoercionError("enum", "Input should be 0, 1, 2, 3 or 3")
    elif kind == "device":
        if value not in ("none", "cpu", "nvme") or not isinstance(value, str):
            raise CoercionError("enum", "Input should be 'none', 'cpu' or 'nvme'")
        result = value
    elif kind == "path":
        if not isinstance(value, str):
            raise CoercionError("path_type", "Input is not a valid path for <class 'pathlib.Path'>")
        result = value or "."
    elif kind == "str_list":
        if not isinstance(value, list | tuple):
            raise CoercionError("list_type", "Input should be a valid list")
        items: list[str] = []
        for index, item in enumerate(value):
            if isinstance(item, str):
                items.append(item)
            else:
                out.errors.append(
                    FieldError((*loc, index), "string_type", "Input should be a valid string")
                )
        result = items
    elif kind == "model":
        assert spec.model is not None
        if not isinstance(value, Mapping):
            raise CoercionError(
                "model_type",
                f"Input should be a valid dictionary or instance of {spec.model.class_name}",
            )
        child = validate_model(spec.model, value, loc)
        out.children[spec.name] = child
        out.errors.extend(child.errors)
        result = child.values
    else:  # pragma: no cover - the tables below use only the kinds above
        raise AssertionError(kind)
    if isinstance(result, int | float) and not isinstance(result, bool):
        number = result  # an int is compared exactly: 10**400 is no float
        if spec.gt is not None and not number > spec.gt:
            raise CoercionError(
                "greater_than", f"Input should be greater than {_fmt_bound(spec.gt)}"
            )
        if spec.ge is not None and not number >= spec.ge:
            raise CoercionError(
                "greater_than_equal",
                f"Input should be greater than or equal to {_fmt_bound(spec.ge)}",
            )
        if spec.lt is not None and not number < spec.lt:
            raise CoercionError("less_than", f"Input should be less than {_fmt_bound(spec.lt)}")
        if spec.le is not None and not number <= spec.le:
            raise CoercionError(
                "less_than_equal", f"Input should be less than or equal to {_fmt_bound(spec.le)}"
            )
    return result


def validate_model(spec: ModelSpec, data: Mapping[str, object], loc: Loc = ()) -> ValidatedModel:
    """Validate ``data`` the way the pydantic model ``spec`` describes, without raising.

    Mirrors ``DeepSpeedConfigModel``: ``"auto"`` values dropped, aliases and field names both
    accepted (the field name is an unknown key when its alias is also given), unknown keys
    ``extra_forbidden``, ``after`` checks only when every field validated, then the
    deprecated-field mapping.  The deprecated-field conflict raises ``AssertionError`` in
    DeepSpeed, outside pydantic; it is reported here with code ``deprecated_conflict``.
    """
    out = ValidatedModel(spec=spec)
    cleaned = drop_auto(data)
    out.dropped_auto = [k for k in data if k not in cleaned]
    for key in spec.coerce_str_lists:
        if isinstance(cleaned.get(key), str):
            cleaned[key] = [cleaned[key]]
    extra: list[str] = []
    claimed: dict[str, str] = {}
    for key in cleaned:
        field_spec = spec.by_key().get(key)
        if field_spec is None:
            extra.append(key)
            continue
        previous = claimed.get(field_spec.name)
        if previous is None:
            claimed[field_spec.name] = key
        elif key == field_spec.alias:
            # pydantic takes the alias; the plain field name is then an unknown input.
            extra.append(previous)
            claimed[field_spec.name] = key
        else:
            extra.append(key)
    for field_spec in spec.fields:
        given_key = claimed.get(field_spec.name)
        if given_key is None:
            value = field_spec.default
            if field_spec.model is not None and isinstance(value, Mapping):
                value = validate_model(field_spec.model, value, (*loc, field_spec.name)).values
            out.values[field_spec.name] = value
            continue
        out.fields_set.add(field_spec.name)
        out.given_as[field_spec.name] = given_key
        try:
            out.values[field_spec.name] = _coerce(
                field_spec, cleaned[given_key], (*loc, given_key), out
            )
        except CoercionError as err:
            out.errors.append(FieldError((*loc, given_key), err.code, err.message))
    for key in extra:
        out.errors.append(
            FieldError((*loc, key), "extra_forbidden", "Extra inputs are not permitted")
        )
    if out.errors:
        return out
    for check in spec.checks:
        problem = check(out.values, frozenset(out.fields_set))
        if problem is not None:
            out.errors.append(FieldError((*loc, *problem.loc), problem.code, problem.message))
            return out
    for field_spec in spec.fields:
        if field_spec.deprecated_to is None or field_spec.name not in out.fields_set:
            continue
        if not field_spec.set_new_param:
            continue
        target = field_spec.deprecated_to
        if target in out.fields_set:
            out.errors.append(
                FieldError(
                    (*loc, out.given_as[field_spec.name]),
                    "deprecated_conflict",
                    f"Cannot provide deprecated parameter '{field_spec.name}' and replacing "
                    f"parameter '{target}' together",
                )
            )
            return out
        out.values[target] = _DEPRECATED_MAPPERS.get(field_spec.name, _identity)(
            out.values[field_spec.name]
        )
    return out


def _identity(value: object) -> object:
    return value


def _offload_cpu_if(value: object) -> object:
    if not value:
        return None
    return {**_defaults(OFFLOAD_OPTIMIZER), "device": "cpu"}


def _offload_param_cpu_if(value: object) -> object:
    if not value:
        return None
    return {**_defaults(OFFLOAD_PARAM), "device": "cpu"}


def _defaults(model: ModelSpec) -> dict[str, object]:
    return {f.name: f.default for f in model.fields}


# -- fp16 custom validators (precision_config.py) -------------------------------------------


def _fp16_loss_scale(value: object, _name: str) -> str | None:
    if isinstance(value, bool):
        return "fp16.loss_scale must be a number, not bool"
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "fp16.loss_scale must be a number"
    if not math.isfinite(number):
        return "fp16.loss_scale must be a finite number (not inf/-inf/nan)"
    if number < 0:
        return "fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)"
    return None


def _fp16_integer_scale_param(value: object, name: str) -> str | None:
    label = f"fp16.{name}"
    if isinstance(value, bool):
        return f"{label} must be an integer, not bool"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{label} must be a finite number (not inf/-inf/nan)"
    try:
        int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return f"{label} must be an integer"
    return None


def _fp16_dynamic_scale_check(values: dict[str, object], _set: frozenset[str]) -> FieldError | None:
    if values["enabled"] and values["loss_scale"] == 0:
        if int(values["loss_scale_window"]) <= 0:  # type: ignore[call-overload]
            return FieldError(
                (),
                "value_error",
                "Value error, fp16.loss_scale_window must be > 0 when dynamic loss scaling is "
                "enabled (loss_scale=0)",
            )
        if int(values["min_loss_scale"]) <= 0:  # type: ignore[call-overload]
            return FieldError(
                (),
                "value_error",
                "Value error, fp16.min_loss_scale must be > 0 when dynamic loss scaling is enabled "
                "(loss_scale=0)",
            )
    return None


def _zero_overlap_comm(values: dict[str, object], _set: frozenset[str]) -> FieldError | None:
    if values["overlap_comm"] is None:
        values["overlap_comm"] = values["stage"] == 3
    return None


def _zero_compute_grad_norm(values: dict[str, object], _set: frozenset[str]) -> FieldError | None:
    if not values["compute_grad_norm"] and values["stage"] not in (1, 2):
        return FieldError(
            (),
            "value_error",
            "Value error, compute_grad_norm=false is supported only with ZeRO Stage 1 or 2",
        )
    return None


def _zero_offload_ratio(values: dict[str, object], _set: frozenset[str]) -> FieldError | None:
    offload = values["offload_optimizer"]
    if isinstance(offload, Mapping) and float(offload["ratio"]) < 1.0 and values["stage"] != 3:
        return FieldError(
            (),
            "assertion_error",
            "Assertion failed, Partial offloading only supported for ZeRO Stage 3.",
        )
    return None


def _zenflow_check(values: dict[str, object], _set: frozenset[str]) -> FieldError | None:
    def err(text: str) -> FieldError:
        return FieldError((), "value_error", f"Value error, {text}")

    if values["select_strategy"] not in ("auto", "step", "epoch"):
        return err('select_strategy must be one of "auto", "step", or "epoch"')
    if isinstance(values["select_interval"], str) and values["select_interval"] != "auto":
        return err('If select_interval is a string, it must be "auto"')
    update = values["update_interval"]
    if isinstance(update, str) and update != "auto":
        return err('If update_interval is a string, it must be "auto"')
    if isinstance(update, int) and update < 1:
        return err("If update_interval is a number, it must be at least 1")
    if not isinstance(values["pt_reserved_cores_perc"], float):
        return err("pt_reserved_cores_perc must be a float")
    return None


# -- the models ------------------------------------------------------------------------------

OFFLOAD_PARAM = ModelSpec(
    "DeepSpeedZeroOffloadParamConfig",
    (
        FieldSpec("device", "device", "none"),
        FieldSpec("nvme_path", "path", None, optional=True),
        FieldSpec("buffer_count", "int", 5, ge=0),
        FieldSpec("buffer_size", "int", 100_000_000, ge=0),
        FieldSpec("max_in_cpu", "int", 1_000_000_000, ge=0),
        FieldSpec("pin_memory", "bool", True),
    ),
)

OFFLOAD_OPTIMIZER = ModelSpec(
    "DeepSpeedZeroOffloadOptimizerConfig",
    (
        FieldSpec("device", "device", "none"),
        FieldSpec("nvme_path", "path", None, optional=True),
        FieldSpec("buffer_count", "int", 4, ge=0),
        FieldSpec("pin_memory", "bool", True),
        FieldSpec("pipeline_read", "bool", False),
        FieldSpec("pipeline_write", "bool", False),
        FieldSpec("fast_init", "bool", False),
        FieldSpec("ratio", "float", 1.0, ge=0.0, le=1.0),
        FieldSpec("super_offload", "bool", False),
        FieldSpec("cpuadam_cores_perc", "float", 0.8, ge=0.0, le=1.0),
    ),
)

LEAF_MODULE = ModelSpec(
    "DeepSpeedZeroLeafModuleConfig",
    (
        FieldSpec(
            "classes",
            "str_list",
            (
                "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
                "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
            ),
        ),
        FieldSpec("names", "str_list", ()),
        FieldSpec("name_suffixes", "str_list", ()),
    ),
    coerce_str_lists=("classes", "names", "name_suffixes"),
)

ZENFLOW = ModelSpec(
    "ZenFlowConfig",
    (
        FieldSpec("topk_ratio", "float", 0.1, gt=0.0, lt=1.0),
        FieldSpec("select_strategy", "str", "auto"),
        FieldSpec("select_interval", "str_or_int", "auto"),
        FieldSpec("update_interval", "str_or_int", "auto"),
        FieldSpec("overlap_step", "bool", False),
        FieldSpec("offload", "bool", False),
        FieldSpec("auto_ratio", "float", 0.99, ge=0.0, le=1.0),
        FieldSpec("full_warm_up_rounds", "int", 0),
        FieldSpec("pt_reserved_cores_perc", "float", 0.5, ge=0.0, le=1.0),
        FieldSpec("steps_per_epoch", "int", None, optional=True),
    ),
    checks=(_zenflow_check,),
)

ZERO = ModelSpec(
    "DeepSpeedZeroConfig",
    (
        FieldSpec("stage", "stage", 0),
        FieldSpec("contiguous_gradients", "bool", True),
        FieldSpec("reduce_scatter", "bool", True),
        FieldSpec("reduce_bucket_size", "int", 500_000_000, gt=0),
        FieldSpec("use_multi_rank_bucket_allreduce", "bool", True),
        FieldSpec("allgather_partitions", "bool", True),
        FieldSpec("allgather_bucket_size", "int", 500_000_000, ge=0),
        FieldSpec("overlap_comm", "bool", None, optional=True),
        FieldSpec("compute_grad_norm", "bool", True),
        FieldSpec("load_from_fp32_weights", "bool", True),
        FieldSpec("elastic_checkpoint", "bool", False),
        FieldSpec("offload_param", "model", None, optional=True, model=OFFLOAD_PARAM),
        FieldSpec("offload_optimizer", "model", None, optional=True, model=OFFLOAD_OPTIMIZER),
        FieldSpec("zenflow", "model", None, optional=True, model=ZENFLOW),
        FieldSpec("sub_group_size", "int", 1_000_000_000, ge=0),
        FieldSpec("cpu_offload_param", "bool", None, optional=True, deprecated_to="offload_param"),
        FieldSpec(
            "cpu_offload_use_pin_memory",
            "bool",
            None,
            optional=True,
            deprecated_to="offload_param or offload_optimizer",
            set_new_param=False,
        ),
        FieldSpec("cpu_offload", "bool", None, optional=True, deprecated_to="offload_optimizer"),
        FieldSpec(
            "prefetch_bucket_size", "int", 50_000_000, alias="stage3_prefetch_bucket_size", ge=0
        ),
        FieldSpec(
            "param_persistence_threshold",
            "int",
            100_000,
            alias="stage3_param_persistence_threshold",
            ge=0,
        ),
        FieldSpec(
            "model_persistence_threshold",
            "int",
            sys.maxsize,
            alias="stage3_model_persistence_threshold",
            ge=0,
        ),
        FieldSpec(
            "max_live_parameters", "int", 1_000_000_000, alias="stage3_max_live_parameters", ge=0
        ),
        FieldSpec(
            "max_reuse_distance", "int", 1_000_000_000, alias="stage3_max_reuse_distance", ge=0
        ),
        FieldSpec(
            "gather_16bit_weights_on_model_save",
            "bool",
            False,
            alias="stage3_gather_16bit_weights_on_model_save",
        ),
        FieldSpec(
            "module_granularity_threshold", "int", 0, alias="stage3_module_granularity_threshold"
        ),
        FieldSpec(
            "use_all_reduce_for_fetch_params",
            "bool",
            False,
            alias="stage3_use_all_reduce_for_fetch_params",
        ),
        FieldSpec("allgather_sequential", "bool", False, alias="stage3_allgather_sequential"),
        FieldSpec(
            "stage3_gather_fp16_weights_on_model_save",
            "bool",
            False,
            deprecated_to="gather_16bit_weights_on_model_save",
        ),
        FieldSpec("ignore_unused_parameters", "bool", True),
        FieldSpec("legacy_stage1", "bool", False),
        FieldSpec("round_robin_gradients", "bool", False),
        FieldSpec("parameter_alignment", "bool", False),
        FieldSpec("zero_hpz_partition_size", "int", 1, ge=0),
        FieldSpec("zero_quantized_weights", "bool", False),
        FieldSpec("zero_quantized_nontrainable_weights", "bool", False),
        FieldSpec("zero_quantized_gradients", "bool", False),
        FieldSpec("memory_efficient_linear", "bool", True),
        FieldSpec("pipeline_loading_checkpoint", "bool", False),
        FieldSpec("override_module_apply", "bool", True),
        FieldSpec("log_trace_cache_warnings", "bool", False),
        FieldSpec("enable_sanity_checks", "bool", False),
        FieldSpec("save_muon_momentum_buffer_in_memory", "bool", False),
        FieldSpec("leaf_module", "model", {}, model=LEAF_MODULE),
    ),
    checks=(_zero_overlap_comm, _zero_compute_grad_norm, _zero_offload_ratio),
)

FP16 = ModelSpec(
    "DeepSpeedFP16Config",
    (
        FieldSpec("enabled", "bool", False),
        FieldSpec("auto_cast", "bool", False),
        FieldSpec("loss_scale", "float", 0.0, before=_fp16_loss_scale),
        FieldSpec("initial_scale_power", "int", 16),
        FieldSpec("loss_scale_window", "int", 1000, before=_fp16_integer_scale_param),
        FieldSpec("hysteresis", "int", 2),
        FieldSpec("consecutive_hysteresis", "bool", False),
        FieldSpec("min_loss_scale", "int", 1, before=_fp16_integer_scale_param),
        FieldSpec("fp16_master_weights_and_grads", "bool", False),
    ),
    checks=(_fp16_dynamic_scale_check,),
)

BF16 = ModelSpec(
    "DeepSpeedBF16Config",
    (
        FieldSpec("enabled", "bool", False),
        FieldSpec("immediate_grad_update", "bool", False),
        FieldSpec("check_grad_overflow", "bool", True),
        FieldSpec("bf16_master_weights_and_grads", "bool", False),
        FieldSpec("bf16_optimizer_states", "bool", False),
    ),
)

_DEPRECATED_MAPPERS: dict[str, Callable[[object], object]] = {
    "cpu_offload": _offload_cpu_if,
    "cpu_offload_param": _offload_param_cpu_if,
}


def given_key(fspec: FieldSpec, given: Mapping[str, object]) -> tuple[str | None, object]:
    """The key (alias first, as pydantic does) under which ``fspec`` is present, and its value."""
    for key in (fspec.alias, fspec.name):
        if key is not None and key in given:
            return key, given[key]
    return None, None
