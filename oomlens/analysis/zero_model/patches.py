"""Config changes that would shrink what overflows, each with its saving predicted by the
budget itself: the budget is rebuilt with the change and the peaks compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from oomlens.analysis.config_patch import make_patch
from oomlens.analysis.zero_model.accounting import ceil_div
from oomlens.analysis.zero_model.budget import build_budget
from oomlens.analysis.zero_model.timeline import gpu_peak, phase_of_step
from oomlens.facts.config import ConfigValue, EffectiveDsConfig, Origin, Precision
from oomlens.facts.memory_model import (
    DEFAULT_PROCESS_BASELINE_BYTES,
    ActivationShape,
    BudgetPhase,
    Capacity,
    CapacityVerdict,
    ConfigChange,
    ConfigPatch,
    Device,
    MemoryBudget,
    ModelSize,
    Topology,
)

# -- changing the config -----------------------------------------------------------------------


def with_settings(effective: EffectiveDsConfig, **settings: Any) -> EffectiveDsConfig:
    """``effective`` with some settings replaced (``zero__stage=3``,
    ``zero__offload_optimizer__device="cpu"``, ``precision__bf16_enabled=True``): the value
    changes, key path and the rest stay, origin becomes USER.  For predicting a patch."""
    result = effective
    for name, value in settings.items():
        path = name.split("__")
        result = _replace_path(result, path, value)
    return result


def _replace_path(obj: Any, path: list[str], value: Any) -> Any:
    current = getattr(obj, path[0])
    if len(path) == 1:
        assert isinstance(current, ConfigValue)
        new = ConfigValue(value, current.key_path, Origin.USER, current.source, "proposed")
        return replace(obj, **{path[0]: new})
    return replace(obj, **{path[0]: _replace_path(current, path[1:], value)})


@dataclass(frozen=True, slots=True)
class PatchEffect:
    """A patch and its predicted effect under this memory model."""

    patch: ConfigPatch
    gpu_peak_before: int
    gpu_peak_after: int
    host_peak_before: int
    host_peak_after: int
    pinned_before: int
    pinned_after: int


def _predict(
    effective: EffectiveDsConfig,
    model: ModelSize,
    topology: Topology,
    changes: list[ConfigChange],
    settings: dict[str, Any],
    summary: str,
    cost: str,
    before: MemoryBudget,
    focus: str | None = None,
) -> ConfigPatch | None:
    after = build_budget(
        with_settings(effective, **settings),
        model,
        topology,
        before.activations,
        process_baseline_bytes=before.process_baseline_bytes,
    )
    return make_patch(
        effective,
        changes,
        summary=summary,
        cost=cost,
        gpu_bytes_saved=gpu_peak(before, focus) - gpu_peak(after, focus),
        host_bytes_delta=after.host_peak_bytes - before.host_peak_bytes,
        pinned_bytes_delta=after.pinned_per_host() - before.pinned_per_host(),
    )


def _offload_changes(effective: EffectiveDsConfig, which: str, **fields: Any) -> list[ConfigChange]:
    """Changes to ``zero_optimization.<which>.*``, removing the deprecated key that set it (a
    deprecated key next to its replacement makes DeepSpeed refuse the config)."""
    offload = getattr(effective.zero, which)
    changes: list[ConfigChange] = []
    device = offload.device
    prefix = f"zero_optimization.{which}"
    if device.origin is Origin.DEPRECATED_KEY:
        changes.append(ConfigChange(device.key_path, None))
        if "device" not in fields:
            changes.append(ConfigChange(f"{prefix}.device", device.value))
    for name, value in fields.items():
        current = getattr(offload, name)
        key = current.key_path if current.key_path.startswith(prefix) else f"{prefix}.{name}"
        changes.append(ConfigChange(key, value))
    return changes


def _round_down(value: int) -> int:
    """A round element count not above ``value`` (1 or 2 or 5 times a power of ten)."""
    if value <= 0:
        return 0
    power: int = 10 ** int(math.floor(math.log10(value)))
    for mult in (5, 2, 1):
        if mult * power <= value:
            return mult * power
    return power


PatchBuilder = Callable[
    [EffectiveDsConfig, ModelSize, Topology, MemoryBudget, "Capacity | None", "str | None"],
    "ConfigPatch | None",
]


def patch_offload_optimizer(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """Move optimizer states, fp32 master weights and gradient partitions to the CPU."""
    if int(eff.zero.stage.value) < 1 or eff.zero.offload_optimizer.enabled:
        return None
    changes = _offload_changes(eff, "offload_optimizer", device="cpu")
    client_optimizer = eff.optimizer.type.value is None
    if client_optimizer and eff.optimizer.zero_force_ds_cpu_optimizer.value:
        # DeepSpeed refuses a client's own optimizer with the optimizer offloaded unless told
        # otherwise (engine._configure_basic_optimizer raises ZeRORuntimeException "You are
        # using ZeRO-Offload with a client provided optimizer"): Lightning and scripts that
        # pass a torch optimizer would not start.
        changes.append(ConfigChange("zero_force_ds_cpu_optimizer", False))
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__offload_optimizer__device": "cpu"},
        "offload the optimizer to the CPU"
        + (
            " (the client's own optimizer allowed: DeepSpeedCPUAdam is faster)"
            if client_optimizer
            else ""
        ),
        "the optimizer step runs on the CPU (DeepSpeedCPUAdam): slower steps, more host RAM",
        before,
        focus,
    )


def patch_offload_params(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """Keep the 16-bit parameter partitions on the CPU (stage 3 only)."""
    if int(eff.zero.stage.value) != 3 or eff.zero.offload_param.enabled:
        return None
    changes = _offload_changes(eff, "offload_param", device="cpu")
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__offload_param__device": "cpu"},
        "offload the parameters to the CPU",
        "every gather copies parameters from host memory: much slower forward/backward",
        before,
        focus,
    )


def patch_no_param_offload(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """Bring the parameters back to the GPU (host RAM pressure with both offloads)."""
    if not eff.zero.offload_param.enabled:
        return None
    changes = _offload_changes(eff, "offload_param", device="none")
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__offload_param__device": "none"},
        "keep the parameters on the GPU (offload the optimizer only)",
        "needs the GPU memory for the parameter partitions; faster",
        before,
        focus,
    )


def patch_unpin(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """``pin_memory: false`` on the offload blocks that pin."""
    settings: dict[str, Any] = {}
    changes: list[ConfigChange] = []
    for which in ("offload_optimizer", "offload_param"):
        offload = getattr(eff.zero, which)
        if offload.enabled and offload.pin_memory.value:
            changes += _offload_changes(eff, which, pin_memory=False)
            settings[f"zero__{which}__pin_memory"] = False
    if not changes:
        return None
    return _predict(
        eff,
        model,
        topo,
        changes,
        settings,
        "stop pinning offload buffers",
        "pageable host memory: slower host<->GPU copies, no overlap of offload with compute "
        "(the parameter flat buffer stays pinned whatever the setting)",
        before,
        focus,
    )


def patch_prefetch(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """Shrink ``stage3_prefetch_bucket_size`` / ``max_live_parameters`` / ``max_reuse_distance``:
    to DeepSpeed's defaults (or HF's hidden-size values) when above them, and further down to
    what fits the GPU capacity when it is known."""
    z = eff.zero
    if int(z.stage.value) != 3:
        return None
    gathered = before.component("gathered_params")
    if gathered is None:
        return None
    hidden = model.hidden_size
    targets = {
        "prefetch_bucket_size": int(0.9 * hidden * hidden) if hidden else 50_000_000,
        "max_live_parameters": 1_000_000_000,
        "max_reuse_distance": 1_000_000_000,
    }
    if capacity is not None and capacity.gpu_bytes is not None:
        usable = capacity.gpu_bytes - capacity.gpu_reserved_bytes
        others = before.gpu_peak_bytes - gathered.bytes
        room = max(0, (usable - others) // before.precision.element_size)
        current = model.largest_layer_params or 0
        fit = _round_down(max(0, int((room - current) / 1.5 * 0.8)))
        for key in targets:
            targets[key] = min(targets[key], fit)
    settings: dict[str, Any] = {}
    changes: list[ConfigChange] = []
    for name, target in targets.items():
        value: ConfigValue[Any] = getattr(z, name)
        if int(value.value) > target:
            settings[f"zero__{name}"] = target
            changes.append(ConfigChange(value.key_path, target))
    if not changes:
        return None
    return _predict(
        eff,
        model,
        topo,
        changes,
        settings,
        "gather fewer parameters ahead of use",
        "less overlap of all-gathers with compute: slower forward/backward",
        before,
        focus,
    )


def patch_persistence(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """``stage3_param_persistence_threshold`` back to DeepSpeed's default (HF's 10 x hidden
    size when known), when the budget keeps parameters whole because of it."""
    z = eff.zero
    if int(z.stage.value) != 3 or before.component("persistent_params") is None:
        return None
    hidden = model.hidden_size
    target = 10 * hidden if hidden else 100_000
    if int(z.param_persistence_threshold.value) <= target:
        return None
    changes = [ConfigChange(z.param_persistence_threshold.key_path, target)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__param_persistence_threshold": target},
        "partition the parameters the persistence threshold keeps whole",
        "small parameters are gathered at each use again: more, smaller all-gathers",
        before,
        focus,
    )


def patch_reduce_bucket(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """A smaller ``reduce_bucket_size`` (HF's hidden_size**2 when known, else 5e7)."""
    z = eff.zero
    hidden = model.hidden_size
    target = hidden * hidden if hidden else 50_000_000
    if int(z.reduce_bucket_size.value) <= target:
        return None
    changes = [ConfigChange(z.reduce_bucket_size.key_path, target)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__reduce_bucket_size": target},
        "reduce gradients in smaller buckets",
        "more, smaller reduce-scatters: slightly slower backward",
        before,
        focus,
    )


def patch_sub_group(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """A smaller ``sub_group_size`` (1e8) when the largest sub-group is above it."""
    z = eff.zero
    target = 100_000_000
    partition = ceil_div(model.trainable, topo.world_size)
    if int(z.stage.value) != 3 or int(z.sub_group_size.value) <= target or partition <= target:
        return None
    changes = [ConfigChange(z.sub_group_size.key_path, target)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__sub_group_size": target},
        "process the optimizer step in smaller sub-groups",
        "more, smaller optimizer kernel launches / swaps: slightly slower step",
        before,
        focus,
    )


def patch_overlap_comm(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """``overlap_comm: false`` (stages 1/2: one IPG buffer instead of two)."""
    z = eff.zero
    if not z.overlap_comm.value or int(z.stage.value) == 0:
        return None
    changes = [ConfigChange(z.overlap_comm.key_path, False)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__overlap_comm": False},
        "stop overlapping gradient reduction",
        "reduction no longer overlaps backward: slower",
        before,
        focus,
    )


def patch_stage3(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """ZeRO stage 3 (partition the parameters too)."""
    z = eff.zero
    if int(z.stage.value) == 3 or topo.world_size == 1:
        return None
    changes = [
        ConfigChange(
            z.stage.key_path
            if z.stage.key_path.startswith("zero_optimization.")
            else "zero_optimization.stage",
            3,
        )
    ]
    settings: dict[str, Any] = {"zero__stage": 3}
    if z.overlap_comm.origin is Origin.DERIVED:
        settings["zero__overlap_comm"] = True
    return _predict(
        eff,
        model,
        topo,
        changes,
        settings,
        "partition parameters, gradients and optimizer states (ZeRO-3)",
        "parameters are all-gathered every forward/backward: more communication; build the model "
        "under zero.Init",
        before,
        focus,
    )


def patch_bf16(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """Enable bf16 when the config trains in fp32."""
    prec = eff.precision
    if prec.fp16_enabled.value or prec.bf16_enabled.value or prec.torch_autocast_enabled.value:
        return None
    key = prec.bf16_enabled.key_path
    changes = [ConfigChange(key, True)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"precision__bf16_enabled": True},
        "train in bf16 (16-bit parameters and gradients)",
        "bf16 numerics (needs Ampere or newer); fp32 master weights are kept",
        before,
        focus,
    )


def patch_allgather_sequential(
    eff: EffectiveDsConfig,
    model: ModelSize,
    topo: Topology,
    before: MemoryBudget,
    capacity: Capacity | None = None,
    focus: str | None = None,
) -> ConfigPatch | None:
    """``stage3_allgather_sequential: true`` (DeepSpeed >= 0.18.5; the engine then sets the
    prefetch bucket to 1)."""
    z = eff.zero
    if int(z.stage.value) != 3 or z.allgather_sequential.value:
        return None
    key = z.allgather_sequential.key_path
    changes = [ConfigChange(key, True)]
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__allgather_sequential": True},
        "all-gather parameters one at a time, without prefetch",
        "no prefetch and per-parameter all-gathers: slower forward/backward",
        before,
        focus,
    )


ALL_PATCH_BUILDERS: tuple[PatchBuilder, ...] = (
    patch_persistence,
    patch_prefetch,
    patch_allgather_sequential,
    patch_reduce_bucket,
    patch_overlap_comm,
    patch_sub_group,
    patch_offload_optimizer,
    patch_offload_params,
    patch_stage3,
    patch_bf16,
    patch_unpin,
    patch_no_param_offload,
)

#: Which patches address which overflowing component.
PATCHES_FOR_COMPONENT: dict[str, tuple[PatchBuilder, ...]] = {
    "gathered_params": (patch_prefetch, patch_allgather_sequential, patch_offload_optimizer),
    "module_grads": (patch_offload_optimizer, patch_offload_params),
    "reduce_scatter_buffer": (patch_reduce_bucket,),
    "reduce_in_flight": (patch_reduce_bucket, patch_overlap_comm),
    "ipg_bucket": (patch_reduce_bucket, patch_overlap_comm),
    "step_fp32_grads": (patch_sub_group, patch_offload_optimizer),
    "init_fp32_grad_buffer": (patch_sub_group, patch_offload_optimizer),
    "optimizer_states": (patch_offload_optimizer, patch_stage3, patch_offload_params),
    "fp32_master": (patch_offload_optimizer, patch_stage3),
    "grad_partition": (patch_offload_optimizer, patch_stage3),
    "grads": (patch_stage3, patch_offload_optimizer),
    "param_partition": (patch_offload_params, patch_offload_optimizer),
    "param_full": (patch_stage3, patch_bf16),
    "persistent_params": (patch_persistence, patch_offload_optimizer),
    "hpz_secondary": (),
    "allgather_bucket": (),
}
_HOST_PATCHES: tuple[PatchBuilder, ...] = (patch_unpin, patch_no_param_offload, patch_sub_group)


def candidate_patches(
    effective: EffectiveDsConfig,
    model: ModelSize,
    topology: Topology,
    capacity: Capacity | None = None,
    *,
    verdicts: Iterable[CapacityVerdict] = (),
    phase: str | None = None,
    activations: ActivationShape | None = None,
    process_baseline_bytes: int = DEFAULT_PROCESS_BASELINE_BYTES,
) -> list[ConfigPatch]:
    """Config changes worth proposing: those that shrink the component a failing verdict
    blames first, then the others; most memory saved first within each group.

    ``gpu_bytes_saved`` is measured at ``phase`` (``"engine init"``, ``"forward/backward"``,
    ``"optimizer step"`` - the phase the OOM happened in, when the log tells), else at the
    phase where a GPU verdict overflows, else at the overall peak.  With ``verdicts``, only the
    changes that address an overflowing component (GPU) or host/pinned memory are returned,
    and only those predicted to reduce it; without, every applicable change that saves
    something.  None re-proposes a value in force (``make_patch``).
    """
    before = build_budget(
        effective, model, topology, activations, process_baseline_bytes=process_baseline_bytes
    )
    chosen: list[PatchBuilder] = []
    verdict_list = [v for v in verdicts if not v.fits]
    focus = phase
    if verdict_list:
        for verdict in verdict_list:
            if verdict.kind == "gpu":
                # Every GPU component in play at the overflowing step may be shrunk; the
                # predicted savings decide the order.
                step = verdict.overflow_phase or ""
                in_play = {
                    c.code
                    for c in before.on(Device.GPU)
                    if c.phase is BudgetPhase.PERSISTENT or phase_of_step(step) == c.phase.value
                }
                for code in sorted(in_play):
                    chosen += PATCHES_FOR_COMPONENT.get(code, ())
                if before.precision is Precision.FP32:
                    chosen.append(patch_bf16)
                if focus is None and verdict.overflow_phase:
                    focus = phase_of_step(verdict.overflow_phase)
            else:
                chosen += _HOST_PATCHES
    else:
        chosen = list(ALL_PATCH_BUILDERS)
    # Patches that shrink the component a verdict blames come first.
    primary: set[int] = {
        id(builder)
        for v in verdict_list
        if v.kind == "gpu" and v.overflow_component is not None
        for builder in PATCHES_FOR_COMPONENT.get(v.overflow_component.code, ())
    }
    if any(v.kind in ("host", "pinned") for v in verdict_list) and before.pinned_per_host() > 0:
        primary.add(id(patch_unpin))  # pinned pages are what a host cannot reclaim
    seen: set[int] = set()
    ranked: list[tuple[bool, int, ConfigPatch]] = []
    for builder in chosen:
        if id(builder) in seen:
            continue
        seen.add(id(builder))
        patch = builder(effective, model, topology, before, capacity, focus)
        if patch is None:
            continue
        saves = (
            (patch.gpu_bytes_saved or 0) > 0
            or (patch.host_bytes_delta or 0) < 0
            or (patch.pinned_bytes_delta or 0) < 0
        )
        if not saves:
            continue
        if verdict_list:
            kinds = {v.kind for v in verdict_list}
            helps_gpu = "gpu" in kinds and (patch.gpu_bytes_saved or 0) > 0
            helps_host = "host" in kinds and (patch.host_bytes_delta or 0) < 0
            helps_pinned = "pinned" in kinds and (patch.pinned_bytes_delta or 0) < 0
            if not (helps_gpu or helps_host or helps_pinned):
                continue
        gpu_failing = any(v.kind == "gpu" for v in verdict_list) or not verdict_list
        saving = (patch.gpu_bytes_saved or 0) if gpu_failing else -(patch.host_bytes_delta or 0)
        ranked.append((id(builder) not in primary, -saving, patch))
    ranked.sort(key=lambda item: (item[0], item[1]))
    patches = [patch for _, _, patch in ranked]
    return patches
