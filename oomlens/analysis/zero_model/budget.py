"""The budget: every allocation DeepSpeed makes for a config, model and topology.

``build_budget`` lists them per GPU and per host (ZeRO-3 in ``stage3``, stages 0-2 in
``stage012``, the optional activation estimate), each with its formula and the config keys
that drive it, and computes the peaks over DeepSpeed's allocation order (``.timeline``).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

from oomlens.analysis.zero_model.accounting import num
from oomlens.analysis.zero_model.estimators import estimator_for
from oomlens.analysis.zero_model.stage012 import stage012
from oomlens.analysis.zero_model.stage3 import stage3
from oomlens.analysis.zero_model.timeline import gpu_peak, host_peak
from oomlens.facts.config import (
    ConfigValue,
    EffectiveDsConfig,
)
from oomlens.facts.memory_model import (
    DEFAULT_PROCESS_BASELINE_BYTES,
    ActivationShape,
    Basis,
    BudgetPhase,
    Device,
    MemoryBudget,
    MemoryComponent,
    ModelSize,
    Topology,
)

UNBOUNDED = 2**63 - 1


"""``sys.maxsize``: DeepSpeed's own "no limit" (``model_persistence_threshold``'s default)."""


def _bounded(effective: EffectiveDsConfig) -> EffectiveDsConfig:
    """``effective`` with every integer setting above ``UNBOUNDED`` set to it: for memory they
    mean the same (no model has that many elements), and the arithmetic stays in floats'
    range (a config may say 10**400)."""

    def bound(group: Any) -> Any:
        changes: dict[str, Any] = {}
        for spec in fields(group):
            value = getattr(group, spec.name)
            if isinstance(value, ConfigValue):
                if isinstance(value.value, int) and value.value > UNBOUNDED:
                    changes[spec.name] = replace(value, value=UNBOUNDED)
            elif is_dataclass(value):
                bounded = bound(value)
                if bounded is not value:
                    changes[spec.name] = bounded
        return replace(group, **changes) if changes else group

    result: EffectiveDsConfig = bound(effective)
    return result


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
    effective = _bounded(effective)
    stage = int(effective.zero.stage.value)
    if stage == 3:
        comps, assumptions = stage3(effective, model, topology)
    else:
        comps, assumptions = stage012(effective, model, topology, stage)
    if activations is not None:
        comps += _activation_components(activations, effective.precision.param_bytes)
    if process_baseline_bytes > 0:
        comps.insert(
            0,
            MemoryComponent(
                "host_process_baseline",
                "process baseline (Python, torch/CUDA libraries, page cache)",
                Device.HOST,
                BudgetPhase.PERSISTENT,
                process_baseline_bytes,
                f"{num(process_baseline_bytes)} B per rank",
                basis=Basis.ESTIMATE,
                note="measured on torch 2.11 / CUDA 13; set it for other environments",
            ),
        )
    budget = MemoryBudget(
        stage=stage,
        precision=effective.precision.model_precision,
        model=model,
        topology=topology,
        components=tuple(comps),
        gpu_peak_bytes=0,
        host_peak_bytes=0,
        assumptions=tuple(assumptions),
        estimator=estimator_for(effective, model, topology),
        activations=activations,
        process_baseline_bytes=process_baseline_bytes,
    )
    return replace(budget, gpu_peak_bytes=gpu_peak(budget), host_peak_bytes=host_peak(budget))


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
            BudgetPhase.FORWARD_BACKWARD,
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
                BudgetPhase.FORWARD_BACKWARD,
                b * s * shape.vocab_size * (e + 4 + 4),
                f"b {b} x s {s} x vocab {shape.vocab_size} x ({e} + 4 + 4) B",
                ("train_micro_batch_size_per_gpu",),
                basis=Basis.ESTIMATE,
            )
        )
    return comps
