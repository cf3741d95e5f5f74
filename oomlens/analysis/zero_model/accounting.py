"""The arithmetic every part of the ZeRO budget shares: sizes in words, integer division as
DeepSpeed rounds it, the optimizer's state elements per parameter, torch's pinned-memory
rounding, optimizer sub-groups, and the context components are added to (``Ctx``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal

from oomlens.facts.config import (
    EffectiveDsConfig,
)
from oomlens.facts.memory_model import (
    MemoryComponent,
    ModelSize,
    Topology,
)

OPTIMIZER_STATE_ELEMENTS: dict[str, int] = {
    "adam": 2,
    "adamw": 2,
    "lamb": 2,
    "muadam": 2,
    "muadamw": 2,
    "onebitadam": 2,
    "zerooneadam": 2,
    "onebitlamb": 2,
    "fusedadam": 2,
    "cpuadam": 2,
    "lion": 1,
    "adagrad": 1,
    "musgd": 1,
    "sgd": 1,
    "muon": 1,
}


_DEFAULT_STATE_ELEMENTS = 2


#: ZeRO-3 keeps up to this many reduce events in flight with ``overlap_comm``
#: (``self.max_param_reduce_events: int = 2`` in stage3.py).
MAX_PARAM_REDUCE_EVENTS = 2


#: Mean overhead of rounding sizes spread log-uniformly up to the next power of two: 1/ln 2.
#: Used where DeepSpeed pins one buffer per parameter and the parameter sizes are unknown.
#: In the crash corpus (760M model, 2 ranks) this predicts 5.42 GB pinned per rank; the
#: kernel's OOM report shows shmem-rss 5.43 GB per rank (pinned_memory_exhaustion/kernel.log).
POW2_ROUNDING_FACTOR = 1 / math.log(2)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def num(value: int | float) -> str:
    """Element counts the way DeepSpeed configs write them: 5e8, 1.2e9, 4096."""
    if value == 0:
        return "0"
    if abs(value) < 100_000:
        return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
    text = f"{Decimal(value):.3g}" if isinstance(value, int) else f"{value:.3g}"
    if "e" not in text:
        text = f"{value:.2e}"
    mantissa, exponent = text.split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}e{int(exponent)}"


def dtype_name(size: int) -> str:
    return {1: "int8", 2: "16-bit", 4: "fp32"}.get(size, f"{size}-byte")


def optimizer_state_elements(effective: EffectiveDsConfig) -> tuple[int, str | None]:
    """State elements per parameter element and, when guessed, the assumption made."""
    name = effective.optimizer.type.value
    if isinstance(name, str) and name.lower() in OPTIMIZER_STATE_ELEMENTS:
        return OPTIMIZER_STATE_ELEMENTS[name.lower()], None
    what = (
        "no optimizer in the config (the client's own)" if name is None else f"optimizer {name!r}"
    )
    return (
        _DEFAULT_STATE_ELEMENTS,
        f"{what}: Adam-like states assumed (2 fp32 values per parameter)",
    )


@dataclass(slots=True)
class Ctx:
    eff: EffectiveDsConfig
    model: ModelSize
    topo: Topology
    comps: list[MemoryComponent] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def add(self, comp: MemoryComponent) -> None:
        if comp.bytes > 0:
            self.comps.append(comp)


def precision_keys(eff: EffectiveDsConfig) -> tuple[str, ...]:
    return (eff.precision.bf16_enabled.key_path, eff.precision.fp16_enabled.key_path)


PINNED_NOTE = (
    "torch's pinned allocator rounds each allocation up to a power of two "
    "(CachingHostAllocator, default settings) and keeps freed blocks cached"
)


def pinned_allocation(num_bytes: int) -> int:
    """Bytes torch's ``CachingHostAllocator`` page-locks for a pinned tensor of ``num_bytes``:
    the next power of two (``c10::llvm::PowerOf2Ceil``) with the default
    ``pinned_max_round_threshold``."""
    if num_bytes <= 0:
        return 0
    return 1 << (num_bytes - 1).bit_length()


def sub_group_sizes(partition: int, sub_group_size: int) -> list[int]:
    """Element counts of the optimizer sub-groups of one rank's ``partition``.

    ``_create_fp16_sub_groups`` closes a sub-group once it holds ``sub_group_size`` elements or
    more, so real sub-groups overshoot by up to one parameter's partition; without parameter
    sizes they are taken as exactly ``sub_group_size`` (last one the remainder)."""
    if partition <= 0:
        return []
    if sub_group_size <= 0 or sub_group_size >= partition:
        return [partition]
    full, rest = divmod(partition, sub_group_size)
    return [sub_group_size] * full + ([rest] if rest else [])
