"""Named thresholds the rules use, with defaults, overridable from a TOML settings file.

A settings file is data, never code::

    [thresholds]
    fragmentation_min_unallocated_fraction = 0.2
    leak_min_steps = 8

Unknown names and values of the wrong type are refused with a ``UsageError`` naming the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from oomlens.errors import UsageError
from oomlens.ingest.files import not_regular_problem

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every number a rule compares against. Fractions are of the memory limit in force
    (``allowed`` when a per-process fraction is set, else the card's capacity)."""

    fragmentation_min_unallocated_fraction: float = 0.20
    """Reserved-but-unallocated bytes at the OOM, as a fraction of the limit, above which the
    allocator's caching is a suspect."""
    fragmentation_min_unallocated_bytes: int = 512 * MIB
    """...and at least this many bytes (tiny cards make fractions noisy)."""
    capacity_near_full_fraction: float = 0.85
    """Allocated bytes above this fraction of the limit: the tensors themselves fill the card."""
    other_process_min_fraction: float = 0.10
    """Other processes holding more than this fraction of the card are a cause."""
    non_pytorch_self_max_bytes: int = 3 * GIB
    """This process' memory outside PyTorch's allocator (context, NCCL, other libraries)
    above this is worth a finding."""
    leak_min_samples: int = 6
    """Memory samples (steps) needed before growth can be called a leak."""
    leak_min_growth_bytes_per_sample: int = 4 * MIB
    leak_min_total_growth_fraction: float = 0.10
    """Total growth over the series, as a fraction of the limit."""
    leak_min_total_growth_bytes: int = 512 * MIB
    """...or, when the limit is unknown, at least this many bytes."""
    leak_linearity_tolerance: float = 0.4
    """The growth may differ from slope x samples by this fraction (a leak grows about the same
    every step; a one-time jump does not fit a line)."""
    leak_end_tolerance: float = 0.03
    """The series must end within this fraction of its maximum and start within it of its
    minimum (a warm-up that levels off, or a drop at the end, is not a leak)."""
    leak_min_piled_fraction: float = 0.10
    """In a snapshot, equal blocks from one call site holding this fraction of live memory are
    the kept objects of a leak seen elsewhere."""
    prefetch_overshoot_factor: float = 4.0
    """A stage-3 working-set knob this many times its DeepSpeed default is 'raised'."""
    gathered_params_min_fraction: float = 0.25
    """Gathered ZeRO-3 parameters holding this fraction of live memory (snapshot) fill the card."""
    activations_min_fraction: float = 0.5
    """Memory allocated in forward passes holding this fraction of live memory (snapshot):
    activations dominate."""
    model_states_min_fraction: float = 0.7
    """Parameters, gradients and optimizer state holding this fraction of live memory
    (snapshot) fill the card..."""
    model_states_max_fraction: float = 0.3
    """...and below this fraction they do not explain an OOM in the optimizer step."""
    model_states_against_activations_fraction: float = 0.6
    """Model states holding this fraction of live memory speak against activations."""
    model_states_snapshot_fraction: float = 0.5
    """A snapshot-only optimizer-state OOM with model states at this fraction or more."""
    others_dominate_fraction: float = 0.5
    """Other processes holding this fraction of the card: they, not this process, filled it."""
    other_process_self_match_bytes: int = 2 * GIB
    """One listed process within this of what PyTorch reserved is this process under its host
    pid (containers), not another one."""
    other_process_unlisted_fraction: float = 0.25
    """Memory on the card that neither this process' allocator nor a listed process accounts
    for (capacity - reserved - free, messages that list no process), above this fraction of the
    card: held by another process more likely than by this process' own context and libraries."""
    other_process_unlisted_min_bytes: int = 3 * GIB // 2
    """...and at least this many bytes: below it, a CUDA context (0.3-0.7 GiB) plus a desktop's
    display and libraries' workspaces."""
    context_min_fraction: float = 0.12
    """Memory outside the allocator (context, libraries, display) taking this fraction of a
    card, when the request would have fit without it, is worth naming on its own..."""
    context_min_bytes: int = 768 * MIB
    """...when it is at least this large (a bare CUDA context is 0.3-0.7 GiB)."""
    own_tensors_min_fraction: float = 0.7
    """Live tensors holding this fraction of what the process could reach (its allocator's
    holdings plus the free memory): the process' own demand filled the card."""
    oversized_near_card_fraction: float = 0.9
    """A single request of this fraction of the card or more, with little allocated, is nearly
    the whole card in one tensor: suspect the shape before the memory settings."""
    small_model_max_bytes: int = 2 * GIB
    """A model whose fp32 weights are under this cannot have filled a training GPU by itself
    before its first step."""
    host_memory_pressure_fraction: float = 0.8
    """The node's memory in use (DeepSpeed's CPU Virtual Memory percent) at or above this just
    before a worker died silently points at the OOM killer."""
    min_confidence_to_report: float = 0.15
    """Diagnoses below this confidence are dropped from the report."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def load_thresholds(path: str | Path | None) -> Thresholds:
    """Defaults, overridden by the ``[thresholds]`` table of the TOML file at ``path``."""
    defaults = Thresholds()
    if path is None:
        return defaults
    shown = str(path)
    special = not_regular_problem(path, "a settings file")
    if special is not None:
        raise UsageError(f"{shown}: {special}")
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read the settings file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{shown}: not valid TOML ({exc}); fix the file or leave it out") from exc
    table = data.get("thresholds", {})
    if not isinstance(table, dict):
        raise UsageError(f"{shown}: [thresholds] must be a table of name = number")
    known = {f.name: f.type for f in fields(Thresholds)}
    changes: dict[str, Any] = {}
    for name, value in table.items():
        if name not in known:
            raise UsageError(
                f"{shown}: unknown threshold {name!r}; known: {', '.join(sorted(known))}"
            )
        default = getattr(defaults, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{shown}: threshold {name} must be a number, got {value!r}")
        if isinstance(default, int) and not isinstance(value, int):
            raise UsageError(f"{shown}: threshold {name} must be a whole number, got {value!r}")
        if value < 0:
            raise UsageError(f"{shown}: threshold {name} must not be negative, got {value!r}")
        changes[name] = type(default)(value)
    return replace(defaults, **changes)
