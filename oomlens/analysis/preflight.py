"""Pre-flight a DeepSpeed config before burning GPU hours (``oomlens check``).

``preflight(document, ...)`` resolves the config the way DeepSpeed 0.19.8 does, validates it
(with DeepSpeed's own models when the ``deepspeed`` extra is installed), checks the batch
arithmetic at the GPU count, and - given a parameter count - builds the memory budget per GPU
and per host, compares it with the capacities given, and proposes the patches that would help.
"""

from __future__ import annotations

from oomlens.analysis.batch import (
    BatchCheck,
    BatchWorldSizes,
    batch_hazards,
    check_batch,
    world_sizes_accepted,
)
from oomlens.analysis.config_hazards import find_config_hazards
from oomlens.analysis.config_traps import (
    bf16_spelling_hazards,
    loss_scale_hazards,
    nvme_path_hazards,
)
from oomlens.analysis.ds_resolve import ResolutionContext, resolve_effective_config
from oomlens.analysis.ds_validation import (
    deepspeed_available,
    validate_with_deepspeed,
    validate_with_oomlens,
)
from oomlens.analysis.hf_auto import BATCH_KEYS, PRECISION_KEYS, describe_fills
from oomlens.analysis.zero_model import (
    build_budget,
    candidate_patches,
    compare_with_capacity,
    far_above_defaults,
    memory_hazards,
)
from oomlens.errors import ExitCode, OomlensError
from oomlens.facts.config import (
    ConfigDocument,
    ConfigSeverity,
    EffectiveDsConfig,
    Origin,
    Precision,
)
from oomlens.facts.memory_model import (
    DEFAULT_PROCESS_BASELINE_BYTES,
    ActivationShape,
    Capacity,
    CapacityVerdict,
    ConfigPatch,
    MemoryBudget,
    ModelSize,
    Topology,
)
from oomlens.facts.preflight import Preflight
from oomlens.facts.run import WorldSizeFact


def preflight(
    document: ConfigDocument,
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
) -> Preflight:
    """The whole check of ``document`` (see the module docstring).  Raises ``OomlensError``
    (usage) when DeepSpeed's validation is asked for and DeepSpeed is not installed."""
    notes: list[str] = []
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
    # "auto" is the HF Trainer's and Accelerate's placeholder, filled before DeepSpeed starts:
    # a config that holds one is written for them unless --integration deepspeed says not.
    filled = integration != "deepspeed" and bool(effective.auto_keys)
    batch_autos = [k for k in BATCH_KEYS if k in effective.auto_keys]
    if filled and batch_autos:
        # the triple DeepSpeed checks is the one the integration writes, not this one
        problems = tuple(p for p in problems if not p.code.startswith("batch_"))
    precision_pending = (
        filled
        and precision is None
        and any(
            v.origin is Origin.AUTO_UNRESOLVED and v.key_path in PRECISION_KEYS
            for v in (effective.precision.fp16_enabled, effective.precision.bf16_enabled)
        )
    )
    if filled:
        who = "Accelerate" if integration == "accelerate" else "the HF Trainer"
        if integration is None:
            notes.append(
                '"auto" values: read as a config for the HF Trainer or Accelerate, which fill '
                "them at launch (pass --integration deepspeed if DeepSpeed reads this file "
                "directly)"
            )
        if integration == "accelerate":
            notes.append(
                'Accelerate fills these "auto" values at prepare() from its own settings and '
                "the dataloader: " + ", ".join(effective.auto_keys)
            )
        else:
            notes += describe_fills(effective.auto_keys)
        if precision_pending:
            notes.append(
                f'precision is "auto": {who} enables fp16 or bf16 from its --fp16 / --bf16 '
                "flag; pass --precision bf16, fp16 or fp32 for the memory budget"
            )

    hazards = list(find_config_hazards(document, effective, integration=integration))
    if precision_pending:
        # fp32 is only what DeepSpeed alone would make of the "auto": not known here
        hazards = [h for h in hazards if h.code != "fp32_fallback"]
    hazards += bf16_spelling_hazards(document, integration)
    hazards += nvme_path_hazards(document, effective)
    hazards += loss_scale_hazards(document)
    if params is None:
        # no budget to size them: the settings themselves are the warning
        hazards += far_above_defaults(effective)
    batch: BatchCheck | None = None
    world_sizes: BatchWorldSizes | None = None
    if batch_autos and filled:
        notes.append(
            f'{", ".join(batch_autos)}: "auto", filled by the integration from its own '
            "arguments; the batch triple is not checked"
        )
    elif gpus is not None:
        batch = check_batch(effective, WorldSizeFact(gpus, "--gpus"))
        hazards += batch_hazards(batch)
    else:
        accepted = world_sizes_accepted(effective)
        if accepted.limit and (
            accepted.sizes or not any(p.code.startswith("batch_") for p in problems)
        ):
            world_sizes = accepted
            notes.append(
                f"no --gpus: the batch triple ({accepted.triple}) {accepted.describe()}: "
                "DeepSpeed asserts train_batch_size = micro x accumulation x GPUs; pass --gpus "
                "to check it at yours"
            )
        else:
            notes.append(
                "no --gpus: the batch triple is only checked for problems at every world size"
            )

    budget: MemoryBudget | None = None
    verdicts: tuple[CapacityVerdict, ...] = ()
    patches: tuple[ConfigPatch, ...] = ()
    if params is not None and precision_pending:
        notes.append("memory budget skipped: the precision is set at launch (see above)")
    elif params is not None:
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
    elif params is None:
        notes.append("no --params: memory budget skipped")
    order = {s: i for i, s in enumerate(ConfigSeverity)}
    hazards.sort(key=lambda h: order[h.severity])
    return Preflight(
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
        precision_pending=precision_pending,
        world_sizes=world_sizes,
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
