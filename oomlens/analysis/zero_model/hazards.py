"""Config hazards of ``oomlens check`` that the memory model sizes: buckets or a prefetch working
set too large for the card, pinned buffers the host cannot hold, and the like; and the settings
far above DeepSpeed's defaults that it would size, said even when it cannot (no ``--params``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oomlens.analysis.zero_model.accounting import num
from oomlens.analysis.zero_model.budget import build_budget
from oomlens.analysis.zero_model.patches import with_settings
from oomlens.facts.config import ConfigHazard, ConfigSeverity, EffectiveDsConfig, show_value
from oomlens.facts.memory_model import CapacityVerdict, Device, MemoryBudget
from oomlens.units import format_size

#: ZeRO-3 settings whose memory grows with their value, DeepSpeed's defaults, and the factor
#: above which a value is "far above" it (elements).
_STAGE3_DEFAULTS = (
    ("prefetch_bucket_size", 50_000_000, 10, "the parameters gathered ahead of use"),
    ("max_live_parameters", 1_000_000_000, 10, "the parameters gathered ahead of use"),
    ("max_reuse_distance", 1_000_000_000, 10, "the parameters kept gathered for reuse"),
    ("param_persistence_threshold", 100_000, 100, "the parameters never partitioned"),
)


def far_above_defaults(effective: EffectiveDsConfig) -> list[ConfigHazard]:
    """ZeRO-3 working-set and persistence settings far above DeepSpeed's defaults: a hazard
    whatever the model size (``check`` without ``--params`` still says so)."""
    z = effective.zero
    if z.stage.value != 3:
        return []
    raised = [
        (getattr(z, name), default, what)
        for name, default, factor, what in _STAGE3_DEFAULTS
        if isinstance(getattr(z, name).value, int) and getattr(z, name).value >= factor * default
    ]
    if not raised:
        return []
    said = "; ".join(
        f"{v.key_path} = {show_value(v.value)} is {v.value // default:,}x DeepSpeed's default "
        f"{show_value(default)} ({what})"
        for v, default, what in raised
    )
    return [
        ConfigHazard(
            "far_above_defaults",
            f"{said}: ZeRO-3 may hold far more parameters whole on each GPU than it was meant "
            "to, up to the whole 16-bit model; give --params (and --gpu-memory) to size it",
            ConfigSeverity.MEDIUM,
            tuple(v.key_path for v, _, _ in raised),
            tuple(v.source for v, _, _ in raised if v.source is not None and v.is_explicit),
        )
    ]


# -- hazards with numbers ----------------------------------------------------------------------


def _host_peak_unpinned(effective: EffectiveDsConfig, budget: MemoryBudget) -> int | None:
    """The host peak with ``pin_memory: false`` on every offload block (None: nothing pins)."""
    settings: dict[str, Any] = {}
    for which in ("offload_optimizer", "offload_param"):
        block = getattr(effective.zero, which)
        if block.enabled and block.pin_memory.value:
            settings[f"zero__{which}__pin_memory"] = False
    if not settings:
        return None
    unpinned = build_budget(
        with_settings(effective, **settings),
        budget.model,
        budget.topology,
        budget.activations,
        process_baseline_bytes=budget.process_baseline_bytes,
    )
    return unpinned.host_peak_bytes


#: Above these, a setting is "far above DeepSpeed's default" (elements).
_PREFETCH_DEFAULTS = {
    "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 1_000_000_000,
    "max_reuse_distance": 1_000_000_000,
}


def memory_hazards(
    effective: EffectiveDsConfig,
    budget: MemoryBudget,
    verdicts: Iterable[CapacityVerdict] = (),
) -> list[ConfigHazard]:
    """Hazards that need the memory model: buckets or the prefetch working set too large for
    the card, pinned or total host memory above the host's, model states above the card.

    Codes: ``model_states_too_large``, ``prefetch_overshoot``, ``buckets_exceed_spare``,
    ``gpu_overflow``, ``pinned_memory_exhaustion``, ``host_memory_exhaustion``.  Without
    verdicts only the capacity-free hazard (prefetch knobs far above their defaults with a
    working set above 2 GiB) is reported.
    """
    out: list[ConfigHazard] = []
    by_kind = {v.kind: v for v in verdicts}
    z = effective.zero
    gathered = budget.component("gathered_params")
    gpu = by_kind.get("gpu")
    prefetch_keys = tuple(getattr(z, name).key_path for name in _PREFETCH_DEFAULTS)
    above = [
        getattr(z, name)
        for name, default in _PREFETCH_DEFAULTS.items()
        if int(getattr(z, name).value) > default
    ]
    if gpu is not None:
        usable = gpu.capacity_bytes
        states = budget.gpu_model_states()
        if states > usable:
            out.append(
                ConfigHazard(
                    "model_states_too_large",
                    f"model states alone need {format_size(states)} per GPU (parameters, "
                    "gradients, master "
                    f"weights, optimizer states, bucket) but the card has {format_size(usable)}",
                    ConfigSeverity.HIGH,
                    (
                        z.stage.key_path,
                        z.offload_optimizer.device.key_path,
                        z.offload_param.device.key_path,
                    ),
                    bytes_at_stake=states - usable,
                )
            )
        if gathered is not None and (
            (
                gpu.overflow_component is not None
                and gpu.overflow_component.code == "gathered_params"
            )
            or (above and gathered.bytes > usable // 4)
        ):
            out.append(
                ConfigHazard(
                    "prefetch_overshoot",
                    "the ZeRO-3 gathered-parameter working set can reach "
                    f"{format_size(gathered.bytes)} per GPU "
                    f"({gathered.formula}); the card has {format_size(usable)}"
                    + (f", {format_size(gpu.overflow_bytes)} short" if not gpu.fits else ""),
                    ConfigSeverity.HIGH if not gpu.fits else ConfigSeverity.MEDIUM,
                    prefetch_keys,
                    tuple(v.source for v in above if v.source is not None),
                    bytes_at_stake=gathered.bytes,
                )
            )
        buckets = sum(
            c.bytes
            for c in budget.on(Device.GPU)
            if c.code
            in ("ipg_bucket", "reduce_scatter_buffer", "reduce_in_flight", "allgather_bucket")
        )
        if buckets > usable // 10:
            out.append(
                ConfigHazard(
                    "buckets_exceed_spare",
                    f"communication buckets take {format_size(buckets)} per GPU "
                    f"({100 * buckets / usable:.0f}% of {format_size(usable)})",
                    ConfigSeverity.MEDIUM if not gpu.fits else ConfigSeverity.LOW,
                    (
                        z.reduce_bucket_size.key_path,
                        z.overlap_comm.key_path,
                        z.allgather_bucket_size.key_path,
                    ),
                    bytes_at_stake=buckets,
                )
            )
        if not gpu.fits:
            comp = gpu.overflow_component
            out.append(
                ConfigHazard(
                    "gpu_overflow",
                    f"cannot fit: the GPU needs {format_size(gpu.required_bytes)} at its peak "
                    f"({gpu.peak_phase}) but has {format_size(usable)}; it overflows at "
                    f"'{comp.name if comp else '?'}' during {gpu.overflow_phase}, "
                    f"{format_size(gpu.overflow_bytes)} short"
                    + (
                        ", activations (estimated) included"
                        if budget.component("activations") is not None
                        else ", before any activation memory"
                    ),
                    ConfigSeverity.HIGH,
                    comp.key_paths if comp else (),
                    bytes_at_stake=gpu.overflow_bytes,
                )
            )
    elif gathered is not None and above and gathered.bytes > 2 * 2**30:
        out.append(
            ConfigHazard(
                "prefetch_overshoot",
                f"{', '.join(f'{v.key_path} = {num(int(v.value))}' for v in above)} far above "
                "DeepSpeed's "
                "defaults: the gathered-parameter working set can reach "
                f"{format_size(gathered.bytes)} per GPU",
                ConfigSeverity.LOW,
                prefetch_keys,
                tuple(v.source for v in above if v.source is not None),
                bytes_at_stake=gathered.bytes,
            )
        )
    pinned = by_kind.get("pinned")
    host = by_kind.get("host")
    pinned_bytes = budget.pinned_per_host()
    if pinned is not None and pinned_bytes > 0:
        share = pinned_bytes / pinned.capacity_bytes
        unpinned_peak = _host_peak_unpinned(effective, budget)
        host_short = host is not None and not host.fits
        if not pinned.fits or host_short or share > 0.5:
            keys = (
                z.offload_optimizer.pin_memory.key_path,
                z.offload_param.pin_memory.key_path,
                z.offload_optimizer.device.key_path,
                z.offload_param.device.key_path,
            )
            unpinned_text = ""
            if unpinned_peak is not None:
                fits = unpinned_peak <= pinned.capacity_bytes
                unpinned_text = (
                    f"; with pin_memory false the host would peak at {format_size(unpinned_peak)}"
                    + (" and fit" if fits else ", still too much")
                )
            out.append(
                ConfigHazard(
                    "pinned_memory_exhaustion",
                    f"offload pins {format_size(pinned_bytes)} of host memory per host "
                    f"({budget.topology.ranks_per_host} ranks), {100 * share:.0f}% of "
                    f"{format_size(pinned.capacity_bytes)}: pinned pages cannot be swapped or "
                    "reclaimed, and torch rounds each pinned buffer up to a power of two"
                    + unpinned_text,
                    ConfigSeverity.HIGH
                    if (not pinned.fits or host_short)
                    else ConfigSeverity.MEDIUM,
                    keys,
                    bytes_at_stake=pinned_bytes,
                )
            )
    if host is not None and not host.fits:
        comp = host.overflow_component
        out.append(
            ConfigHazard(
                "host_memory_exhaustion",
                f"host memory: {format_size(host.required_bytes)} needed per host at its peak "
                f"({host.peak_phase}) "
                f"but {format_size(host.capacity_bytes)} available; overflows at "
                f"'{comp.name if comp else '?'}' "
                f"during {host.overflow_phase} (expect the kernel OOM killer: exit code -9)",
                ConfigSeverity.HIGH,
                comp.key_paths if comp else (),
                bytes_at_stake=host.overflow_bytes,
            )
        )
    return out
