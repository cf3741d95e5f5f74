"""ZeRO stage 3's allocations, GPU and host, as DeepSpeed 0.19.8's stage3.py and
partition_parameters.py make them: partitions, gathered and persistent parameters, prefetch,
reduce buckets, offload buffers (``stage3``).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.analysis.zero_model.accounting import (
    MAX_PARAM_REDUCE_EVENTS,
    PINNED_NOTE,
    POW2_ROUNDING_FACTOR,
    Ctx,
    ceil_div,
    num,
    optimizer_state_elements,
    pinned_allocation,
    precision_keys,
    sub_group_sizes,
)
from oomlens.facts.config import (
    EffectiveDsConfig,
    OffloadOptimizerSettings,
    OffloadParamSettings,
    PrecisionSettings,
    ZeroSettings,
)
from oomlens.facts.memory_model import (
    Basis,
    BudgetPhase,
    Device,
    MemoryComponent,
    ModelSize,
    Topology,
)


@dataclass(frozen=True, slots=True)
class _Stage3:
    """What every ZeRO-3 component is computed from: the config's settings and the sizes per
    rank they imply (elements, and bytes per element)."""

    eff: EffectiveDsConfig
    model: ModelSize
    topo: Topology
    z: ZeroSettings
    prec: PrecisionSettings
    n: int
    """Ranks in the partition group."""
    e: int
    """Bytes of a parameter element (16-bit, or fp32)."""
    e_g: int
    """Bytes of a gradient-accumulation element."""
    e_c: int
    """Bytes of a communication element."""
    p_all: int
    """Parameter elements per rank."""
    p_tr: int
    """Trainable parameter elements per rank."""
    largest: int | None
    master_bytes: int
    state_elems: int
    state_guess: str | None
    """The assumption made about the optimizer's states, when it had to be guessed."""
    state_bytes: int
    oo: OffloadOptimizerSettings
    op: OffloadParamSettings
    oo_on: bool
    oo_nvme: bool
    op_on: bool
    ratio: float
    host_share: float
    gpu_share: float
    stage_key: str
    pkeys: tuple[str, ...]
    grad_part: int
    """Gradient-partition bytes per rank."""
    states: int
    """Optimizer-state bytes per rank on the GPU."""
    sgs: int
    """``sub_group_size``."""
    largest_part: int
    s_max: int
    """The largest optimizer sub-group a rank processes at once."""

    @classmethod
    def of(cls, eff: EffectiveDsConfig, model: ModelSize, topo: Topology) -> _Stage3:
        z = eff.zero
        prec = eff.precision
        n = topo.world_size
        e_g = prec.grad_accum_bytes
        p_tr = ceil_div(model.trainable, n)
        largest = model.largest_layer_params
        state_elems, state_guess = optimizer_state_elements(eff)
        state_bytes = 2 if prec.bf16_optimizer_states.value else 4
        oo = z.offload_optimizer
        oo_on = oo.enabled
        ratio = float(oo.ratio.value) if oo_on else 0.0
        host_share = ratio if oo_on else 0.0
        gpu_share = 1.0 - host_share
        sgs = int(z.sub_group_size.value)
        largest_part = ceil_div(largest, n) if largest else 0
        half_master = (
            prec.bf16_master_weights_and_grads.value or prec.fp16_master_weights_and_grads.value
        )
        return cls(
            eff=eff,
            model=model,
            topo=topo,
            z=z,
            prec=prec,
            n=n,
            e=prec.param_bytes,
            e_g=e_g,
            e_c=prec.comm_bytes,
            p_all=ceil_div(model.total_params, n),
            p_tr=p_tr,
            largest=largest,
            master_bytes=2 if half_master else 4,
            state_elems=state_elems,
            state_guess=state_guess,
            state_bytes=state_bytes,
            oo=oo,
            op=z.offload_param,
            oo_on=oo_on,
            oo_nvme=oo.device.value == "nvme",
            op_on=z.offload_param.enabled,
            ratio=ratio,
            host_share=host_share,
            gpu_share=gpu_share,
            stage_key=z.stage.key_path,
            pkeys=precision_keys(eff),
            grad_part=e_g * p_tr,
            states=int(state_elems * state_bytes * p_tr * gpu_share),
            sgs=sgs,
            largest_part=largest_part,
            s_max=min(p_tr, max(sgs, 1) + largest_part) if sgs < p_tr else p_tr,
        )


def stage3(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology
) -> tuple[list[MemoryComponent], list[str]]:
    ctx = Ctx(eff, model, topo)
    s = _Stage3.of(eff, model, topo)
    if s.state_guess:
        ctx.assumptions.append(s.state_guess)
    ctx.assumptions.append(
        "zero.Init builds the model partitioned (HF does when the DeepSpeed config is created "
        "before from_pretrained)"
    )
    if model.trainable_params is None:
        ctx.assumptions.append("every parameter is trainable")
    _stage3_gpu(ctx, s)
    _stage3_host(ctx, s)
    return ctx.comps, ctx.assumptions


def _stage3_gpu(ctx: Ctx, s: _Stage3) -> None:
    """Per GPU: partitions, master weights, gradients, buckets, optimizer states, the step's
    transients, the gathered working set, overlap and hpZ buffers."""
    # 16-bit parameter partitions.
    if not s.op_on:
        ctx.add(
            MemoryComponent(
                "param_partition",
                "parameter partition",
                Device.GPU,
                BudgetPhase.PERSISTENT,
                s.e * s.p_all,
                f"{s.e} B x {num(s.model.total_params)} params / {s.n} ranks",
                (s.stage_key, s.op.device.key_path, *s.pkeys),
            )
        )
    persistent = _persistent_params(ctx, s)
    # fp32 master weights.  In pure fp32 the partitions are the master weights (no copy).
    fp32_alias = s.e == 4 and s.master_bytes == 4 and not s.oo_on
    if not fp32_alias:
        gpu_master = int(s.master_bytes * s.p_tr * s.gpu_share)
        if gpu_master:
            ctx.add(
                MemoryComponent(
                    "fp32_master",
                    "fp32 master weights",
                    Device.GPU,
                    BudgetPhase.PERSISTENT,
                    gpu_master,
                    f"{s.master_bytes} B x {num(s.model.trainable)} trainable / {s.n}"
                    + (f" x {s.gpu_share:g} (1 - offload ratio)" if s.oo_on else ""),
                    (s.stage_key, s.oo.device.key_path)
                    + ((s.oo.ratio.key_path,) if s.oo_on else ()),
                )
            )
    # Gradient partitions: on self.device (the CPU when the optimizer is offloaded).
    if not s.oo_on:
        ctx.add(
            MemoryComponent(
                "grad_partition",
                "gradient partitions",
                Device.GPU,
                BudgetPhase.PERSISTENT,
                s.grad_part,
                f"{s.e_g} B x {num(s.model.trainable)} trainable / {s.n}",
                (s.stage_key, s.prec.grad_accum_dtype.key_path, *s.pkeys),
            )
        )
    # IPG bucket.
    rbs = int(s.z.reduce_bucket_size.value)
    if s.z.contiguous_gradients.value:
        ctx.add(
            MemoryComponent(
                "ipg_bucket",
                "gradient reduce bucket",
                Device.GPU,
                BudgetPhase.PERSISTENT,
                s.e_c * rbs,
                f"{s.e_c} B x reduce_bucket_size {num(rbs)}",
                (s.z.reduce_bucket_size.key_path, s.z.contiguous_gradients.key_path),
            )
        )
    # Optimizer states (created at the first step; Adagrad at init).
    if s.states:
        ctx.add(
            MemoryComponent(
                "optimizer_states",
                "optimizer states",
                Device.GPU,
                BudgetPhase.PERSISTENT,
                s.states,
                f"{s.state_elems} x {s.state_bytes} B x {num(s.model.trainable)} trainable / {s.n}"
                + (f" x {s.gpu_share:g}" if s.oo_on else ""),
                (s.oo.device.key_path, "optimizer.type"),
                basis=Basis.CODE if s.state_guess is None else Basis.ESTIMATE,
                note="allocated at the first optimizer step",
            )
        )

    # Sub-group size: the largest optimizer sub-group a rank processes at once.
    # Step transient without (or for the GPU share of) optimizer offload.
    if s.gpu_share > 0:
        step_bytes = s.e_g * s.s_max + (s.master_bytes * s.s_max if s.e_g != s.master_bytes else 0)
        ctx.add(
            MemoryComponent(
                "step_fp32_grads",
                "fp32 gradients of one optimizer sub-group",
                Device.GPU,
                BudgetPhase.OPTIMIZER_STEP,
                step_bytes,
                f"({s.e_g} B flattened + {s.master_bytes} B converted) x min(sub_group_size "
                f"{num(s.sgs)}, partition {num(s.p_tr)})"
                if s.e_g != s.master_bytes
                else f"{s.e_g} B x min(sub_group_size {num(s.sgs)}, partition {num(s.p_tr)})",
                (s.z.sub_group_size.key_path, s.oo.device.key_path),
            )
        )
        ctx.add(
            MemoryComponent(
                "init_fp32_grad_buffer",
                "fp32 gradient buffer at optimizer init",
                Device.GPU,
                BudgetPhase.INIT,
                s.master_bytes * s.s_max,
                f"{s.master_bytes} B x largest sub-group {num(s.s_max)}",
                (s.z.sub_group_size.key_path,),
            )
        )

    # Gathered parameters (forward/backward working set).
    prefetch = int(s.z.prefetch_bucket_size.value)
    if s.z.allgather_sequential.value:
        prefetch = 1  # the engine forces prefetch_bucket_size = 1
    max_live = int(s.z.max_live_parameters.value)
    reuse = int(s.z.max_reuse_distance.value)
    total = s.model.total_params
    gatherable = total - persistent  # persistent parameters are never released nor gathered
    retained = min(total, reuse // 2)
    prefetched = min(prefetch, max(0, max_live - retained)) if prefetch > 0 else 0
    current = s.largest or 0
    working = min(gatherable, retained + prefetched + current)
    if s.largest is None:
        ctx.assumptions.append(
            "largest layer unknown: the module being gathered is not counted in the working set"
        )
    ctx.add(
        MemoryComponent(
            "gathered_params",
            "gathered parameters (prefetch / live / reuse)",
            Device.GPU,
            BudgetPhase.FORWARD_BACKWARD,
            s.e * working,
            f"{s.e} B x min(model {num(total)}, reuse-retained min(model, max_reuse_distance/2 = "
            f"{num(reuse // 2)}) "
            f"+ prefetch min(prefetch_bucket_size {num(prefetch)}, max_live {num(max_live)} - "
            "retained) "
            f"+ current module {num(current)})",
            (
                s.z.prefetch_bucket_size.key_path,
                s.z.max_live_parameters.key_path,
                s.z.max_reuse_distance.key_path,
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
                BudgetPhase.FORWARD_BACKWARD,
                s.e * current,
                f"{s.e} B x largest layer {num(current)}",
                (),
                basis=Basis.BOUND,
            )
        )
    ctx.add(
        MemoryComponent(
            "reduce_scatter_buffer",
            "reduce-scatter flat buffer",
            Device.GPU,
            BudgetPhase.FORWARD_BACKWARD,
            s.e_c * min(rbs, total),
            f"{s.e_c} B x reduce_bucket_size {num(rbs)}",
            (s.z.reduce_bucket_size.key_path,),
        )
    )
    if s.z.overlap_comm.value:
        ctx.add(
            MemoryComponent(
                "reduce_in_flight",
                "gradients waiting for in-flight reduces (overlap_comm)",
                Device.GPU,
                BudgetPhase.FORWARD_BACKWARD,
                s.e * min(rbs, total) * (MAX_PARAM_REDUCE_EVENTS - 1),
                f"{s.e} B x reduce_bucket_size {num(rbs)} x {MAX_PARAM_REDUCE_EVENTS - 1}",
                (s.z.overlap_comm.key_path, s.z.reduce_bucket_size.key_path),
                basis=Basis.BOUND,
            )
        )
    hpz = int(s.z.zero_hpz_partition_size.value)
    if hpz > 1:
        ctx.add(
            MemoryComponent(
                "hpz_secondary",
                "hpZ secondary partition",
                Device.GPU,
                BudgetPhase.FORWARD_BACKWARD,
                s.e * ceil_div(total, hpz),
                f"{s.e} B x {num(total)} / zero_hpz_partition_size {hpz}",
                (s.z.zero_hpz_partition_size.key_path,),
                basis=Basis.BOUND,
            )
        )


DEFAULT_PARAM_PERSISTENCE = 100_000


"""DeepSpeed's ``stage3_param_persistence_threshold`` default (elements)."""


def _persistent_params(ctx: Ctx, s: _Stage3) -> int:
    """Parameters ZeRO-3 never partitions, kept whole on every GPU (elements), and their
    component.  DeepSpeed marks every parameter of at most ``stage3_param_persistence_threshold``
    elements persistent, while their total stays within ``stage3_model_persistence_threshold``
    (``mark_persistent_parameters``), and keeps them gathered from their first use on.  Without
    the parameters' sizes only a threshold at or above the largest parameter (or the whole
    model) can be sized: then every parameter persists; a raised threshold below it is an
    assumption of the budget."""
    threshold = int(s.z.param_persistence_threshold.value)
    cap = int(s.z.model_persistence_threshold.value)
    total = s.model.total_params
    keys = (s.z.param_persistence_threshold.key_path, s.z.model_persistence_threshold.key_path)
    if threshold < (s.largest if s.largest is not None else total):
        if threshold > DEFAULT_PARAM_PERSISTENCE:
            ctx.assumptions.append(
                f"parameters of at most {num(threshold)} elements "
                f"({s.z.param_persistence_threshold.key_path}) are kept whole on every GPU: not "
                "counted, the parameters' sizes are unknown (above the largest parameter the "
                "whole 16-bit model stays on every GPU)"
            )
        return 0
    persistent = min(total, cap)
    ctx.add(
        MemoryComponent(
            "persistent_params",
            "parameters never partitioned (persistence threshold)",
            Device.GPU,
            BudgetPhase.PERSISTENT,
            s.e * persistent,
            (
                f"{s.e} B x min(model {num(total)}, model_persistence_threshold {num(cap)})"
                if cap < total
                else f"{s.e} B x model {num(total)}"
            )
            + f": every parameter is at most param_persistence_threshold {num(threshold)}",
            keys,
            note="whole on every GPU from its first use on, besides its partition",
        )
    )
    return persistent


def _stage3_host(ctx: Ctx, s: _Stage3) -> None:
    """Per rank (or per host) in host memory: offloaded optimizer and parameters, their pinned
    buffers, NVMe swap buffers, the 16-bit checkpoint gather."""
    # ---- host, per rank ----
    if s.oo_on and not s.oo_nvme:
        ctx.add(
            MemoryComponent(
                "host_fp32_master",
                "fp32 master weights (CPU)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                int(s.master_bytes * s.p_tr * s.host_share),
                f"{s.master_bytes} B x {num(s.model.trainable)} / {s.n} x ratio {s.host_share:g}",
                (s.oo.device.key_path, s.oo.ratio.key_path),
            )
        )
        ctx.add(
            MemoryComponent(
                "host_optimizer_states",
                "optimizer states (CPU)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                int(s.state_elems * s.state_bytes * s.p_tr * s.host_share),
                f"{s.state_elems} x {s.state_bytes} B x {num(s.model.trainable)} / {s.n} x ratio "
                f"{s.host_share:g}",
                (s.oo.device.key_path, "optimizer.type"),
                basis=Basis.CODE if s.state_guess is None else Basis.ESTIMATE,
                note="allocated at the first optimizer step",
            )
        )
        host_elems = int(s.p_tr * s.host_share)
        groups = sub_group_sizes(host_elems, s.sgs)
        pin_grads = bool(s.oo.pin_memory.value)
        grads_bytes = sum(
            pinned_allocation(s.master_bytes * g) if pin_grads else s.master_bytes * g
            for g in groups
        )
        ctx.add(
            MemoryComponent(
                "host_fp32_grads",
                "fp32 gradient buffers per sub-group (CPU)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                grads_bytes,
                (f"{len(groups)} x pow2(" if pin_grads else f"{len(groups)} x (")
                + f"{s.master_bytes} B x sub-group of {num(groups[0]) if groups else 0})"
                + f"; {num(s.model.trainable)} / {s.n} x ratio {s.host_share:g}",
                (s.oo.device.key_path, s.oo.pin_memory.key_path, s.z.sub_group_size.key_path),
                pinned=pin_grads,
                basis=Basis.CODE if len(groups) <= 1 else Basis.ESTIMATE,
                note=PINNED_NOTE if pin_grads else "",
                requested_bytes=s.master_bytes * sum(groups) if pin_grads else None,
            )
        )
    if s.oo_on:
        pin_part = bool(s.oo.pin_memory.value)
        ctx.add(
            MemoryComponent(
                "host_grad_partition",
                "gradient partitions (CPU)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                pinned_allocation(s.grad_part) if pin_part else s.grad_part,
                ("pow2(" if pin_part else "")
                + f"{s.e_g} B x {num(s.model.trainable)} / {s.n}"
                + (")" if pin_part else ""),
                (s.oo.device.key_path, s.oo.pin_memory.key_path),
                pinned=pin_part,
                note=PINNED_NOTE if pin_part else "",
                requested_bytes=s.grad_part if pin_part else None,
            )
        )
        if not s.oo_nvme:
            ctx.add(
                MemoryComponent(
                    "host_init_grad_buffer",
                    "fp32 gradient buffer at optimizer init (CPU)",
                    Device.HOST,
                    BudgetPhase.INIT,
                    s.master_bytes * s.s_max,
                    f"{s.master_bytes} B x largest sub-group {num(s.s_max)}",
                    (s.z.sub_group_size.key_path,),
                )
            )
    if s.oo_nvme:
        count = int(s.oo.buffer_count.value)
        ctx.add(
            MemoryComponent(
                "nvme_optimizer_swap_buffers",
                "NVMe optimizer swap buffers",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                count * s.s_max * s.master_bytes,
                f"buffer_count {count} x largest sub-group {num(s.s_max)} x {s.master_bytes} B",
                (s.oo.buffer_count.key_path, s.z.sub_group_size.key_path),
                pinned=True,
            )
        )
        ctx.add(
            MemoryComponent(
                "nvme_fp32_grad_buffer",
                "fp32 gradient buffer of the largest sub-group (CPU)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                s.master_bytes * s.s_max,
                f"{s.master_bytes} B x largest sub-group {num(s.s_max)}",
                (s.z.sub_group_size.key_path,),
            )
        )
    if s.op_on:
        op_nvme = s.op.device.value == "nvme"
        in_cpu = min(s.p_tr, int(s.op.max_in_cpu.value)) if op_nvme else s.p_tr
        ctx.add(
            MemoryComponent(
                "host_param_flat",
                "parameter partitions, flat CPU buffer (always pinned)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                pinned_allocation(s.e * in_cpu),
                f"pow2({s.e} B x "
                + (
                    f"min(max_in_cpu {num(int(s.op.max_in_cpu.value))}, {num(s.p_tr)})"
                    if op_nvme
                    else f"{num(s.model.trainable)} trainable / {s.n}"
                )
                + ")",
                (s.op.device.key_path,) + ((s.op.max_in_cpu.key_path,) if op_nvme else ()),
                pinned=True,
                requested_bytes=s.e * in_cpu,
                note=(
                    "pinned whatever offload_param.pin_memory says (stage3.py "
                    "_create_param_groups_fp16_flat_cpu_memory); one trainable parameter group "
                    "assumed (one buffer per group); " + PINNED_NOTE
                ),
            )
        )
        frozen = s.p_all - s.p_tr
        if frozen > 0 and not op_nvme:
            ctx.add(
                MemoryComponent(
                    "host_frozen_params",
                    "frozen parameter partitions (CPU)",
                    Device.HOST,
                    BudgetPhase.PERSISTENT,
                    s.e * frozen,
                    f"{s.e} B x {num(s.model.total_params - s.model.trainable)} frozen / {s.n}",
                    (s.op.device.key_path, s.op.pin_memory.key_path),
                    pinned=bool(s.op.pin_memory.value),
                )
            )
        if not op_nvme:
            pin_init = bool(s.op.pin_memory.value)
            ctx.add(
                MemoryComponent(
                    "host_param_init_copy",
                    "zero.Init partitions before they move to the flat buffer"
                    + (" (pinned, kept in torch's pinned cache)" if pin_init else ""),
                    Device.HOST,
                    BudgetPhase.PERSISTENT if pin_init else BudgetPhase.INIT,
                    int(s.e * s.p_tr * POW2_ROUNDING_FACTOR) if pin_init else s.e * s.p_tr,
                    f"{s.e} B x {num(s.model.trainable)} / {s.n}"
                    + (
                        f" x {POW2_ROUNDING_FACTOR:.2f} (power-of-two rounding)" if pin_init else ""
                    ),
                    (s.op.pin_memory.key_path,),
                    pinned=pin_init,
                    basis=Basis.ESTIMATE if pin_init else Basis.CODE,
                    requested_bytes=s.e * s.p_tr if pin_init else None,
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
            count = int(s.op.buffer_count.value)
            size = int(s.op.buffer_size.value)
            ctx.add(
                MemoryComponent(
                    "nvme_param_swap_buffers",
                    "NVMe parameter swap buffers",
                    Device.HOST,
                    BudgetPhase.PERSISTENT,
                    count * size * s.e,
                    f"buffer_count {count} x buffer_size {num(size)} x {s.e} B",
                    (s.op.buffer_count.key_path, s.op.buffer_size.key_path),
                    pinned=True,
                )
            )
    else:
        ctx.add(
            MemoryComponent(
                "host_defragment",
                "parameter partitions copied through the CPU (defragment)",
                Device.HOST,
                BudgetPhase.INIT,
                s.e * s.p_tr,
                f"{s.e} B x {num(s.model.trainable)} / {s.n}",
                (s.stage_key,),
            )
        )
    if s.z.gather_16bit_weights_on_model_save.value:
        ctx.add(
            MemoryComponent(
                "save_16bit_state_dict",
                "16-bit state dict gathered on rank 0 (save_16bit_model)",
                Device.HOST,
                BudgetPhase.CHECKPOINT_SAVE,
                s.e * s.model.total_params,
                f"{s.e} B x {num(s.model.total_params)}",
                (s.z.gather_16bit_weights_on_model_save.key_path,),
                per_host=True,
                note="rank 0's host only",
            )
        )
