"""``oomlens check``: pre-flight a ds_config before burning GPU hours.

Reads the config the way DeepSpeed 0.19.8 does, validates it (with DeepSpeed's own models when
the ``deepspeed`` extra is installed), checks the batch arithmetic at the GPU count, and - given
a parameter count - prints the memory budget per GPU and per host against the capacities
given.  Exit status: 0 when the config is valid and fits, 4 when it is invalid or cannot fit
(so it can gate a launch script), 2 for a bad command line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from oomlens.analysis.batch import BatchCheck, WorldSize, batch_hazards, check_batch
from oomlens.analysis.ds_resolve import ResolutionContext, resolve_effective_config
from oomlens.analysis.ds_validation import (
    deepspeed_available,
    find_config_hazards,
    validate_with_deepspeed,
    validate_with_oomlens,
)
from oomlens.analysis.zero_model import (
    build_budget,
    candidate_patches,
    compare_with_capacity,
    memory_hazards,
)
from oomlens.cli.params import COUNT, SIZE, SIZE_OR_ZERO
from oomlens.errors import ExitCode, InputError, OomlensError
from oomlens.facts.config import (
    ConfigDocument,
    ConfigHazard,
    ConfigValue,
    EffectiveDsConfig,
    Precision,
    Severity,
    ValidationProblem,
)
from oomlens.facts.memory_model import (
    DEFAULT_PROCESS_BASELINE_BYTES,
    ActivationShape,
    Capacity,
    CapacityVerdict,
    ConfigPatch,
    Device,
    MemoryBudget,
    ModelSize,
    Topology,
)
from oomlens.ingest.ds_config import read_ds_config
from oomlens.units import format_size


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Everything ``oomlens check`` found, for the text and JSON renderings."""

    document: ConfigDocument
    effective: EffectiveDsConfig
    validator: str
    problems: tuple[ValidationProblem, ...]
    batch: BatchCheck | None
    budget: MemoryBudget | None
    verdicts: tuple[CapacityVerdict, ...]
    hazards: tuple[ConfigHazard, ...]
    patches: tuple[ConfigPatch, ...]
    notes: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def fits(self) -> bool:
        return all(v.fits for v in self.verdicts)


def run_check(
    config_path: str,
    *,
    params: int | None = None,
    trainable_params: int | None = None,
    largest_layer: int | None = None,
    hidden_size: int | None = None,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    gpu_memory: int | None = None,
    host_memory: int | None = None,
    precision: str | None = None,
    integration: str | None = None,
    validator: str = "auto",
    seq_len: int | None = None,
    layers: int | None = None,
    vocab_size: int | None = None,
    micro_batch: int | None = None,
    activation_checkpointing: bool = False,
    host_baseline: int = DEFAULT_PROCESS_BASELINE_BYTES,
) -> CheckResult:
    """The whole check, without printing.  Raises ``InputError`` for an unreadable config."""
    notes: list[str] = []
    document = read_ds_config(config_path)
    context = ResolutionContext(
        hidden_size=hidden_size,
        hidden_size_source="--hidden-size" if hidden_size else "",
        precision=Precision(precision) if precision else None,
        precision_source="--precision" if precision else "",
        integration=integration,
    )
    effective = resolve_effective_config(document, context)

    use_ds = validator == "deepspeed" or (validator == "auto" and deepspeed_available())
    if validator == "deepspeed" and not deepspeed_available():
        raise OomlensError(
            "--validator deepspeed: DeepSpeed is not importable here (install oomlens[deepspeed])",
            exit_code=ExitCode.USAGE,
        )
    if use_ds:
        problems = tuple(validate_with_deepspeed(document, world_size=gpus))
        used = "DeepSpeed's own config models"
    else:
        problems = tuple(validate_with_oomlens(document, world_size=gpus))
        used = (
            "oomlens (DeepSpeed 0.19.8 rules; deepspeed not installed)"
            if validator == "auto"
            else "oomlens"
        )
    if integration in ("hf", "accelerate"):
        # "auto" is expected there: the batch keys are filled by the integration.
        problems = tuple(p for p in problems if p.code != "batch_type_error")

    hazards = list(find_config_hazards(document, effective, integration=integration))
    batch: BatchCheck | None = None
    batch_autos = [
        v.key_path
        for v in (
            effective.batch.train_batch_size,
            effective.batch.micro_batch_per_gpu,
            effective.batch.gradient_accumulation_steps,
        )
        if v.value == "auto"
    ]
    if batch_autos and integration in ("hf", "accelerate"):
        notes.append(
            f'{", ".join(batch_autos)}: "auto", filled by the integration from its own '
            "arguments; the batch triple is not checked"
        )
    elif gpus is not None:
        batch = check_batch(effective, WorldSize(gpus, "--gpus"))
        hazards += batch_hazards(batch)
    else:
        notes.append("no --gpus: the batch triple is only checked for problems at every world size")

    budget: MemoryBudget | None = None
    verdicts: tuple[CapacityVerdict, ...] = ()
    patches: tuple[ConfigPatch, ...] = ()
    if params is not None:
        world = gpus or 1
        if gpus is None:
            notes.append("no --gpus: the memory budget assumes 1 GPU")
        per_node = gpus_per_node or min(world, 8)
        if gpus_per_node is None and world > 8:
            notes.append(f"no --gpus-per-node: {per_node} GPUs per host assumed")
        model = ModelSize(
            total_params=params,
            trainable_params=trainable_params,
            largest_layer_params=largest_layer,
            hidden_size=hidden_size,
            source="--params",
        )
        topology = Topology(world_size=world, gpus_per_node=per_node)
        shape = _activation_shape(
            effective,
            batch,
            notes,
            micro_batch,
            seq_len,
            hidden_size,
            layers,
            vocab_size,
            activation_checkpointing,
        )
        budget = build_budget(
            effective, model, topology, shape, process_baseline_bytes=host_baseline
        )
        capacity = Capacity(
            gpu_bytes=gpu_memory,
            gpu_source="--gpu-memory" if gpu_memory else "",
            host_bytes=host_memory,
            host_source="--host-memory" if host_memory else "",
        )
        verdicts = tuple(compare_with_capacity(budget, capacity))
        hazards += memory_hazards(effective, budget, verdicts)
        if any(not v.fits for v in verdicts):
            patches = tuple(
                candidate_patches(
                    effective,
                    model,
                    topology,
                    capacity,
                    verdicts=verdicts,
                    activations=shape,
                    process_baseline_bytes=host_baseline,
                )
            )
        if gpu_memory is None and host_memory is None:
            notes.append("no --gpu-memory / --host-memory: nothing to compare the budget with")
    else:
        notes.append("no --params: memory budget skipped")
    order = {s: i for i, s in enumerate(Severity)}
    hazards.sort(key=lambda h: order[h.severity])
    return CheckResult(
        document=document,
        effective=effective,
        validator=used,
        problems=problems,
        batch=batch,
        budget=budget,
        verdicts=verdicts,
        hazards=tuple(hazards),
        patches=patches,
        notes=tuple(notes),
    )


def _activation_shape(
    effective: EffectiveDsConfig,
    batch: BatchCheck | None,
    notes: list[str],
    micro_batch: int | None,
    seq_len: int | None,
    hidden_size: int | None,
    layers: int | None,
    vocab_size: int | None,
    checkpointing: bool,
) -> ActivationShape | None:
    """The activation estimate's inputs, when the command line gives them."""
    if seq_len is None and layers is None:
        return None
    if seq_len is None or layers is None or hidden_size is None:
        notes.append("activation estimate skipped: it needs --seq-len, --layers and --hidden-size")
        return None
    micro = micro_batch
    if micro is None and batch is not None and batch.derived is not None:
        derived = batch.derived.micro_batch_per_gpu
        micro = derived if isinstance(derived, int) and not isinstance(derived, bool) else None
    if micro is None:
        written = effective.batch.micro_batch_per_gpu.value
        micro = written if isinstance(written, int) and not isinstance(written, bool) else None
    if micro is None:
        notes.append("activation estimate skipped: the micro batch is unknown (pass --micro-batch)")
        return None
    return ActivationShape(
        micro_batch=micro,
        seq_len=seq_len,
        hidden_size=hidden_size,
        layers=layers,
        vocab_size=vocab_size,
        checkpointing=checkpointing,
    )


# -- text rendering ----------------------------------------------------------------------------


def _line(ref: Any) -> str:
    return ref.describe() if ref is not None else ""


def render_text(result: CheckResult) -> str:
    eff = result.effective
    z = eff.zero
    out: list[str] = []
    doc = result.document
    out.append(f"{doc.path}: {doc.syntax} ds_config, validated by {result.validator}")
    offload = []
    for label, block in (("optimizer", z.offload_optimizer), ("params", z.offload_param)):
        if block.enabled:
            offload.append(
                f"{label}={block.device.value}{' (pinned)' if block.pin_memory.value else ''}"
            )
    out.append(
        f"  ZeRO stage {z.stage.value} ({z.stage.origin.value}), "
        f"{eff.precision.model_precision.value}, "
        f"offload: {', '.join(offload) if offload else 'none'}"
    )
    out.append("")
    out.append("Settings that drive memory (value, how it was set):")
    out += [f"  {line}" for line in _memory_settings(eff)]
    if result.problems:
        out.append("")
        out.append(f"Problems - DeepSpeed refuses this config ({len(result.problems)}):")
        for problem in result.problems:
            where = _line(problem.source)
            out.append(
                f"  {where}: {problem.key_path or '(config)'}: {problem.message} [{problem.code}]"
            )
    if result.batch is not None:
        out.append("")
        out += _render_batch(result.batch)
    if result.budget is not None:
        out.append("")
        out += _render_budget(result.budget, result.verdicts)
    if result.hazards:
        out.append("")
        out.append("Hazards:")
        for hazard in result.hazards:
            out.append(f"  [{hazard.severity.value}] {hazard.message}")
            where = ", ".join(_line(s) for s in hazard.sources if s is not None)
            if where:
                out.append(f"         at {where}")
    if result.patches:
        out.append("")
        out.append("Changes that would help (JSON merge patches, predicted by the memory model):")
        for index, patch in enumerate(result.patches, start=1):
            effect = []
            if patch.gpu_bytes_saved:
                verb = "saves" if patch.gpu_bytes_saved > 0 else "costs"
                effect.append(f"{verb} {format_size(abs(patch.gpu_bytes_saved))} per GPU")
            if patch.host_bytes_delta:
                sign = "+" if patch.host_bytes_delta > 0 else "-"
                effect.append(f"host {sign}{format_size(abs(patch.host_bytes_delta))}")
            if patch.pinned_bytes_delta:
                sign = "+" if patch.pinned_bytes_delta > 0 else "-"
                effect.append(f"pinned {sign}{format_size(abs(patch.pinned_bytes_delta))}")
            out.append(f"  {index}. {patch.summary}: {', '.join(effect) or 'no predicted change'}")
            out.append(f"     cost: {patch.cost}")
            out.append(f"     {json.dumps(patch.merge_patch())}")
    if result.notes:
        out.append("")
        out += [f"note: {note}" for note in result.notes]
    out.append("")
    out.append("Verdict: " + _verdict_text(result))
    return "\n".join(out)


def _memory_settings(eff: EffectiveDsConfig) -> list[str]:
    z = eff.zero
    values: list[ConfigValue[Any]] = [
        z.stage,
        eff.precision.bf16_enabled,
        eff.precision.fp16_enabled,
        z.reduce_bucket_size,
        z.overlap_comm,
        z.contiguous_gradients,
        z.sub_group_size,
    ]
    if int(z.stage.value) == 3:
        values += [
            z.prefetch_bucket_size,
            z.max_live_parameters,
            z.max_reuse_distance,
            z.param_persistence_threshold,
        ]
    else:
        values.append(z.allgather_bucket_size)
    for block in (z.offload_optimizer, z.offload_param):
        values.append(block.device)
        if block.enabled:
            values.append(block.pin_memory)
    return [value.cite() for value in values]


def _human_count(value: int) -> str:
    for factor, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return str(value)


def _render_batch(batch: BatchCheck) -> list[str]:
    ws = batch.world_size.value
    lines = []
    if batch.ok and batch.derived is not None:
        d = batch.derived
        lines.append(
            f"Batch at {ws} GPUs: train_batch_size {d.train_batch_size} = micro "
            f"{d.micro_batch_per_gpu} x "
            f"gradient accumulation {d.gradient_accumulation_steps} x {ws} GPUs"
        )
        lines += [f"  derived: {step}" for step in batch.derivations]
        if batch.floor_loss:
            lines.append("  note: a floor division dropped a remainder")
    else:
        lines.append(f"Batch at {ws} GPUs: DeepSpeed fails with")
        lines.append(f"  {batch.error}")
        lines += [f"  derived: {step}" for step in batch.derivations]
    for correction in batch.corrections:
        t = correction.triple
        effect = (
            "changes the global batch"
            if correction.changes_effective_batch
            else "same global batch"
        )
        lines.append(
            f"  fix (keeps {correction.keeps}; {effect}): micro {t.micro_batch_per_gpu} x gas "
            f"{t.gradient_accumulation_steps} x {ws} = {t.train_batch_size}  "
            f"{json.dumps(correction.patch.merge_patch())}"
        )
    return lines


def _render_budget(budget: MemoryBudget, verdicts: tuple[CapacityVerdict, ...]) -> list[str]:
    m = budget.model
    topo = budget.topology
    lines = [
        f"Memory per GPU: {_human_count(m.total_params)} params, {topo.world_size} GPU(s), "
        f"{budget.precision.value}, "
        f"ZeRO stage {budget.stage}"
    ]
    lines += _component_rows(budget, Device.GPU)
    by_kind = {v.kind: v for v in verdicts}
    lines.append(f"  {'peak':40} {format_size(budget.gpu_peak_bytes):>11}")
    gpu = by_kind.get("gpu")
    if gpu is not None:
        lines.append(
            f"  {'capacity (' + gpu.capacity_source + ')':40} {format_size(gpu.capacity_bytes):>11}"
        )
        if gpu.fits:
            lines.append(
                f"  {'left for activations and workspace':40} {format_size(gpu.headroom_bytes):>11}"
            )
        else:
            comp = gpu.overflow_component
            lines.append(
                f"  OVERFLOW by {format_size(gpu.overflow_bytes)}: at "
                f"'{comp.name if comp else '?'}' "
                f"during {gpu.overflow_phase}"
            )
    host_rows = _component_rows(budget, Device.HOST)
    lines.append("")
    lines.append(f"Memory per host: {topo.ranks_per_host} rank(s) per host")
    if host_rows:
        lines += host_rows
    else:
        lines.append("  (nothing DeepSpeed keeps on the host)")
    lines.append(f"  {'peak':40} {format_size(budget.host_peak_bytes):>11}")
    pinned_line = f"  {'pinned (page-locked)':40} {format_size(budget.pinned_per_host()):>11}"
    requested = budget.pinned_requested_per_rank() * topo.ranks_per_host
    if requested and requested != budget.pinned_per_host():
        pinned_line += (
            f"  (DeepSpeed requests {format_size(requested)}; torch rounds each pinned buffer "
            "up to a power of two)"
        )
    lines.append(pinned_line)
    host = by_kind.get("host")
    if host is not None:
        lines.append(
            f"  {'capacity (' + host.capacity_source + ')':40} "
            f"{format_size(host.capacity_bytes):>11}"
        )
        if not host.fits:
            comp = host.overflow_component
            lines.append(
                f"  OVERFLOW by {format_size(host.overflow_bytes)}: at "
                f"'{comp.name if comp else '?'}' "
                f"during {host.overflow_phase}"
            )
    if budget.estimator is not None:
        est = budget.estimator
        lines.append("")
        unknown = " (largest layer unknown: counted as 0)" if m.largest_layer_params is None else ""
        lines.append(
            f"DeepSpeed's {est.function}: {format_size(est.gpu_bytes or 0)} per GPU{unknown}, "
            f"{format_size(est.host_bytes or 0)} per host (model states only, host x1.5 buffer "
            "factor)"
        )
    if budget.assumptions:
        lines.append("Assumptions: " + "; ".join(budget.assumptions))
    return lines


def _component_rows(budget: MemoryBudget, device: Device) -> list[str]:
    rows = []
    ranks = budget.topology.ranks_per_host
    for comp in budget.on(device):
        value = comp.bytes
        if device is Device.HOST and not comp.per_host:
            value *= ranks
        flags = []
        if comp.pinned:
            flags.append("pinned")
        if comp.basis.value != "code":
            flags.append(comp.basis.value)
        flag = f" [{', '.join(flags)}]" if flags else ""
        rows.append(
            f"  {comp.name[:40]:40} {format_size(value):>11}  {comp.phase.value:17} "
            f"{comp.formula}{flag}"
        )
    return rows


def _verdict_text(result: CheckResult) -> str:
    reasons = []
    if not result.valid:
        reasons.append(f"INVALID ({len(result.problems)} problem(s))")
    if (
        result.batch is not None
        and not result.batch.ok
        and not any(p.code.startswith("batch_") for p in result.problems)
    ):
        reasons.append("INVALID (batch)")
    reasons += [
        f"CANNOT FIT ({verdict.kind} short by {format_size(verdict.overflow_bytes)})"
        for verdict in result.verdicts
        if not verdict.fits
    ]
    if reasons:
        return "; ".join(reasons)
    if result.verdicts:
        return "OK: valid and fits"
    return "OK: valid" + ("" if result.budget is not None else " (no memory check)")


def failed(result: CheckResult) -> bool:
    return (
        not result.valid
        or (result.batch is not None and not result.batch.ok)
        or any(not v.fits for v in result.verdicts)
    )


def render_json(result: CheckResult) -> str:
    def verdict(v: CapacityVerdict) -> dict[str, Any]:
        return {
            "kind": v.kind,
            "capacity_bytes": v.capacity_bytes,
            "required_bytes": v.required_bytes,
            "headroom_bytes": v.headroom_bytes,
            "fits": v.fits,
            "peak_phase": v.peak_phase,
            "overflow_component": v.overflow_component.code if v.overflow_component else None,
            "overflow_phase": v.overflow_phase,
            "overflow_bytes": v.overflow_bytes,
        }

    payload: dict[str, Any] = {
        "config": result.document.path,
        "validator": result.validator,
        "valid": result.valid,
        "problems": [
            {
                "key_path": p.key_path,
                "code": p.code,
                "message": p.message,
                "line": p.source.line if p.source else None,
            }
            for p in result.problems
        ],
        "effective": {k: v for k, v in result.effective.settings().items() if _json_safe(v)},
        "batch": None
        if result.batch is None
        else {
            "ok": result.batch.ok,
            "error": result.batch.error,
            "derived": None
            if result.batch.derived is None
            else {
                "train_batch_size": result.batch.derived.train_batch_size,
                "train_micro_batch_size_per_gpu": result.batch.derived.micro_batch_per_gpu,
                "gradient_accumulation_steps": result.batch.derived.gradient_accumulation_steps,
            },
            "corrections": [c.patch.merge_patch() for c in result.batch.corrections],
        },
        "budget": None
        if result.budget is None
        else {
            "gpu_peak_bytes": result.budget.gpu_peak_bytes,
            "host_peak_bytes": result.budget.host_peak_bytes,
            "pinned_per_host_bytes": result.budget.pinned_per_host(),
            "components": [
                {
                    "code": c.code,
                    "device": c.device.value,
                    "phase": c.phase.value,
                    "bytes": c.bytes,
                    "per": "host" if c.per_host else ("gpu" if c.device is Device.GPU else "rank"),
                    "pinned": c.pinned,
                    "basis": c.basis.value,
                    "formula": c.formula,
                    "key_paths": list(c.key_paths),
                }
                for c in result.budget.components
            ],
        },
        "verdicts": [verdict(v) for v in result.verdicts],
        "hazards": [
            {
                "code": h.code,
                "severity": h.severity.value,
                "message": h.message,
                "key_paths": list(h.key_paths),
            }
            for h in result.hazards
        ],
        "patches": [
            {
                "summary": p.summary,
                "merge_patch": p.merge_patch(),
                "gpu_bytes_saved": p.gpu_bytes_saved,
                "host_bytes_delta": p.host_bytes_delta,
                "pinned_bytes_delta": p.pinned_bytes_delta,
                "cost": p.cost,
            }
            for p in result.patches
        ],
        "notes": list(result.notes),
        "failed": failed(result),
    }
    return json.dumps(payload, indent=2, sort_keys=False)


def _json_safe(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


@click.command("check")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--params", type=COUNT, help="Total parameter count (7e9, 7B, 350M).")
@click.option(
    "--trainable-params", type=COUNT, help="Trainable parameters, if fewer (LoRA, frozen layers)."
)
@click.option(
    "--largest-layer", type=COUNT, help="Parameters of the largest module (often the embedding)."
)
@click.option(
    "--hidden-size", type=int, help='Model hidden size: resolves HF "auto" bucket values.'
)
@click.option(
    "--gpus", type=click.IntRange(min=1), help="Data-parallel GPUs (the DeepSpeed world size)."
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    help="GPUs per host (default: --gpus, at most 8).",
)
@click.option("--gpu-memory", type=SIZE, help="Memory of one GPU (80GiB).")
@click.option("--host-memory", type=SIZE, help="RAM of one host, or its container limit (512GiB).")
@click.option(
    "--host-baseline",
    type=SIZE_OR_ZERO,
    default=DEFAULT_PROCESS_BASELINE_BYTES,
    show_default="1.2 GB, measured on torch 2.11/CUDA 13",
    help="Host memory each rank uses besides DeepSpeed's buffers (Python, libraries, CUDA).",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    help='Training precision, to resolve "auto" in fp16/bf16 (the HF Trainer\'s --bf16/--fp16).',
)
@click.option(
    "--integration",
    type=click.Choice(["hf", "accelerate", "deepspeed"]),
    help="Who launches with this config: the HF Trainer, Accelerate, or DeepSpeed directly.",
)
@click.option(
    "--validator",
    type=click.Choice(["auto", "deepspeed", "oomlens"]),
    default="auto",
    show_default=True,
    help="Validate with DeepSpeed's models (when installed) or oomlens' restatement of them.",
)
@click.option(
    "--seq-len", type=click.IntRange(min=1), help="Sequence length (activation estimate)."
)
@click.option(
    "--layers", type=click.IntRange(min=1), help="Transformer layers (activation estimate)."
)
@click.option("--vocab-size", type=click.IntRange(min=1), help="Vocabulary size (logits estimate).")
@click.option(
    "--micro-batch",
    type=click.IntRange(min=1),
    help='Micro batch per GPU, when the config\'s is "auto" (activation estimate).',
)
@click.option(
    "--activation-checkpointing",
    is_flag=True,
    help="The model checkpoints every layer's activations (activation estimate).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
)
def check(
    config: Path,
    params: int | None,
    trainable_params: int | None,
    largest_layer: int | None,
    hidden_size: int | None,
    gpus: int | None,
    gpus_per_node: int | None,
    gpu_memory: int | None,
    host_memory: int | None,
    host_baseline: int,
    precision: str | None,
    integration: str | None,
    validator: str,
    seq_len: int | None,
    layers: int | None,
    vocab_size: int | None,
    micro_batch: int | None,
    activation_checkpointing: bool,
    output_format: str,
) -> None:
    """Check a DeepSpeed config before launch: validity, batch arithmetic, memory budget.

    Exits 0 when the config is valid and fits, 4 when it is invalid or cannot fit.
    """
    if trainable_params is not None and params is not None and trainable_params > params:
        raise click.BadParameter("--trainable-params is larger than --params")
    if largest_layer is not None and params is not None and largest_layer > params:
        raise click.BadParameter("--largest-layer is larger than --params")
    try:
        result = run_check(
            str(config),
            params=params,
            trainable_params=trainable_params,
            largest_layer=largest_layer,
            hidden_size=hidden_size,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            gpu_memory=gpu_memory,
            host_memory=host_memory,
            precision=precision,
            integration=integration,
            validator=validator,
            seq_len=seq_len,
            layers=layers,
            vocab_size=vocab_size,
            micro_batch=micro_batch,
            activation_checkpointing=activation_checkpointing,
            host_baseline=host_baseline,
        )
    except InputError as err:
        err.exit_code = ExitCode.CHECK_FAILED
        raise
    click.echo(render_json(result) if output_format == "json" else render_text(result))
    if failed(result):
        raise OomlensError(
            f"check failed: {_verdict_text(result)}", exit_code=ExitCode.CHECK_FAILED
        )
