"""ZeRO stages 0, 1 and 2's allocations, GPU and host, as DeepSpeed 0.19.8's stage_1_and_2.py
makes them (``stage012``).
"""

from __future__ import annotations

from oomlens.analysis.zero_model.accounting import (
    Ctx,
    ceil_div,
    num,
    optimizer_state_elements,
    precision_keys,
)
from oomlens.facts.config import (
    EffectiveDsConfig,
)
from oomlens.facts.memory_model import (
    Basis,
    BudgetPhase,
    Device,
    MemoryComponent,
    ModelSize,
    Topology,
)


def stage012(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology, stage: int
) -> tuple[list[MemoryComponent], list[str]]:
    ctx = Ctx(eff, model, topo)
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
    pkeys = precision_keys(eff)
    ctx.add(
        MemoryComponent(
            "param_full",
            "parameters (not partitioned below stage 3)",
            Device.GPU,
            BudgetPhase.PERSISTENT,
            e * model.total_params,
            f"{e} B x {num(model.total_params)}",
            (stage_key, *pkeys),
            basis=Basis.ESTIMATE,
        )
    )
    # Stage 2 offloading the optimizer copies each reduced gradient straight to the CPU (0.19.8
    # copy_grads_in_partition returns first): no GPU partition, except the compact one kept in
    # an fp32 grad_accum_dtype other than the model's.
    compact = stage >= 1 and prec.grad_accum_bytes == 4 != e
    e_g = 4 if compact else 0 if oo_on and stage >= 2 else e
    if e_g:
        ctx.add(
            MemoryComponent(
                "grads",
                "gradients" + (" (partitioned)" if stage >= 2 else ""),
                Device.GPU,
                BudgetPhase.PERSISTENT,
                e_g * (p_tr if stage < 2 else ceil_div(p_tr, n)),
                f"{e_g} B x {num(p_tr)}" + (f" / {n}" if stage >= 2 else ""),
                (stage_key, z.offload_optimizer.device.key_path, prec.grad_accum_dtype.key_path),
                basis=Basis.ESTIMATE,
            )
        )
    mixed = e == 2 or stage >= 1
    master = 4 * ceil_div(p_tr, part) if mixed else 0
    states = state_elems * 4 * ceil_div(p_tr, part)
    target = Device.HOST if oo_on else Device.GPU
    if master:
        ctx.add(
            MemoryComponent(
                "fp32_master",
                "fp32 master weights",
                target,
                BudgetPhase.PERSISTENT,
                master,
                f"4 B x {num(p_tr)}" + (f" / {n}" if part > 1 else ""),
                (stage_key, z.offload_optimizer.device.key_path),
                basis=Basis.ESTIMATE,
            )
        )
    ctx.add(
        MemoryComponent(
            "optimizer_states",
            "optimizer states",
            target,
            BudgetPhase.PERSISTENT,
            states,
            f"{state_elems} x 4 B x {num(p_tr)}" + (f" / {n}" if part > 1 else ""),
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
            BudgetPhase.OPTIMIZER_STEP if not oo_on else BudgetPhase.PERSISTENT,
            4 * ceil_div(p_tr, part),
            f"4 B x {num(p_tr)}" + (f" / {n}" if part > 1 else ""),
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
                    BudgetPhase.PERSISTENT,
                    e_c * rbs * buffers,
                    f"{e_c} B x reduce_bucket_size {num(rbs)} x {buffers}",
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
                BudgetPhase.OPTIMIZER_STEP,
                e * min(agb, model.total_params),
                f"{e} B x allgather_bucket_size {num(agb)}",
                (z.allgather_bucket_size.key_path,),
                basis=Basis.BOUND,
            )
        )
    return ctx.comps, ctx.assumptions
