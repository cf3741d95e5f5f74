"""The ZeRO memory model: what a DeepSpeed config costs per GPU and per host, and what a config
change would save.

Inputs: the effective config (``oomlens.facts.config``), the model size (total, trainable and
largest-layer parameter counts) and the topology (data-parallel ranks, ranks per host).
Output: a ``MemoryBudget`` - a list of ``MemoryComponent``, each with its bytes, the formula and
config keys that drive it, the phase it lives in and how sure the number is (``Basis``):

* ``CODE``: an allocation DeepSpeed 0.19.8 makes with exactly this size (``stage3.py``:
  ``grad_partitions_flat_buffer``, the IPG bucket ``torch.empty(reduce_bucket_size)``, the fp32
  partitions, the pinned CPU buffers...);
* ``BOUND``: an upper bound inferred from the code (the gathered-parameter working set under
  ``stage3_prefetch_bucket_size`` / ``max_live_parameters`` / ``max_reuse_distance``, gradients
  waiting for an in-flight reduce);
* ``ESTIMATE``: a coarser reading (ZeRO stages 0-2, optimizer state sizes for optimizers
  oomlens does not know).

Activations, the CUDA context and allocator fragmentation are outside the model: the budget
says what remains for them.  ``compare_with_capacity`` walks the allocations in the order
DeepSpeed makes them (engine init, first forward/backward, first optimizer step - when Adam
states are created -, later forward/backward passes) and names the component at which the card
or the host overflows and by how much.  ``candidate_patches`` builds the config changes that
would shrink the overflowing part, each with its predicted saving from this same model.

DeepSpeed's own estimators (``estimate_zero3_model_states_mem_needs``,
``estimate_zero2_model_states_mem_needs``) are restated in ``deepspeed_zero3_estimate`` and
``deepspeed_zero2_estimate`` and shown next to the budget as a cross-check; the tests pin both
against the installed DeepSpeed.  They differ from the component model by design: they count
18 bytes per parameter for model states, +4x the largest layer, and a 1.5 host buffer factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from oomlens.analysis.config_patch import ConfigChange, ConfigPatch, make_patch
from oomlens.facts import SourceRef
from oomlens.facts.config import (
    ConfigHazard,
    ConfigValue,
    EffectiveDsConfig,
    Origin,
    Precision,
    Severity,
)
from oomlens.units import format_size

#: Adam's ``exp_avg`` and ``exp_avg_sq``: state elements per parameter element, by optimizer.
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

#: Host memory a training rank uses outside DeepSpeed's buffers (Python, torch and CUDA
#: libraries, the CUDA context's host side, page cache).  Measured in the crash corpus (torch
#: 2.11, CUDA 13, DeepSpeed 0.19.8): checkpoint_save_host_oom's cgroup peak during engine init,
#: 5,053,739,008 B for 2 ranks, minus the 2 x 1.34 GB defragment copies = 1.19 GB per rank.
#: Runs with the optimizer offloaded to DeepSpeedCPUAdam measured 1.76-1.87 GB per rank.
DEFAULT_PROCESS_BASELINE_BYTES = 1_200_000_000


class Device(Enum):
    GPU = "gpu"
    HOST = "host"


class Phase(Enum):
    """When a component exists."""

    PERSISTENT = "persistent"
    """From engine init on (or, for optimizer states, from the first step on)."""
    INIT = "engine init"
    """Only while ``deepspeed.initialize`` builds the optimizer."""
    FORWARD_BACKWARD = "forward/backward"
    OPTIMIZER_STEP = "optimizer step"
    CHECKPOINT_SAVE = "checkpoint save"


class Basis(Enum):
    CODE = "code"
    BOUND = "bound"
    ESTIMATE = "estimate"


@dataclass(frozen=True, slots=True)
class ModelSize:
    """Parameter counts (elements).  ``trainable_params`` defaults to ``total_params``;
    ``largest_layer_params`` (the biggest module's own parameters: often the embedding) is what
    one module gather needs - unknown means the current-module term is left out.
    ``source`` says where the numbers come from (``--params``, the log's
    ``finished initializing model`` line, a snapshot)."""

    total_params: int
    trainable_params: int | None = None
    largest_layer_params: int | None = None
    hidden_size: int | None = None
    source: str = ""
    source_ref: SourceRef | None = None

    @property
    def trainable(self) -> int:
        return self.total_params if self.trainable_params is None else self.trainable_params


@dataclass(frozen=True, slots=True)
class ActivationShape:
    """What activation memory depends on, for the optional activation estimate (outside
    ds_config, so only when the caller knows it).  ``micro_batch`` is the per-GPU micro batch
    (the config's, or what DeepSpeed derives); ``flash_attention`` drops the attention-score
    term (SDPA/flash kernels do not store it); ``checkpointing`` is full activation
    checkpointing of every layer."""

    micro_batch: int
    seq_len: int
    hidden_size: int
    layers: int
    vocab_size: int | None = None
    heads: int | None = None
    flash_attention: bool = True
    checkpointing: bool = False


@dataclass(frozen=True, slots=True)
class Topology:
    """``world_size``: ranks in the ZeRO partition group (the data-parallel size);
    ``gpus_per_node``: ranks per host (they share its RAM and pinned memory)."""

    world_size: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.gpus_per_node < 1:
            raise ValueError("world_size and gpus_per_node must be at least 1")

    @property
    def nodes(self) -> int:
        return math.ceil(self.world_size / self.gpus_per_node)

    @property
    def ranks_per_host(self) -> int:
        return min(self.gpus_per_node, self.world_size)


@dataclass(frozen=True, slots=True)
class MemoryComponent:
    """One allocation class.  ``bytes`` is per GPU for ``Device.GPU`` and per rank for
    ``Device.HOST`` (a host holds ``Topology.ranks_per_host`` of them) unless ``per_host``.
    ``formula`` shows the arithmetic; ``key_paths`` the config keys that drive it."""

    code: str
    name: str
    device: Device
    phase: Phase
    bytes: int
    formula: str
    key_paths: tuple[str, ...] = ()
    pinned: bool = False
    basis: Basis = Basis.CODE
    per_host: bool = False
    note: str = ""
    requested_bytes: int | None = None
    """For pinned buffers: what DeepSpeed asks to pin (what its ``[pinned-memory ...]`` log
    lines count), before torch's allocator rounds it up; None when equal to ``bytes``."""


@dataclass(frozen=True, slots=True)
class EstimatorCrossCheck:
    """DeepSpeed's own estimator for this stage/offload/topology (``None`` fields: it has no
    number for this case).  ``host_bytes`` is per node, ``gpu_bytes`` per GPU."""

    function: str
    arguments: str
    gpu_bytes: int | None
    host_bytes: int | None


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Every component for one config, model and topology, with the assumptions made."""

    stage: int
    precision: Precision
    model: ModelSize
    topology: Topology
    components: tuple[MemoryComponent, ...]
    assumptions: tuple[str, ...] = ()
    estimator: EstimatorCrossCheck | None = None
    activations: ActivationShape | None = None
    process_baseline_bytes: int = DEFAULT_PROCESS_BASELINE_BYTES

    def on(self, device: Device, phase: Phase | None = None) -> list[MemoryComponent]:
        return [
            c for c in self.components if c.device is device and (phase is None or c.phase is phase)
        ]

    def component(self, code: str) -> MemoryComponent | None:
        return next((c for c in self.components if c.code == code), None)

    def gpu_peak(self, phase: str | None = None) -> int:
        """The GPU peak, over the whole timeline or within one step of it (``"engine init"``,
        ``"forward/backward"``, ``"optimizer step"``)."""
        if phase is None:
            return _walk(_gpu_timeline(self), None).peak
        return gpu_phase_totals(self)[phase]

    def host_peak(self) -> int:
        return _walk(_host_timeline(self), None).peak

    def pinned_per_host(self) -> int:
        """Page-locked host memory of one host (all its ranks), at its largest (init included)."""
        total = 0
        for comp in self.components:
            if comp.device is Device.HOST and comp.pinned:
                total += comp.bytes if comp.per_host else comp.bytes * self.topology.ranks_per_host
        return total

    def pinned_requested_per_rank(self) -> int:
        """Pinned bytes one rank asks for (DeepSpeed's ``pin_memory_tracker`` total), before
        torch's power-of-two rounding."""
        return sum(
            c.bytes if c.requested_bytes is None else c.requested_bytes
            for c in self.components
            if c.device is Device.HOST and c.pinned and not c.per_host
        )

    def gpu_model_states(self) -> int:
        """Persistent GPU bytes: parameters, gradients, master weights, optimizer states, bucket."""
        return sum(c.bytes for c in self.on(Device.GPU, Phase.PERSISTENT))


# -- the model ---------------------------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _num(value: int | float) -> str:
    """Element counts the way DeepSpeed configs write them: 5e8, 1.2e9, 4096."""
    if value == 0:
        return "0"
    if abs(value) < 100_000:
        return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
    text = f"{value:.3g}"
    if "e" not in text:
        text = f"{value:.2e}"
    mantissa, exponent = text.split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}e{int(exponent)}"


def _dtype_name(size: int) -> str:
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


def build_budget(
    effective: EffectiveDsConfig,
    model: ModelSize,
    topology: Topology,
    activations: ActivationShape | None = None,
    *,
    process_baseline_bytes: int = DEFAULT_PROCESS_BASELINE_BYTES,
) -> MemoryBudget:
    """The per-GPU and per-host memory components of ``effective`` for ``model`` on ``topology``.

    Assumes ``zero.Init`` is used at stage 3 (the model is built partitioned); says so in
    ``assumptions``, with every other guess made.  With ``activations``, a forward/backward
    activation estimate (basis ``ESTIMATE``) is added; without, activations are left out and
    the GPU headroom is what remains for them.
    """
    if model.total_params <= 0:
        raise ValueError("total_params must be positive")
    stage = int(effective.zero.stage.value)
    if stage == 3:
        comps, assumptions = _stage3(effective, model, topology)
    else:
        comps, assumptions = _stage012(effective, model, topology, stage)
    if activations is not None:
        comps += _activation_components(activations, effective.precision.param_bytes)
    if process_baseline_bytes > 0:
        comps.insert(
            0,
            MemoryComponent(
                "host_process_baseline",
                "process baseline (Python, torch/CUDA libraries, page cache)",
                Device.HOST,
                Phase.PERSISTENT,
                process_baseline_bytes,
                f"{_num(process_baseline_bytes)} B per rank",
                basis=Basis.ESTIMATE,
                note="measured on torch 2.11 / CUDA 13; set it for other environments",
            ),
        )
    return MemoryBudget(
        stage=stage,
        precision=effective.precision.model_precision,
        model=model,
        topology=topology,
        components=tuple(comps),
        assumptions=tuple(assumptions),
        estimator=_estimator_for(effective, model, topology),
        activations=activations,
        process_baseline_bytes=process_baseline_bytes,
    )


@dataclass(slots=True)
class _Ctx:
    eff: EffectiveDsConfig
    model: ModelSize
    topo: Topology
    comps: list[MemoryComponent] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def add(self, comp: MemoryComponent) -> None:
        if comp.bytes > 0:
            self.comps.append(comp)


def _precision_keys(eff: EffectiveDsConfig) -> tuple[str, ...]:
    return (eff.precision.bf16_enabled.key_path, eff.precision.fp16_enabled.key_path)


def _stage3(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology
) -> tuple[list[MemoryComponent], list[str]]:
    ctx = _Ctx(eff, model, topo)
    z = eff.zero
    prec = eff.precision
    n = topo.world_size
    e = prec.param_bytes
    e_g = prec.grad_accum_bytes
    e_c = prec.comm_bytes
    p_all = _ceil_div(model.total_params, n)
    p_tr = _ceil_div(model.trainable, n)
    largest = model.largest_layer_params
    master_bytes = (
        2
        if (prec.bf16_master_weights_and_grads.value or prec.fp16_master_weights_and_grads.value)
        else 4
    )
    state_elems, state_guess = optimizer_state_elements(eff)
    if state_guess:
        ctx.assumptions.append(state_guess)
    state_bytes = 2 if prec.bf16_optimizer_states.value else 4
    oo = z.offload_optimizer
    op = z.offload_param
    oo_on = oo.enabled
    oo_nvme = oo.device.value == "nvme"
    op_on = op.enabled
    ratio = float(oo.ratio.value) if oo_on else 0.0
    host_share = ratio if oo_on else 0.0
    gpu_share = 1.0 - host_share
    stage_key = z.stage.key_path
    pkeys = _precision_keys(eff)
    ctx.assumptions.append(
        "zero.Init builds the model partitioned (HF does when the DeepSpeed config is created "
        "before from_pretrained)"
    )
    if model.trainable_params is None:
        ctx.assumptions.append("every parameter is trainable")

    # 16-bit parameter partitions.
    if not op_on:
        ctx.add(
            MemoryComponent(
                "param_partition",
                "parameter partition",
                Device.GPU,
                Phase.PERSISTENT,
                e * p_all,
                f"{e} B x {_num(model.total_params)} params / {n} ranks",
                (stage_key, op.device.key_path, *pkeys),
            )
        )
    # fp32 master weights.  In pure fp32 the partitions are the master weights (no copy).
    fp32_alias = e == 4 and master_bytes == 4 and not oo_on
    if not fp32_alias:
        gpu_master = int(master_bytes * p_tr * gpu_share)
        if gpu_master:
            ctx.add(
                MemoryComponent(
                    "fp32_master",
                    "fp32 master weights",
                    Device.GPU,
                    Phase.PERSISTENT,
                    gpu_master,
                    f"{master_bytes} B x {_num(model.trainable)} trainable / {n}"
                    + (f" x {gpu_share:g} (1 - offload ratio)" if oo_on else ""),
                    (stage_key, oo.device.key_path) + ((oo.ratio.key_path,) if oo_on else ()),
                )
            )
    # Gradient partitions: on self.device (the CPU when the optimizer is offloaded).
    grad_part = e_g * p_tr
    if not oo_on:
        ctx.add(
            MemoryComponent(
                "grad_partition",
                "gradient partitions",
                Device.GPU,
                Phase.PERSISTENT,
                grad_part,
                f"{e_g} B x {_num(model.trainable)} trainable / {n}",
                (stage_key, prec.grad_accum_dtype.key_path, *pkeys),
            )
        )
    # IPG bucket.
    rbs = int(z.reduce_bucket_size.value)
    if z.contiguous_gradients.value:
        ctx.add(
            MemoryComponent(
                "ipg_bucket",
                "gradient reduce bucket",
                Device.GPU,
                Phase.PERSISTENT,
                e_c * rbs,
                f"{e_c} B x reduce_bucket_size {_num(rbs)}",
                (z.reduce_bucket_size.key_path, z.contiguous_gradients.key_path),
            )
        )
    # Optimizer states (created at the first step; Adagrad at init).
    states = int(state_elems * state_bytes * p_tr * gpu_share)
    if states:
        ctx.add(
            MemoryComponent(
                "optimizer_states",
                "optimizer states",
                Device.GPU,
                Phase.PERSISTENT,
                states,
                f"{state_elems} x {state_bytes} B x {_num(model.trainable)} trainable / {n}"
                + (f" x {gpu_share:g}" if oo_on else ""),
                (oo.device.key_path, "optimizer.type"),
                basis=Basis.CODE if state_guess is None else Basis.ESTIMATE,
                note="allocated at the first optimizer step",
            )
        )

    # Sub-group size: the largest optimizer sub-group a rank processes at once.
    sgs = int(z.sub_group_size.value)
    largest_part = _ceil_div(largest, n) if largest else 0
    s_max = min(p_tr, max(sgs, 1) + largest_part) if sgs < p_tr else p_tr
    # Step transient without (or for the GPU share of) optimizer offload.
    if gpu_share > 0:
        step_bytes = e_g * s_max + (master_bytes * s_max if e_g != master_bytes else 0)
        ctx.add(
            MemoryComponent(
                "step_fp32_grads",
                "fp32 gradients of one optimizer sub-group",
                Device.GPU,
                Phase.OPTIMIZER_STEP,
                step_bytes,
                f"({e_g} B flattened + {master_bytes} B converted) x min(sub_group_size "
                f"{_num(sgs)}, partition {_num(p_tr)})"
                if e_g != master_bytes
                else f"{e_g} B x min(sub_group_size {_num(sgs)}, partition {_num(p_tr)})",
                (z.sub_group_size.key_path, oo.device.key_path),
            )
        )
        ctx.add(
            MemoryComponent(
                "init_fp32_grad_buffer",
                "fp32 gradient buffer at optimizer init",
                Device.GPU,
                Phase.INIT,
                master_bytes * s_max,
                f"{master_bytes} B x largest sub-group {_num(s_max)}",
                (z.sub_group_size.key_path,),
            )
        )

    # Gathered parameters (forward/backward working set).
    prefetch = int(z.prefetch_bucket_size.value)
    if z.allgather_sequential.value:
        prefetch = 1  # the engine forces prefetch_bucket_size = 1
    max_live = int(z.max_live_parameters.value)
    reuse = int(z.max_reuse_distance.value)
    total = model.total_params
    retained = min(total, reuse // 2)
    prefetched = min(prefetch, max(0, max_live - retained)) if prefetch > 0 else 0
    current = largest or 0
    working = min(total, retained + prefetched + current)
    if largest is None:
        ctx.assumptions.append(
            "largest layer unknown: the module being gathered is not counted in the working set"
        )
    ctx.add(
        MemoryComponent(
            "gathered_params",
            "gathered parameters (prefetch / live / reuse)",
            Device.GPU,
            Phase.FORWARD_BACKWARD,
            e * working,
            f"{e} B x min(model {_num(total)}, reuse-retained min(model, max_reuse_distance/2 = "
            f"{_num(reuse // 2)}) "
            f"+ prefetch min(prefetch_bucket_size {_num(prefetch)}, max_live {_num(max_live)} - "
            "retained) "
            f"+ current module {_num(current)})",
            (
                z.prefetch_bucket_size.key_path,
                z.max_live_parameters.key_path,
                z.max_reuse_distance.key_path,
            ),
            basis=Basis.BOUND,
            note="steady state (complete trace); the first step gathers one module at a time",
        )
    )
    if current:
        ctx.add(
            MemoryComponent(
                "module_grads",
                "full gradients of the current module",
                Device.GPU,
                Phase.FORWARD_BACKWARD,
                e * current,
                f"{e} B x largest layer {_num(current)}",
                (),
                basis=Basis.BOUND,
            )
        )
    ctx.add(
        MemoryComponent(
            "reduce_scatter_buffer",
            "reduce-scatter flat buffer",
            Device.GPU,
            Phase.FORWARD_BACKWARD,
            e_c * min(rbs, total),
            f"{e_c} B x reduce_bucket_size {_num(rbs)}",
            (z.reduce_bucket_size.key_path,),
        )
    )
    if z.overlap_comm.value:
        ctx.add(
            MemoryComponent(
                "reduce_in_flight",
                "gradients waiting for in-flight reduces (overlap_comm)",
                Device.GPU,
                Phase.FORWARD_BACKWARD,
                e * min(rbs, total) * (MAX_PARAM_REDUCE_EVENTS - 1),
                f"{e} B x reduce_bucket_size {_num(rbs)} x {MAX_PARAM_REDUCE_EVENTS - 1}",
                (z.overlap_comm.key_path, z.reduce_bucket_size.key_path),
                basis=Basis.BOUND,
            )
        )
    hpz = int(z.zero_hpz_partition_size.value)
    if hpz > 1:
        ctx.add(
            MemoryComponent(
                "hpz_secondary",
                "hpZ secondary partition",
                Device.GPU,
                Phase.FORWARD_BACKWARD,
                e * _ceil_div(total, hpz),
                f"{e} B x {_num(total)} / zero_hpz_partition_size {hpz}",
                (z.zero_hpz_partition_size.key_path,),
                basis=Basis.BOUND,
            )
        )

    # ---- host, per rank ----
    if oo_on and not oo_nvme:
        ctx.add(
            MemoryComponent(
                "host_fp32_master",
                "fp32 master weights (CPU)",
                Device.HOST,
                Phase.PERSISTENT,
                int(master_bytes * p_tr * host_share),
                f"{master_bytes} B x {_num(model.trainable)} / {n} x ratio {host_share:g}",
                (oo.device.key_path, oo.ratio.key_path),
            )
        )
        ctx.add(
            MemoryComponent(
                "host_optimizer_states",
                "optimizer states (CPU)",
                Device.HOST,
                Phase.PERSISTENT,
                int(state_elems * state_bytes * p_tr * host_share),
                f"{state_elems} x {state_bytes} B x {_num(model.trainable)} / {n} x ratio "
                f"{host_share:g}",
                (oo.device.key_path, "optimizer.type"),
                basis=Basis.CODE if state_guess is None else Basis.ESTIMATE,
                note="allocated at the first optimizer step",
            )
        )
        host_elems = int(p_tr * host_share)
        groups = sub_group_sizes(host_elems, sgs)
        pin_grads = bool(oo.pin_memory.value)
        grads_bytes = sum(
            pinned_allocation(master_bytes * g) if pin_grads else master_bytes * g for g in groups
        )
        ctx.add(
            MemoryComponent(
                "host_fp32_grads",
                "fp32 gradient buffers per sub-group (CPU)",
                Device.HOST,
                Phase.PERSISTENT,
                grads_bytes,
                (f"{len(groups)} x pow2(" if pin_grads else f"{len(groups)} x (")
                + f"{master_bytes} B x sub-group of {_num(groups[0]) if groups else 0})"
                + f"; {_num(model.trainable)} / {n} x ratio {host_share:g}",
                (oo.device.key_path, oo.pin_memory.key_path, z.sub_group_size.key_path),
                pinned=pin_grads,
                basis=Basis.CODE if len(groups) <= 1 else Basis.ESTIMATE,
                note=_PINNED_NOTE if pin_grads else "",
                requested_bytes=master_bytes * sum(groups) if pin_grads else None,
            )
        )
    if oo_on:
        pin_part = bool(oo.pin_memory.value)
        ctx.add(
            MemoryComponent(
                "host_grad_partition",
                "gradient partitions (CPU)",
                Device.HOST,
                Phase.PERSISTENT,
                pinned_allocation(grad_part) if pin_part else grad_part,
                ("pow2(" if pin_part else "")
                + f"{e_g} B x {_num(model.trainable)} / {n}"
                + (")" if pin_part else ""),
                (oo.device.key_path, oo.pin_memory.key_path),
                pinned=pin_part,
                note=_PINNED_NOTE if pin_part else "",
                requested_bytes=grad_part if pin_part else None,
            )
        )
        if not oo_nvme:
            ctx.add(
                MemoryComponent(
                    "host_init_grad_buffer",
                    "fp32 gradient buffer at optimizer init (CPU)",
                    Device.HOST,
                    Phase.INIT,
                    master_bytes * s_max,
                    f"{master_bytes} B x largest sub-group {_num(s_max)}",
                    (z.sub_group_size.key_path,),
                )
            )
    if oo_nvme:
        count = int(oo.buffer_count.value)
        ctx.add(
            MemoryComponent(
                "nvme_optimizer_swap_buffers",
                "NVMe optimizer swap buffers",
                Device.HOST,
                Phase.PERSISTENT,
                count * s_max * master_bytes,
                f"buffer_count {count} x largest sub-group {_num(s_max)} x {master_bytes} B",
                (oo.buffer_count.key_path, z.sub_group_size.key_path),
                pinned=True,
            )
        )
        ctx.add(
            MemoryComponent(
                "nvme_fp32_grad_buffer",
                "fp32 gradient buffer of the largest sub-group (CPU)",
                Device.HOST,
                Phase.PERSISTENT,
                master_bytes * s_max,
                f"{master_bytes} B x largest sub-group {_num(s_max)}",
                (z.sub_group_size.key_path,),
            )
        )
    if op_on:
        op_nvme = op.device.value == "nvme"
        in_cpu = min(p_tr, int(op.max_in_cpu.value)) if op_nvme else p_tr
        ctx.add(
            MemoryComponent(
                "host_param_flat",
                "parameter partitions, flat CPU buffer (always pinned)",
                Device.HOST,
                Phase.PERSISTENT,
                pinned_allocation(e * in_cpu),
                f"pow2({e} B x "
                + (
                    f"min(max_in_cpu {_num(int(op.max_in_cpu.value))}, {_num(p_tr)})"
                    if op_nvme
                    else f"{_num(model.trainable)} trainable / {n}"
                )
                + ")",
                (op.device.key_path,) + ((op.max_in_cpu.key_path,) if op_nvme else ()),
                pinned=True,
                requested_bytes=e * in_cpu,
                note=(
                    "pinned whatever offload_param.pin_memory says (stage3.py "
                    "_create_param_groups_fp16_flat_cpu_memory); one trainable parameter group "
                    "assumed (one buffer per group); " + _PINNED_NOTE
                ),
            )
        )
        frozen = p_all - p_tr
        if frozen > 0 and not op_nvme:
            ctx.add(
                MemoryComponent(
                    "host_frozen_params",
                    "frozen parameter partitions (CPU)",
                    Device.HOST,
                    Phase.PERSISTENT,
                    e * frozen,
                    f"{e} B x {_num(model.total_params - model.trainable)} frozen / {n}",
                    (op.device.key_path, op.pin_memory.key_path),
                    pinned=bool(op.pin_memory.value),
                )
            )
        if not op_nvme:
            pin_init = bool(op.pin_memory.value)
            ctx.add(
                MemoryComponent(
                    "host_param_init_copy",
                    "zero.Init partitions before they move to the flat buffer"
                    + (" (pinned, kept in torch's pinned cache)" if pin_init else ""),
                    Device.HOST,
                    Phase.PERSISTENT if pin_init else Phase.INIT,
                    int(e * p_tr * POW2_ROUNDING_FACTOR) if pin_init else e * p_tr,
                    f"{e} B x {_num(model.trainable)} / {n}"
                    + (
                        f" x {POW2_ROUNDING_FACTOR:.2f} (power-of-two rounding)" if pin_init else ""
                    ),
                    (op.pin_memory.key_path,),
                    pinned=pin_init,
                    basis=Basis.ESTIMATE if pin_init else Basis.CODE,
                    requested_bytes=e * p_tr if pin_init else None,
                    note=(
                        "each parameter's partition is pinned separately by zero.Init and rounded "
                        "up to a power of two (1x to 2x; 1/ln 2 = 1.44x on average), and stays in "
                        "torch's pinned-memory cache after it is freed"
                    )
                    if pin_init
                    else "",
                )
            )
        if op_nvme:
            count = int(op.buffer_count.value)
            size = int(op.buffer_size.value)
            ctx.add(
                MemoryComponent(
                    "nvme_param_swap_buffers",
                    "NVMe parameter swap buffers",
                    Device.HOST,
                    Phase.PERSISTENT,
                    count * size * e,
                    f"buffer_count {count} x buffer_size {_num(size)} x {e} B",
                    (op.buffer_count.key_path, op.buffer_size.key_path),
                    pinned=True,
                )
            )
    else:
        ctx.add(
            MemoryComponent(
                "host_defragment",
                "parameter partitions copied through the CPU (defragment)",
                Device.HOST,
                Phase.INIT,
                e * p_tr,
                f"{e} B x {_num(model.trainable)} / {n}",
                (stage_key,),
            )
        )
    if z.gather_16bit_weights_on_model_save.value:
        ctx.add(
            MemoryComponent(
                "save_16bit_state_dict",
                "16-bit state dict gathered on rank 0 (save_16bit_model)",
                Device.HOST,
                Phase.CHECKPOINT_SAVE,
                e * model.total_params,
                f"{e} B x {_num(model.total_params)}",
                (z.gather_16bit_weights_on_model_save.key_path,),
                per_host=True,
                note="rank 0's host only",
            )
        )
    return ctx.comps, ctx.assumptions


def _activation_components(shape: ActivationShape, e: int) -> list[MemoryComponent]:
    """Korthikanti et al. 2022 (arXiv:2205.05198), per layer ``s*b*h*(34 + 5*a*s/h)`` bytes of
    16-bit activations (dropout masks included, so an upper bound without dropout); flash
    attention drops the ``5*a*s/h`` score term; full checkpointing keeps ``2*s*b*h`` per layer
    plus one layer being recomputed.  fp32 training doubles it.  The causal-LM loss upcasts the
    logits: ``b*s*V*(e + 4 + 4)`` (logits, fp32 copy, its gradient)."""
    s, b, h, layers = shape.seq_len, shape.micro_batch, shape.hidden_size, shape.layers
    scale = e / 2
    per_layer = 34.0
    term = "34"
    if not shape.flash_attention and shape.heads:
        per_layer += 5 * shape.heads * s / h
        term = f"34 + 5*{shape.heads}*{s}/{h}"
    if shape.checkpointing:
        total = (2 * s * b * h * layers + s * b * h * per_layer) * scale
        formula = f"(2 x {layers} layers + 1 x ({term})) x s {s} x b {b} x h {h}"
    else:
        total = s * b * h * per_layer * layers * scale
        formula = f"({term}) x s {s} x b {b} x h {h} x {layers} layers"
    if scale != 1:
        formula += " x 2 (fp32)"
    comps = [
        MemoryComponent(
            "activations",
            "activations (estimate)",
            Device.GPU,
            Phase.FORWARD_BACKWARD,
            int(total),
            formula,
            ("train_micro_batch_size_per_gpu",),
            basis=Basis.ESTIMATE,
            note="Korthikanti et al. 2022; outside ds_config",
        )
    ]
    if shape.vocab_size:
        comps.append(
            MemoryComponent(
                "logits",
                "logits, their fp32 copy and gradient (estimate)",
                Device.GPU,
                Phase.FORWARD_BACKWARD,
                b * s * shape.vocab_size * (e + 4 + 4),
                f"b {b} x s {s} x vocab {shape.vocab_size} x ({e} + 4 + 4) B",
                ("train_micro_batch_size_per_gpu",),
                basis=Basis.ESTIMATE,
            )
        )
    return comps


_PINNED_NOTE = (
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


def _stage012(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology, stage: int
) -> tuple[list[MemoryComponent], list[str]]:
    ctx = _Ctx(eff, model, topo)
    z = eff.zero
    prec = eff.precision
    n = topo.world_size
    e = prec.param_bytes
    e_c = prec.comm_bytes
    p_tr = model.trainable
    state_elems, guess = optimizer_state_elements(eff)
    if guess:
        ctx.assumptions.append(guess)
    ctx.assumptions.append(
        f"ZeRO stage {stage}: component sizes are read from the stage 1/2 optimizer coarsely "
        "(basis: estimate)"
    )
    part = n if stage >= 1 else 1
    oo_on = z.offload_optimizer.enabled and stage >= 1
    stage_key = z.stage.key_path
    pkeys = _precision_keys(eff)
    ctx.add(
        MemoryComponent(
            "param_full",
            "parameters (not partitioned below stage 3)",
            Device.GPU,
            Phase.PERSISTENT,
            e * model.total_params,
            f"{e} B x {_num(model.total_params)}",
            (stage_key, *pkeys),
            basis=Basis.ESTIMATE,
        )
    )
    grads = e * p_tr if stage < 2 else e * _ceil_div(p_tr, n)
    ctx.add(
        MemoryComponent(
            "grads",
            "gradients" + (" (partitioned)" if stage >= 2 else ""),
            Device.GPU,
            Phase.PERSISTENT,
            grads,
            f"{e} B x {_num(p_tr)}" + (f" / {n}" if stage >= 2 else ""),
            (stage_key,),
            basis=Basis.ESTIMATE,
        )
    )
    mixed = e == 2 or stage >= 1
    master = 4 * _ceil_div(p_tr, part) if mixed else 0
    states = state_elems * 4 * _ceil_div(p_tr, part)
    target = Device.HOST if oo_on else Device.GPU
    if master:
        ctx.add(
            MemoryComponent(
                "fp32_master",
                "fp32 master weights",
                target,
                Phase.PERSISTENT,
                master,
                f"4 B x {_num(p_tr)}" + (f" / {n}" if part > 1 else ""),
                (stage_key, z.offload_optimizer.device.key_path),
                basis=Basis.ESTIMATE,
            )
        )
    ctx.add(
        MemoryComponent(
            "optimizer_states",
            "optimizer states",
            target,
            Phase.PERSISTENT,
            states,
            f"{state_elems} x 4 B x {_num(p_tr)}" + (f" / {n}" if part > 1 else ""),
            (stage_key, z.offload_optimizer.device.key_path, "optimizer.type"),
            basis=Basis.ESTIMATE,
            note="allocated at the first optimizer step",
        )
    )
    ctx.add(
        MemoryComponent(
            "step_fp32_grads",
            "fp32 gradient partition at the step",
            target,
            Phase.OPTIMIZER_STEP if not oo_on else Phase.PERSISTENT,
            4 * _ceil_div(p_tr, part),
            f"4 B x {_num(p_tr)}" + (f" / {n}" if part > 1 else ""),
            (stage_key,),
            basis=Basis.ESTIMATE,
            pinned=oo_on and bool(z.offload_optimizer.pin_memory.value),
        )
    )
    if stage >= 1:
        rbs = int(z.reduce_bucket_size.value)
        buffers = 2 if z.overlap_comm.value else 1
        if z.contiguous_gradients.value:
            ctx.add(
                MemoryComponent(
                    "ipg_bucket",
                    "gradient reduce buckets" + (" (double, overlap_comm)" if buffers == 2 else ""),
                    Device.GPU,
                    Phase.PERSISTENT,
                    e_c * rbs * buffers,
                    f"{e_c} B x reduce_bucket_size {_num(rbs)} x {buffers}",
                    (
                        z.reduce_bucket_size.key_path,
                        z.overlap_comm.key_path,
                        z.contiguous_gradients.key_path,
                    ),
                )
            )
        agb = int(z.allgather_bucket_size.value)
        ctx.add(
            MemoryComponent(
                "allgather_bucket",
                "parameter all-gather bucket at the step",
                Device.GPU,
                Phase.OPTIMIZER_STEP,
                e * min(agb, model.total_params),
                f"{e} B x allgather_bucket_size {_num(agb)}",
                (z.allgather_bucket_size.key_path,),
                basis=Basis.BOUND,
            )
        )
    return ctx.comps, ctx.assumptions


# -- DeepSpeed's estimators ----------------------------------------------------------------------


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """``estimate_zero3_model_states_mem_needs`` of DeepSpeed 0.19.8, restated:
    (CPU bytes per node, GPU bytes per GPU, largest layer bytes)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    cpu_mem: float
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = (
                    total_params
                    * max(4 * num_gpus_per_node, 18 * gpus_factor)
                    * additional_buffer_factor
                )
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = (
                    total_params
                    * max(4 * num_gpus_per_node, 16 * gpus_factor)
                    * additional_buffer_factor
                )
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def deepspeed_zero2_estimate(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """``estimate_zero2_model_states_mem_needs`` of DeepSpeed 0.19.8, restated:
    (CPU bytes per node, GPU bytes per GPU)."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def _estimator_for(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology
) -> EstimatorCrossCheck | None:
    stage = int(eff.zero.stage.value)
    gpn = topo.ranks_per_host
    nodes = topo.nodes
    oo = eff.zero.offload_optimizer.enabled
    if stage == 3:
        op = eff.zero.offload_param.enabled
        largest = model.largest_layer_params or 0
        cpu, gpu, _ = deepspeed_zero3_estimate(
            model.total_params, largest, gpn, nodes, oo, op and oo
        )
        args = (
            f"total_params={model.total_params}, largest_layer_params={largest}, "
            f"num_gpus_per_node={gpn}, "
            f"num_nodes={nodes}, cpu_offload={oo}, cpu_offload_params={op and oo}"
        )
        return EstimatorCrossCheck("estimate_zero3_model_states_mem_needs", args, gpu, cpu)
    if stage == 2:
        cpu, gpu = deepspeed_zero2_estimate(model.total_params, gpn, nodes, oo)
        args = (
            f"total_params={model.total_params}, num_gpus_per_node={gpn}, num_nodes={nodes}, "
            f"cpu_offload={oo}"
        )
        return EstimatorCrossCheck("estimate_zero2_model_states_mem_needs", args, gpu, cpu)
    return None


# -- timelines and capacity --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Step:
    label: str
    adds: tuple[MemoryComponent, ...]
    frees: tuple[MemoryComponent, ...]


@dataclass(frozen=True, slots=True)
class _Walk:
    peak: int
    peak_label: str
    first_over: tuple[str, MemoryComponent, int] | None


def _gpu_timeline(budget: MemoryBudget) -> list[_Step]:
    gpu = budget.on(Device.GPU)
    persistent_init = tuple(
        c for c in gpu if c.phase is Phase.PERSISTENT and c.code != "optimizer_states"
    )
    states = tuple(c for c in gpu if c.code == "optimizer_states")
    init = tuple(c for c in gpu if c.phase is Phase.INIT)
    fwd = tuple(c for c in gpu if c.phase is Phase.FORWARD_BACKWARD)
    step = tuple(c for c in gpu if c.phase is Phase.OPTIMIZER_STEP)
    return [
        _Step("engine init", persistent_init + init, init),
        _Step("first forward/backward", fwd, fwd),
        _Step("first optimizer step", states + step, step),
        _Step("forward/backward after the first step", fwd, fwd),
    ]


#: Timeline steps by the phase name a rule knows from the OOM traceback.
_PHASE_STEPS = {
    "engine init": ("engine init",),
    "forward/backward": ("first forward/backward", "forward/backward after the first step"),
    "optimizer step": ("first optimizer step",),
}


def gpu_phase_totals(budget: MemoryBudget) -> dict[str, int]:
    """GPU bytes in use at the end of each phase's allocations (``engine init``,
    ``forward/backward`` - the larger of the first and later passes -, ``optimizer step``)."""
    at_step: dict[str, int] = {}
    total = 0
    for step in _gpu_timeline(budget):
        total += sum(c.bytes for c in step.adds)
        at_step[step.label] = total
        total -= sum(c.bytes for c in step.frees)
    return {
        phase: max(at_step[label] for label in labels) for phase, labels in _PHASE_STEPS.items()
    }


def phase_of_step(label: str) -> str:
    """``"first forward/backward"`` -> ``"forward/backward"``."""
    for phase, labels in _PHASE_STEPS.items():
        if label in labels:
            return phase
    return label


def _scaled(comp: MemoryComponent, ranks: int) -> MemoryComponent:
    if comp.per_host or ranks == 1:
        return comp
    return replace(comp, bytes=comp.bytes * ranks, formula=f"{ranks} ranks x ({comp.formula})")


def _host_timeline(budget: MemoryBudget) -> list[_Step]:
    ranks = budget.topology.ranks_per_host
    host = [_scaled(c, ranks) for c in budget.on(Device.HOST)]
    persistent_init = tuple(
        c for c in host if c.phase is Phase.PERSISTENT and c.code != "host_optimizer_states"
    )
    states = tuple(c for c in host if c.code == "host_optimizer_states")
    init = tuple(c for c in host if c.phase is Phase.INIT)
    save = tuple(c for c in host if c.phase is Phase.CHECKPOINT_SAVE)
    step = tuple(c for c in host if c.phase is Phase.OPTIMIZER_STEP)
    return [
        _Step("engine init", persistent_init + init, init),
        _Step("first optimizer step", states + step, step),
        _Step("checkpoint save", save, save),
    ]


def _walk(steps: Iterable[_Step], capacity: int | None) -> _Walk:
    total = 0
    peak = 0
    peak_label = ""
    first: tuple[str, MemoryComponent, int] | None = None
    for step in steps:
        for comp in step.adds:
            total += comp.bytes
            if total > peak:
                peak, peak_label = total, step.label
            if capacity is not None and first is None and total > capacity:
                # Blame the largest allocation of the step where the total crossed the
                # capacity: within a step the order of allocations is not known, their sizes are.
                largest = max(step.adds, key=lambda c: c.bytes)
                first = (step.label, largest, total - capacity)
        for comp in step.frees:
            total -= comp.bytes
    return _Walk(peak, peak_label, first)


@dataclass(frozen=True, slots=True)
class Capacity:
    """Memory to compare against.  ``gpu_bytes``: the card's total (``--gpu-memory``, or the OOM
    message's total capacity / allowed memory); ``gpu_reserved_bytes``: what is not available to
    PyTorch (CUDA context, other processes) when known.  ``host_bytes``: one host's RAM (or its
    cgroup limit)."""

    gpu_bytes: int | None = None
    gpu_source: str = ""
    host_bytes: int | None = None
    host_source: str = ""
    gpu_reserved_bytes: int = 0

    @classmethod
    def from_oom_message(
        cls,
        *,
        total_capacity: int,
        free: int | None = None,
        allocated_by_pytorch: int | None = None,
        reserved_unallocated: int | None = None,
        allowed: int | None = None,
        source: str = "OOM message",
        host_bytes: int | None = None,
        host_source: str = "",
    ) -> Capacity:
        """The GPU memory this process's PyTorch could use, from torch's OOM message numbers.

        torch prints the card's total capacity, what is free, and what PyTorch holds (allocated
        plus reserved-but-unallocated); the rest is the CUDA context and other processes.  So
        PyTorch could have had ``free + allocated + reserved_unallocated``, capped by the
        ``allowed`` memory when a memory fraction is set.  Without the breakdown, the total.
        """
        usable = total_capacity
        if (
            free is not None
            and allocated_by_pytorch is not None
            and reserved_unallocated is not None
        ):
            usable = free + allocated_by_pytorch + reserved_unallocated
        if allowed is not None:
            usable = min(usable, allowed)
        return cls(
            gpu_bytes=usable,
            gpu_source=source,
            host_bytes=host_bytes,
            host_source=host_source,
        )


@dataclass(frozen=True, slots=True)
class CapacityVerdict:
    """One device's budget against its capacity.

    ``required_bytes``: the model's peak; ``headroom_bytes``: capacity minus that (negative when
    it cannot fit; on a GPU what is left for activations, workspace and fragmentation).
    Walking DeepSpeed's allocations in order (engine init, first forward/backward, first
    optimizer step - where optimizer states are created -, later passes), ``overflow_phase`` is
    the step where the running total first exceeds the capacity and ``overflow_component`` the
    largest allocation of that step (within a step the order of allocations is not known).
    ``overflow_bytes`` is the peak minus the capacity (0 when it fits).  ``kind`` is ``gpu``,
    ``host`` or ``pinned``.
    """

    kind: str
    capacity_bytes: int
    capacity_source: str
    required_bytes: int
    peak_phase: str
    headroom_bytes: int
    overflow_component: MemoryComponent | None
    overflow_phase: str | None
    overflow_bytes: int

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0


def compare_with_capacity(budget: MemoryBudget, capacity: Capacity) -> list[CapacityVerdict]:
    """GPU, host and pinned-host verdicts for the capacities given (a missing capacity gives no
    verdict)."""
    verdicts: list[CapacityVerdict] = []
    if capacity.gpu_bytes is not None:
        usable = capacity.gpu_bytes - capacity.gpu_reserved_bytes
        walk = _walk(_gpu_timeline(budget), usable)
        verdicts.append(_verdict("gpu", usable, capacity.gpu_source, walk))
    if capacity.host_bytes is not None:
        walk = _walk(_host_timeline(budget), capacity.host_bytes)
        verdicts.append(_verdict("host", capacity.host_bytes, capacity.host_source, walk))
        ranks = budget.topology.ranks_per_host
        pinned = [_scaled(c, ranks) for c in budget.on(Device.HOST) if c.pinned]
        walk = _walk([_Step("pinned host buffers", tuple(pinned), ())], capacity.host_bytes)
        verdicts.append(_verdict("pinned", capacity.host_bytes, capacity.host_source, walk))
    return verdicts


def _verdict(kind: str, capacity: int, source: str, walk: _Walk) -> CapacityVerdict:
    over = walk.first_over
    return CapacityVerdict(
        kind=kind,
        capacity_bytes=capacity,
        capacity_source=source,
        required_bytes=walk.peak,
        peak_phase=walk.peak_label,
        headroom_bytes=capacity - walk.peak,
        overflow_component=over[1] if over else None,
        overflow_phase=over[0] if over else None,
        overflow_bytes=max(0, walk.peak - capacity),
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
        gpu_bytes_saved=before.gpu_peak(focus) - after.gpu_peak(focus),
        host_bytes_delta=after.host_peak() - before.host_peak(),
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
    return _predict(
        eff,
        model,
        topo,
        changes,
        {"zero__offload_optimizer__device": "cpu"},
        "offload the optimizer to the CPU",
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
        others = before.gpu_peak() - gathered.bytes
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
    partition = _ceil_div(model.trainable, topo.world_size)
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
                    if c.phase is Phase.PERSISTENT or phase_of_step(step) == c.phase.value
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
    return unpinned.host_peak()


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
                    Severity.HIGH,
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
                    Severity.HIGH if not gpu.fits else Severity.MEDIUM,
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
                    Severity.MEDIUM if not gpu.fits else Severity.LOW,
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
                    f"{format_size(gpu.overflow_bytes)} short, before any activation memory",
                    Severity.HIGH,
                    comp.key_paths if comp else (),
                    bytes_at_stake=gpu.overflow_bytes,
                )
            )
    elif gathered is not None and above and gathered.bytes > 2 * 2**30:
        out.append(
            ConfigHazard(
                "prefetch_overshoot",
                f"{', '.join(f'{v.key_path} = {_num(int(v.value))}' for v in above)} far above "
                "DeepSpeed's "
                "defaults: the gathered-parameter working set can reach "
                f"{format_size(gathered.bytes)} per GPU",
                Severity.LOW,
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
                    Severity.HIGH if (not pinned.fits or host_short) else Severity.MEDIUM,
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
                Severity.HIGH,
                comp.key_paths if comp else (),
                bytes_at_stake=host.overflow_bytes,
            )
        )
    return out
