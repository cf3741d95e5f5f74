"""Facts about a DeepSpeed config: the settings DeepSpeed runs with, where each came from, and
what is wrong with them.

A ``ds_config`` says little on its own: most memory-relevant settings are defaults, some are
derived (the batch triple, ``overlap_comm``), some are Hugging Face ``"auto"`` placeholders that
only the HF Trainer or Accelerate fill in.  Every setting here is therefore a ``ConfigValue``
that carries, next to the value, the key path it lives under, how the value came to be
(``Origin``) and the line it was read from, so that a rule can cite "``zero_optimization.
stage3_prefetch_bucket_size`` = 1e10, set by the user at ds_config.json:14".

Numbers are DeepSpeed's: sizes in elements (numel), not bytes.  Converting to bytes is the
memory model's job (``oomlens.analysis.zero_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Generic, TypeVar

from oomlens.facts import SourceRef

T = TypeVar("T")


class Origin(Enum):
    """How a setting got its value."""

    USER = "user"
    """Written in the config under its documented key."""
    ALIAS = "alias"
    """Written under another spelling DeepSpeed accepts (``prefetch_bucket_size`` for
    ``stage3_prefetch_bucket_size``, ``bfloat16`` for ``bf16``)."""
    DEPRECATED_KEY = "deprecated_key"
    """Set through a deprecated key that DeepSpeed maps to this one (``cpu_offload``)."""
    DEFAULT = "default"
    """Not in the config: DeepSpeed's default."""
    DERIVED = "derived"
    """Computed by DeepSpeed from other settings (``overlap_comm`` from the stage, the third
    value of the batch triple)."""
    AUTO_UNRESOLVED = "auto_unresolved"
    """``"auto"`` with nothing to resolve it.  The value is what DeepSpeed alone would use
    (it drops ``"auto"`` in its config models, so the default applies)."""
    AUTO_RESOLVED = "auto_resolved"
    """``"auto"`` resolved the way the HF Trainer / Accelerate would (``ConfigValue.note``
    says from what)."""
    LOG_DUMP = "log_dump"
    """Read from DeepSpeed's own startup configuration dump: what the engine really ran with."""


#: Origins whose value was chosen by whoever wrote the config.
EXPLICIT_ORIGINS = frozenset({Origin.USER, Origin.ALIAS, Origin.DEPRECATED_KEY})


@dataclass(frozen=True, slots=True)
class ConfigValue(Generic[T]):
    """One setting: its value, the key path it lives under, how it got its value, and where.

    ``key_path`` is dotted (``zero_optimization.offload_param.pin_memory``) and spelled the way
    the config spells it when the key is present (an alias stays an alias), else the
    documented spelling.  ``source`` has the line of the key when the reader could tell it.
    ``note`` explains derived and resolved values (``"train_batch_size // micro // world"``).
    """

    value: T
    key_path: str
    origin: Origin
    source: SourceRef | None = None
    note: str = ""

    @property
    def is_explicit(self) -> bool:
        """True when the config's author chose this value (user key, alias, deprecated key)."""
        return self.origin in EXPLICIT_ORIGINS

    def cite(self) -> str:
        """``zero_optimization.reduce_bucket_size = 500_000_000 (default)`` or
        ``... (user at ds_config.json:14)``: for evidence lines."""
        where = f" at {self.source.describe()}" if self.source is not None else ""
        how = self.origin.value.replace("_", " ")
        extra = f"; {self.note}" if self.note else ""
        return f"{self.key_path} = {show_value(self.value)} ({how}{where}{extra})"


def show_value(value: object) -> str:
    """A config value as evidence shows it: ``true``/``null``, large ints with ``_`` groups."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}".replace(",", "_")
    return str(value)


class Precision(Enum):
    """The dtype DeepSpeed keeps the model (and ZeRO's 16-bit partitions) in."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def element_size(self) -> int:
        return 4 if self is Precision.FP32 else 2


#: ``data_types.grad_accum_dtype`` / ``communication_data_type`` spellings DeepSpeed accepts,
#: mapped to their element size (``DtypeEnum`` in deepspeed/runtime/config.py).
DTYPE_ELEMENT_SIZES: dict[str, int] = {
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "torch.float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "torch.bfloat16": 2,
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "torch.float32": 4,
    "int8": 1,
    "torch.int8": 1,
}


@dataclass(frozen=True, slots=True)
class OffloadParamSettings:
    """``zero_optimization.offload_param`` (stage 3 only).  ``device`` is ``none`` when absent."""

    device: ConfigValue[str]
    pin_memory: ConfigValue[bool]
    buffer_count: ConfigValue[int]
    buffer_size: ConfigValue[int]
    max_in_cpu: ConfigValue[int]
    nvme_path: ConfigValue[str | None]

    @property
    def enabled(self) -> bool:
        return self.device.value != "none"


@dataclass(frozen=True, slots=True)
class OffloadOptimizerSettings:
    """``zero_optimization.offload_optimizer``.  ``device`` is ``none`` when absent."""

    device: ConfigValue[str]
    pin_memory: ConfigValue[bool]
    buffer_count: ConfigValue[int]
    ratio: ConfigValue[float]
    nvme_path: ConfigValue[str | None]
    pipeline_read: ConfigValue[bool]
    pipeline_write: ConfigValue[bool]
    fast_init: ConfigValue[bool]
    super_offload: ConfigValue[bool]

    @property
    def enabled(self) -> bool:
        return self.device.value != "none"


@dataclass(frozen=True, slots=True)
class ZeroSettings:
    """The memory-relevant fields of ``zero_optimization`` as ``DeepSpeedZeroConfig`` resolves
    them.  Sizes are element counts."""

    stage: ConfigValue[int]
    contiguous_gradients: ConfigValue[bool]
    reduce_scatter: ConfigValue[bool]
    reduce_bucket_size: ConfigValue[int]
    allgather_bucket_size: ConfigValue[int]
    overlap_comm: ConfigValue[bool]
    sub_group_size: ConfigValue[int]
    prefetch_bucket_size: ConfigValue[int]
    param_persistence_threshold: ConfigValue[int]
    model_persistence_threshold: ConfigValue[int]
    max_live_parameters: ConfigValue[int]
    max_reuse_distance: ConfigValue[int]
    gather_16bit_weights_on_model_save: ConfigValue[bool]
    allgather_sequential: ConfigValue[bool]
    zero_hpz_partition_size: ConfigValue[int]
    zero_quantized_weights: ConfigValue[bool]
    zero_quantized_nontrainable_weights: ConfigValue[bool]
    offload_param: OffloadParamSettings
    offload_optimizer: OffloadOptimizerSettings


@dataclass(frozen=True, slots=True)
class PrecisionSettings:
    """``fp16``/``bf16`` (``bfloat16``), ``data_types`` and ``communication_data_type``."""

    fp16_enabled: ConfigValue[bool]
    bf16_enabled: ConfigValue[bool]
    grad_accum_dtype: ConfigValue[str | None]
    communication_data_type: ConfigValue[str | None]
    fp16_master_weights_and_grads: ConfigValue[bool]
    bf16_master_weights_and_grads: ConfigValue[bool]
    bf16_optimizer_states: ConfigValue[bool]
    torch_autocast_enabled: ConfigValue[bool]

    @property
    def model_precision(self) -> Precision:
        """The engine's model dtype (``DeepSpeedEngine.get_data_types``): fp16 wins over bf16,
        neither means fp32."""
        if self.fp16_enabled.value:
            return Precision.FP16
        if self.bf16_enabled.value:
            return Precision.BF16
        return Precision.FP32

    @property
    def param_bytes(self) -> int:
        """Bytes per element of ZeRO's parameter partitions and gathered parameters."""
        return self.model_precision.element_size

    @property
    def grad_accum_bytes(self) -> int:
        """Bytes per element of the gradient partitions (``grad_accum_dtype``, else model dtype)."""
        raw = self.grad_accum_dtype.value
        if raw is None:
            return self.param_bytes
        return DTYPE_ELEMENT_SIZES.get(str(raw).lower(), self.param_bytes)

    @property
    def comm_bytes(self) -> int:
        """Bytes per element of the reduce buckets (``DeepSpeedEngine.communication_data_type``)."""
        raw = self.communication_data_type.value
        if raw is None:
            return self.param_bytes
        return DTYPE_ELEMENT_SIZES.get(str(raw).lower(), self.param_bytes)


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The batch triple.  Read from a file it is what the file says (``None`` when absent,
    the raw string for ``"auto"``); read from a log dump it is what DeepSpeed derived."""

    train_batch_size: ConfigValue[Any]
    micro_batch_per_gpu: ConfigValue[Any]
    gradient_accumulation_steps: ConfigValue[Any]


@dataclass(frozen=True, slots=True)
class OptimizerSettings:
    """``optimizer.type`` (``None`` when the client passes its own optimizer)."""

    type: ConfigValue[str | None]
    zero_force_ds_cpu_optimizer: ConfigValue[bool]


@dataclass(frozen=True, slots=True)
class EffectiveDsConfig:
    """A ds_config as DeepSpeed 0.19.8 resolves it: defaults applied, aliases and deprecated
    keys mapped, ``"auto"`` dropped or resolved, ``overlap_comm`` derived from the stage.

    ``world_size`` is only known when the config came from DeepSpeed's startup dump (it prints
    ``world_size``); otherwise the batch arithmetic takes it from the log or command line.
    ``auto_keys`` lists the key paths that held ``"auto"`` in the config as written.
    """

    source: SourceRef
    zero: ZeroSettings
    precision: PrecisionSettings
    batch: BatchSettings
    optimizer: OptimizerSettings
    world_size: ConfigValue[Any] | None = None
    auto_keys: tuple[str, ...] = ()

    def settings(self) -> dict[str, object]:
        """Flat ``{canonical name: value}`` of every setting, without origins or sources.

        Two readings of the same config (the file, and the log's dump of it) resolve to the
        same effective config exactly when these dicts are equal.
        """
        flat: dict[str, object] = {}
        for prefix, group in (
            ("zero", self.zero),
            ("zero.offload_param", self.zero.offload_param),
            ("zero.offload_optimizer", self.zero.offload_optimizer),
            ("precision", self.precision),
            ("batch", self.batch),
            ("optimizer", self.optimizer),
        ):
            for spec in fields(group):
                item = getattr(group, spec.name)
                if isinstance(item, ConfigValue):
                    flat[f"{prefix}.{spec.name}"] = item.value
        return flat

    def all_values(self) -> list[ConfigValue[Any]]:
        """Every ``ConfigValue`` in this config (for rules that scan by origin)."""
        found: list[ConfigValue[Any]] = []
        for group in (
            self.zero,
            self.zero.offload_param,
            self.zero.offload_optimizer,
            self.precision,
            self.batch,
            self.optimizer,
        ):
            for spec in fields(group):
                item = getattr(group, spec.name)
                if isinstance(item, ConfigValue):
                    found.append(item)
        return found


class ConfigSeverity(Enum):
    """How bad a config problem or hazard is."""

    ERROR = "error"
    """DeepSpeed refuses the config: the job cannot start."""
    HIGH = "high"
    """Accepted, but almost certainly not what was meant, with a large memory effect."""
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class ValidationProblem:
    """Something DeepSpeed rejects (``severity`` ERROR) or warns about (deprecated keys).

    ``code`` is pydantic's error type where DeepSpeed's config models raise it
    (``extra_forbidden``, ``int_from_float``, ``enum``...), else an oomlens code
    (``batch_mismatch``, ``removed_key``, ``precision_conflict``...).  ``validator`` is
    ``"deepspeed"`` when DeepSpeed's own models produced the verdict, ``"oomlens"`` otherwise.
    ``count`` is how many problems this one stands for: more than one for the summary of those
    of one code past the ones listed (``oomlens.analysis.findings_cap``).
    """

    key_path: str
    code: str
    message: str
    severity: ConfigSeverity
    validator: str
    source: SourceRef | None = None
    count: int = 1


@dataclass(frozen=True, slots=True)
class ConfigHazard:
    """A config that DeepSpeed accepts but that is likely to waste or overflow memory.

    ``key_paths`` are the keys involved; ``bytes_at_stake`` is the memory effect when the
    memory model could put a number on it (per GPU unless ``message`` says per host).
    """

    code: str
    message: str
    severity: ConfigSeverity
    key_paths: tuple[str, ...] = ()
    sources: tuple[SourceRef, ...] = ()
    bytes_at_stake: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigReading:
    """Everything learnt from one ds_config (file or log dump): the raw mapping as DeepSpeed
    would load it, the effective config, and the problems and hazards found."""

    raw: dict[str, object]
    effective: EffectiveDsConfig
    problems: tuple[ValidationProblem, ...] = ()
    hazards: tuple[ConfigHazard, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_valid(self) -> bool:
        return not any(p.severity is ConfigSeverity.ERROR for p in self.problems)


@dataclass(frozen=True, slots=True)
class DumpedConfig:
    """DeepSpeed's startup configuration dump read from a log: the config the engine really
    ran with (every value ``Origin.LOG_DUMP``, citing its line), and the user's JSON as the
    dump's ``json = {...}`` part printed it (after Hugging Face's "auto" filling; numbers only
    7 significant digits precise; empty when missing)."""

    source: SourceRef
    effective: EffectiveDsConfig
    user_config: dict[str, object]
    complete: bool
    problems: tuple[str, ...] = ()


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


def settings_fields(
    values: Mapping[str, ConfigValue[Any]], cls: type
) -> dict[str, ConfigValue[Any]]:
    """The values of ``cls``'s fields (a settings dataclass) picked out of ``values``."""
    return {name: values[name] for name in cls.__dataclass_fields__}  # type: ignore[attr-defined]
