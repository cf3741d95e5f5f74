"""Does DeepSpeed accept this config, and what in it is likely a mistake?

Two validators give the same verdicts:

* ``validate_with_deepspeed``: DeepSpeed's own code (0.19.8) decides - its pydantic models for
  ``zero_optimization``/``fp16``/``bf16``, its batch functions, its removed-key table, and a
  full ``DeepSpeedConfig`` construction for everything else.  Needs the ``deepspeed`` extra.
* ``validate_with_oomlens``: the same checks restated in ``oomlens.facts.ds_schema`` and
  ``oomlens.analysis.batch``, for installs without DeepSpeed.  It covers the blocks that matter
  for memory and the top-level checks of ``DeepSpeedConfig``; other blocks (monitor, compile,
  aio, ...) are only checked by the DeepSpeed path.

Both run the same phases, so that the DeepSpeed path can report more than its first exception:
(1) removed keys, (2) the ``zero_optimization``, ``fp16`` and ``bf16`` blocks - every field
error -, (3) fp16 and bf16 both enabled, (4) the batch triple at the given world size,
(5) only when all of that passed, the rest of ``DeepSpeedConfig``'s checks, first failure only
(as DeepSpeed raises).  ``tests/analysis/test_ds_validation.py`` runs both over the same
configs and asserts they agree.

What DeepSpeed accepts but probably should not is ``oomlens.analysis.config_hazards``;
``read_and_check`` gives both.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from oomlens.analysis.batch import TRAIN, assert_batch, derive_batch, repeated_by_multiplying
from oomlens.analysis.config_hazards import find_config_hazards
from oomlens.analysis.ds_resolve import ResolutionContext, resolve_effective_config
from oomlens.analysis.findings_cap import capped_problems
from oomlens.facts.config import (
    ConfigDocument,
    ConfigReading,
    ConfigSeverity,
    ValidationProblem,
)
from oomlens.facts.ds_keys import REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS
from oomlens.facts.ds_schema import (
    BF16,
    FP16,
    ZERO,
    ValidatedModel,
    validate_model,
)

DEEPSPEED = "deepspeed"
OOMLENS = "oomlens"

#: World sizes tried when the world size is unknown: a batch problem is reported only when it
#: fails at every one of them (it does not depend on the GPU count).
_WORLD_SIZES_TRIED = range(1, 4097)


@functools.cache
def deepspeed_available() -> bool:
    """True when DeepSpeed's config modules import (they import torch: a few seconds)."""
    # DeepSpeed logs "Setting accelerator to CPU ..." to stdout while importing on a machine
    # without a GPU; that is noise in oomlens' output.
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            import deepspeed.runtime.config  # noqa: F401
            import deepspeed.runtime.precision_config  # noqa: F401
            import deepspeed.runtime.zero.config  # noqa: F401
            from deepspeed.utils import logger as ds_logger
        for handler in ds_logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sink:
                handler.setStream(sys.stdout)
    except Exception:  # DeepSpeed missing or broken (no torch, wrong CUDA): fall back
        return False
    return True


def validate(
    doc: ConfigDocument, *, world_size: int | None = None, prefer_deepspeed: bool = True
) -> tuple[ValidationProblem, ...]:
    """Problems that make DeepSpeed refuse ``doc`` (empty: DeepSpeed accepts it).

    ``world_size`` is the data-parallel size the batch triple is checked at; when None, only
    batch problems that occur at every world size are reported.  The DeepSpeed path is used
    when ``prefer_deepspeed`` and DeepSpeed imports.
    """
    if prefer_deepspeed and deepspeed_available():
        return tuple(validate_with_deepspeed(doc, world_size=world_size))
    return tuple(validate_with_oomlens(doc, world_size=world_size))


def read_and_check(
    doc: ConfigDocument,
    *,
    context: ResolutionContext | None = None,
    world_size: int | None = None,
    prefer_deepspeed: bool = True,
) -> ConfigReading:
    """Everything about one config for the rules: the raw mapping, the effective config, the
    problems (``validate``) and the config-only hazards (``find_config_hazards``).
    ``context.integration`` says who launches with it (see ``find_config_hazards``)."""
    ctx = context or ResolutionContext()
    effective = resolve_effective_config(doc, ctx)
    problems = validate(doc, world_size=world_size, prefer_deepspeed=prefer_deepspeed)
    hazards = find_config_hazards(doc, effective, integration=ctx.integration)
    return ConfigReading(
        raw=doc.data, effective=effective, problems=problems, hazards=tuple(hazards)
    )


# -- shared helpers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Problem:
    key_path: str
    code: str
    message: str


def _finish(
    doc: ConfigDocument, problems: list[_Problem], validator: str
) -> list[ValidationProblem]:
    """The validators' problems as facts, at most ``MAX_LISTED`` of a code (``capped_problems``)."""
    out: list[ValidationProblem] = []
    for problem in problems:
        source_key = re.sub(r"(\.\d+)+$", "", problem.key_path)
        out.append(
            ValidationProblem(
                key_path=problem.key_path,
                code=problem.code,
                message=problem.message,
                severity=ConfigSeverity.ERROR,
                validator=validator,
                source=doc.source(source_key if source_key in doc.key_lines else None)
                if source_key
                else doc.source(),
            )
        )
    return list(capped_problems(out))


def _join(prefix: str, loc: tuple[Any, ...]) -> str:
    parts = [prefix, *(str(p) for p in loc)] if prefix else [str(p) for p in loc]
    return ".".join(p for p in parts if p)


def _bf16_key(data: Mapping[str, Any]) -> str:
    return "bf16" if data.get("bf16") is not None else "bfloat16"


def _removed_key_problems(
    data: Mapping[str, Any], top: Mapping[str, str], zero: Mapping[str, str]
) -> list[_Problem]:
    problems = [
        _Problem(key, "removed_key", message) for key, message in top.items() if key in data
    ]
    zero_block = data.get("zero_optimization")
    if isinstance(zero_block, dict):
        problems += [
            _Problem(f"zero_optimization.{key}", "removed_key", message)
            for key, message in zero.items()
            if key in zero_block
        ]
    return problems


def _batch_values(data: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return (
        data.get("train_batch_size"),
        data.get("train_micro_batch_size_per_gpu"),
        data.get("gradient_accumulation_steps"),
    )


def _batch_problem(
    run: Callable[[Any, Any, Any, Any], None], data: Mapping[str, Any], world_size: int | None
) -> _Problem | None:
    """Run DeepSpeed's (or oomlens') batch logic; at an unknown world size, report only what
    fails at every world size tried."""
    train, micro, gas = _batch_values(data)

    def attempt(ws: int) -> _Problem | None:
        try:
            run(train, micro, gas, ws)
        except AssertionError as exc:
            text = str(exc)
            if text.startswith("Check batch"):
                return _Problem(TRAIN, "batch_mismatch", text)
            if text.startswith("Either"):
                return _Problem(TRAIN, "batch_missing", text)
            key = (
                TRAIN
                if text.startswith("Train")
                else (
                    "train_micro_batch_size_per_gpu"
                    if text.startswith("Micro")
                    else "gradient_accumulation_steps"
                )
            )
            return _Problem(key, "batch_nonpositive", text)
        except (TypeError, OverflowError) as exc:  # a text value times a huge number
            key = next(
                (
                    k
                    for k, v in zip(
                        (TRAIN, "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"),
                        (train, micro, gas),
                        strict=True,
                    )
                    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float))
                ),
                TRAIN,
            )
            return _Problem(key, "batch_type_error", f"{type(exc).__name__}: {exc}")
        except ZeroDivisionError as exc:
            key = "train_micro_batch_size_per_gpu" if micro == 0 else "gradient_accumulation_steps"
            return _Problem(key, "batch_zero_division", f"ZeroDivisionError: {exc}")
        return None

    if world_size is not None:
        return attempt(world_size)
    first = attempt(1)
    if first is None:
        return None
    if first.code == "batch_mismatch" and any(attempt(ws) is None for ws in _WORLD_SIZES_TRIED):
        return None
    if first.code == "batch_nonpositive" and any(attempt(ws) is None for ws in _WORLD_SIZES_TRIED):
        return None
    return _Problem(first.key_path, first.code, first.message + " (at any world size)")


# -- the oomlens path --------------------------------------------------------------------------

_REMOVED_TOP_MESSAGES = {
    key: f"DeepSpeed 0.19.8 refuses the removed '{key}' block" for key in REMOVED_TOP_LEVEL_KEYS
}
_REMOVED_ZERO_MESSAGES = {
    key: f"DeepSpeed 0.19.8 refuses the removed 'zero_optimization.{key}' key"
    for key in REMOVED_ZERO_KEYS
}


def _model_problems(
    prefix: str, model: ValidatedModel, skip_extra: frozenset[str] = frozenset()
) -> list[_Problem]:
    out: list[_Problem] = []
    for err in model.errors:
        if err.code == "extra_forbidden" and len(err.loc) == 1 and err.loc[0] in skip_extra:
            continue
        out.append(_Problem(_join(prefix, err.loc) or prefix, err.code, err.message))
    return out


def _block_type_problem(key: str, value: Any, model_name: str) -> _Problem:
    return _Problem(
        key,
        "block_type",
        f"TypeError: deepspeed.runtime.{model_name}() argument after ** must be a mapping, "
        f"not {type(value).__name__}",
    )


def validate_with_oomlens(
    doc: ConfigDocument, *, world_size: int | None = None
) -> list[ValidationProblem]:
    """The checks of ``validate_with_deepspeed``, without DeepSpeed (see the module docstring)."""
    data = doc.data
    problems = _removed_key_problems(data, _REMOVED_TOP_MESSAGES, _REMOVED_ZERO_MESSAGES)
    block_errors = False

    zero = data.get("zero_optimization")
    if "zero_optimization" in data and not isinstance(zero, dict | bool):
        problems.append(
            _block_type_problem("zero_optimization", zero, "zero.config.DeepSpeedZeroConfig")
        )
        block_errors = True
    elif isinstance(zero, dict):
        found = _model_problems(
            "zero_optimization", validate_model(ZERO, zero), frozenset(REMOVED_ZERO_KEYS)
        )
        problems += found
        block_errors |= bool(found)

    fp16 = data.get("fp16", {})
    fp16_model: ValidatedModel | None = None
    if not isinstance(fp16, dict):
        problems.append(_block_type_problem("fp16", fp16, "precision_config.DeepSpeedFP16Config"))
        block_errors = True
    else:
        fp16_model = validate_model(FP16, fp16)
        found = _model_problems("fp16", fp16_model)
        problems += found
        block_errors |= bool(found)
    bf16_key = _bf16_key(data)
    bf16 = data.get(bf16_key, {})
    bf16_model: ValidatedModel | None = None
    if not isinstance(bf16, dict):
        problems.append(_block_type_problem(bf16_key, bf16, "precision_config.DeepSpeedBF16Config"))
        block_errors = True
    else:
        bf16_model = validate_model(BF16, bf16)
        found = _model_problems(bf16_key, bf16_model)
        problems += found
        block_errors |= bool(found)

    if (
        fp16_model is not None
        and bf16_model is not None
        and not fp16_model.errors
        and not bf16_model.errors
        and fp16_model.values["enabled"]
        and bf16_model.values["enabled"]
    ):
        problems.append(
            _Problem(
                f"{bf16_key}.enabled",
                "precision_conflict",
                "bfloat16 and fp16 modes cannot be simultaneously enabled",
            )
        )

    def run(train: Any, micro: Any, gas: Any, ws: Any) -> None:
        triple, _, _ = derive_batch(train, micro, gas, ws)
        assert_batch(triple, ws)

    batch = _batch_problem(run, data, world_size)
    if batch is not None:
        problems.append(batch)

    if not problems and not block_errors:
        rest = _oomlens_rest(data)
        if rest is not None:
            problems.append(rest)
    return _finish(doc, problems, OOMLENS)


_COMM_TYPES = ("fp32", "fp16", "bf16")
_AUTOCAST_DTYPES = frozenset(
    {
        "torch.float16",
        "fp16",
        "float16",
        "half",
        "torch.float32",
        "fp32",
        "float32",
        "float",
        "torch.int8",
        "int8",
        "torch.bfloat16",
        "bf16",
        "bfloat16",
    }
)


def _oomlens_rest(data: Mapping[str, Any]) -> _Problem | None:
    """The other checks of ``DeepSpeedConfig.__init__``, in DeepSpeed's order, first failure."""
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value.lower() not in _COMM_TYPES:
            return _Problem(
                key,
                "invalid_value",
                f"Invalid {key}. Supported data types: ['fp16', 'bf16', 'fp32']. Got: {value}",
            )
    op = data.get("gradient_allreduce_op", "mean")
    if isinstance(op, str):
        op = op.lower()
    if op not in ("mean", "sum"):
        return _Problem(
            "gradient_allreduce_op", "invalid_value", f"Invalid gradient_allreduce_op. Got: {op!r}"
        )
    autocast = data.get("torch_autocast")
    if isinstance(autocast, dict) and "dtype" in autocast:
        dtype = autocast["dtype"]
        if not isinstance(dtype, str) or dtype not in _AUTOCAST_DTYPES:
            return _Problem(
                "torch_autocast.dtype",
                "invalid_value",
                f"Invalid dtype for torch autocast: {dtype}",
            )
    checkpoint = data.get("checkpoint", {})
    if isinstance(checkpoint, dict):
        mode = checkpoint.get("tag_validation", "Warn")
        if not isinstance(mode, str) or mode.upper() not in ("WARN", "IGNORE", "FAIL"):
            return _Problem(
                "checkpoint.tag_validation",
                "invalid_value",
                f"Checkpoint config contains invalid tag_validation value of {mode}",
            )
        parallel = checkpoint.get("parallel_write", {})
        if isinstance(parallel, dict) and parallel.get("pipeline_stage", False) not in (
            True,
            False,
        ):
            return _Problem(
                "checkpoint.parallel_write.pipeline_stage",
                "invalid_value",
                "checkpoint::parallel_write::pipeline_stage value is invalid, expecting: true "
                "or false",
            )
    zero = data.get("zero_optimization")
    stage = 0
    zenflow = False
    if isinstance(zero, dict):
        model = validate_model(ZERO, zero)
        stage = int(model.values["stage"])  # type: ignore[call-overload]
        zenflow = model.values.get("zenflow") is not None
    elif isinstance(zero, bool):
        stage = int(zero)
    if op == "sum" and stage == 3:
        return _Problem(
            "gradient_allreduce_op",
            "invalid_value",
            "gradient_allreduce_op='sum' is not supported with ZeRO stage 3",
        )
    if op == "sum" and zenflow:
        return _Problem(
            "gradient_allreduce_op",
            "invalid_value",
            "gradient_allreduce_op='sum' is not supported with ZenFlow",
        )
    fp16 = validate_model(FP16, data.get("fp16", {})).values
    bf16_key = _bf16_key(data)
    bf16 = validate_model(BF16, data.get(bf16_key, {})).values
    if fp16["fp16_master_weights_and_grads"] and stage not in (1, 2, 3):
        return _Problem(
            "fp16.fp16_master_weights_and_grads",
            "invalid_value",
            "Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.",
        )
    if bf16["bf16_master_weights_and_grads"] and stage not in (1, 2, 3):
        return _Problem(
            f"{bf16_key}.bf16_master_weights_and_grads",
            "invalid_value",
            "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.",
        )
    if bf16["bf16_optimizer_states"]:
        if stage not in (1, 2, 3):
            return _Problem(
                f"{bf16_key}.bf16_optimizer_states",
                "invalid_value",
                "bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3.",
            )
        if not bf16["bf16_master_weights_and_grads"]:
            return _Problem(
                f"{bf16_key}.bf16_optimizer_states",
                "invalid_value",
                "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled.",
            )
    return None


# -- the DeepSpeed path ------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed logs deprecation warnings while validating; oomlens reports them itself."""
    from deepspeed.utils import logger as ds_logger

    previous = ds_logger.level
    ds_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        ds_logger.setLevel(previous)


def _pydantic_problems(
    prefix: str, build: Callable[[], Any], skip_extra: frozenset[str] = frozenset()
) -> list[_Problem]:
    import pydantic

    try:
        build()
    except pydantic.ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden" and len(loc) == 1 and loc[0] in skip_extra:
                continue
            out.append(_Problem(_join(prefix, loc) or prefix, err["type"], err["msg"]))
        return out
    except AssertionError as exc:
        match = re.search(r"deprecated parameter '(\w+)'", str(exc))
        key = f"{prefix}.{match.group(1)}" if match else prefix
        return [_Problem(key, "deprecated_conflict", str(exc))]
    except TypeError as exc:
        return [_Problem(prefix, "block_type", f"TypeError: {exc}")]
    return []


def validate_with_deepspeed(
    doc: ConfigDocument, *, world_size: int | None = None
) -> list[ValidationProblem]:
    """DeepSpeed's own verdicts (see the module docstring).  Raises ``ImportError`` when
    DeepSpeed is not installed."""
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    from deepspeed.runtime.zero.config import get_zero_config

    data = doc.data
    with _quiet_deepspeed():
        top_removed = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", _REMOVED_TOP_MESSAGES)
        zero_removed = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", _REMOVED_ZERO_MESSAGES)
        problems = _removed_key_problems(data, top_removed, zero_removed)

        block_input: dict[str, Any] = {}
        if "zero_optimization" in data:
            block_input["zero_optimization"] = data["zero_optimization"]
            if "allgather_size" in data:
                block_input["allgather_size"] = data["allgather_size"]
        found = _pydantic_problems(
            "zero_optimization", lambda: get_zero_config(block_input), frozenset(zero_removed)
        )
        fp16_found = _pydantic_problems("fp16", lambda: get_float16_config(data))
        bf16_found = _pydantic_problems(_bf16_key(data), lambda: get_bfloat16_config(data))
        problems += found + fp16_found + bf16_found
        block_errors = bool(found or fp16_found or bf16_found)
        if not fp16_found and not bf16_found:
            if get_float16_config(data).enabled and get_bfloat16_config(data).enabled:
                problems.append(
                    _Problem(
                        f"{_bf16_key(data)}.enabled",
                        "precision_conflict",
                        "bfloat16 and fp16 modes cannot be simultaneously enabled",
                    )
                )

        def run(train: Any, micro: Any, gas: Any, ws: Any) -> None:
            if any(repeated_by_multiplying(value) for value in (train, micro, gas)):
                # DeepSpeed multiplies text and lists too ("A" * 2e9 is a 2 GB string) before it
                # fails; oomlens' restatement fails with the same TypeError without building it.
                assert_batch(derive_batch(train, micro, gas, ws)[0], ws)
                return
            state = SimpleNamespace(
                train_batch_size=train,
                train_micro_batch_size_per_gpu=micro,
                gradient_accumulation_steps=gas,
                world_size=ws,
            )
            ds_config.DeepSpeedConfig._set_batch_related_parameters(state)
            ds_config.DeepSpeedConfig._batch_assertion(state)

        batch = _batch_problem(run, data, world_size)
        if batch is not None:
            problems.append(batch)
        if not problems and not block_errors:
            rest = _deepspeed_rest(ds_config, data, world_size or 1)
            if rest is not None:
                problems.append(rest)
    return _finish(doc, problems, DEEPSPEED)


# DeepSpeed getters checked one by one, in DeepSpeed's order, to tell which key a construction
# failure is about.
_GETTER_KEYS: tuple[tuple[Callable[[Any, Mapping[str, Any]], Any], str], ...] = (
    (lambda ds, d: ds.get_communication_data_type(d), "communication_data_type"),
    (
        lambda ds, d: ds.get_communication_data_type(
            d, "seq_parallel_communication_data_type", "fp32"
        ),
        "seq_parallel_communication_data_type",
    ),
    (lambda ds, d: ds.get_gradient_allreduce_op(d), "gradient_allreduce_op"),
    (lambda ds, d: ds.get_torch_autocast_dtype(d), "torch_autocast.dtype"),
    (
        lambda ds, d: ds.get_checkpoint_tag_validation_mode(ds.get_checkpoint_params(d)),
        "checkpoint.tag_validation",
    ),
    (
        lambda ds, d: ds.get_checkpoint_parallel_write_pipeline(ds.get_checkpoint_params(d)),
        "checkpoint.parallel_write.pipeline_stage",
    ),
)

_POST_BATCH_MESSAGES = (
    (re.compile(r"gradient_allreduce_op='sum'"), "gradient_allreduce_op"),
    (re.compile(r"^Fp16_master_weights_and_grads"), "fp16.fp16_master_weights_and_grads"),
    (re.compile(r"^Bf16_master_weights_and_grads"), "{bf16}.bf16_master_weights_and_grads"),
    (re.compile(r"^bf16_optimizer_states"), "{bf16}.bf16_optimizer_states"),
)


def _deepspeed_rest(ds_config: Any, data: Mapping[str, Any], world_size: int) -> _Problem | None:
    """Build a full ``DeepSpeedConfig`` (world size patched in, batch triple made consistent,
    since phase 4 judged it) and report its first failure."""
    neutral = dict(data)
    neutral.update(
        {
            "train_batch_size": world_size,
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
        }
    )
    try:
        cfg = ds_config.DeepSpeedConfig.__new__(ds_config.DeepSpeedConfig)
        cfg._param_dict = neutral
        cfg.global_rank = 0
        cfg.world_size = world_size
        ds_config._reject_removed_config_keys(neutral)
        cfg._initialize_params(copy.copy(neutral))
        cfg._configure_train_batch_size()
        cfg._do_sanity_check()
    except Exception as exc:  # any refusal: classify it below
        text = str(exc) or type(exc).__name__
        for getter, key in _GETTER_KEYS:
            try:
                getter(ds_config, neutral)
            except Exception:
                return _Problem(key, "invalid_value", text)
        for pattern, key in _POST_BATCH_MESSAGES:
            if pattern.search(text):
                return _Problem(key.format(bf16=_bf16_key(data)), "invalid_value", text)
        return _Problem("", "deepspeed_error", f"{type(exc).__name__}: {text}")
    return None


def problems_as_text(
    problems: tuple[ValidationProblem, ...] | list[ValidationProblem],
) -> list[str]:
    """One line per problem: ``ds_config.json:14: zero_optimization.x: Extra inputs ...``."""
    return [
        f"{p.source.describe() if p.source else ''}: {p.key_path or '(config)'}: {p.message} "
        f"[{p.code}]"
        for p in problems
    ]


__all__ = [
    "read_and_check",
    "deepspeed_available",
    "problems_as_text",
    "validate",
    "validate_with_deepspeed",
    "validate_with_oomlens",
]
