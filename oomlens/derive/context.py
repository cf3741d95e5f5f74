"""The run's context (``oomlens.facts.context``) from every input that shows a part of it.

Sources, best first for each key: the values DeepSpeed really ran with (its config, explicit
or dumped: a default is not a statement about the run) and the command line's hints; the OOM
message (the card, the per-process cap); what the logs state (``LogFacts.context``); then what
a model's name or a card's name implies.  The first source that has a key gives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import regex

from oomlens.analysis.allocator_common import K_MIN_LARGE_ALLOC, K_ROUND_LARGE
from oomlens.facts.config import EXPLICIT_ORIGINS, ConfigValue, Origin
from oomlens.facts.context import Certainty, ContextKey, ContextValue, RunContext
from oomlens.facts.run import RunFacts
from oomlens.ingest.context_lines import model_size_params
from oomlens.knowledge.allocation_sites import partition_elements_at_least, zero_stage_of
from oomlens.units import printed_size_error

K = ContextKey
_STATED_ORIGINS = EXPLICIT_ORIGINS | {Origin.LOG_DUMP, Origin.AUTO_RESOLVED}
_CARD_MEMORY = regex.compile(r"(?<!\d)(\d{1,3})\s?GB\b")
"""``A100-SXM4-80GB``, ``H100 80GB HBM3``: the card's memory in GiB (80 GB cards hold 80 GiB)."""


def derive_context(facts: RunFacts) -> RunContext:
    """Every value the inputs show, one per key (see the module docstring)."""
    found: dict[ContextKey, ContextValue] = {}
    for value in _ordered(facts):
        found.setdefault(value.key, value)
    return RunContext(found)


def _ordered(facts: RunFacts) -> Iterator[ContextValue]:
    yield from _from_config(facts)
    counted_trainable = False
    if facts.params is not None:
        # HF Trainer's "Number of trainable parameters = N" counts what trains (LoRA's
        # adapters): the model is at least that, its size is better read from its name
        counted_trainable = any(
            log.param_count is not None
            and log.param_count.source == facts.params.source
            and log.param_count.trainable == log.param_count.total
            and log.param_count.origin == "hf_trainer"
            for log in facts.logs
        )
        if not counted_trainable:
            yield ContextValue(
                K.PARAMS,
                facts.params.total,
                Certainty.STATED,
                facts.params.origin,
                facts.params.source,
            )
    for log in facts.logs:
        count = log.param_count
        if count is not None and count.trainable is not None:
            yield ContextValue(
                K.TRAINABLE_PARAMS, count.trainable, Certainty.STATED, count.origin, count.source
            )
    if facts.world_size is not None:
        world = facts.world_size
        yield ContextValue(
            K.WORLD_SIZE,
            world.value,
            Certainty.INFERRED if world.lower_bound else Certainty.STATED,
            world.origin,
            world.source,
        )
    yield from _from_oom_message(facts)
    if facts.gpu_memory is not None:
        yield ContextValue(K.GPU_CAPACITY, facts.gpu_memory, Certainty.STATED, "--gpu-memory")
    if facts.host_memory is not None:
        yield ContextValue(
            K.HOST_MEMORY, facts.host_memory, Certainty.STATED, facts.host_memory_origin
        )
    stated = [value for log in facts.logs for value in log.context]
    yield from stated
    yield from _from_failing_frames(facts, stated)
    yield from _implied(stated)
    if counted_trainable and facts.params is not None:
        yield ContextValue(
            K.PARAMS,
            facts.params.total,
            Certainty.INFERRED,
            f"{facts.params.origin}: the trainable parameters (all of them when none is frozen)",
            facts.params.source,
        )


def _config_value(
    key: ContextKey, setting: ConfigValue[Any], value: object | None = None
) -> Iterable[ContextValue]:
    if setting.origin not in _STATED_ORIGINS and setting.origin is not Origin.DERIVED:
        return ()
    shown = setting.value if value is None else value
    if not isinstance(shown, int | float | str | bool):
        return ()
    certainty = Certainty.DERIVED if setting.origin is Origin.DERIVED else Certainty.STATED
    return (
        ContextValue(
            key,
            shown,
            certainty,
            f"ds_config {setting.key_path}",
            setting.source,
            f"{setting.key_path} = {setting.value}",
        ),
    )


def _from_config(facts: RunFacts) -> Iterator[ContextValue]:
    if facts.config is None:
        return
    effective = facts.config.reading.effective
    batch = effective.batch
    if isinstance(batch.micro_batch_per_gpu.value, int):
        yield from _config_value(K.MICRO_BATCH, batch.micro_batch_per_gpu)
    if isinstance(batch.gradient_accumulation_steps.value, int):
        yield from _config_value(K.GRAD_ACCUM, batch.gradient_accumulation_steps)
    zero = effective.zero
    yield from _config_value(K.ZERO_STAGE, zero.stage)
    yield from _config_value(
        K.OFFLOAD_OPTIMIZER,
        zero.offload_optimizer.device,
        zero.offload_optimizer.device.value in ("cpu", "nvme"),
    )
    yield from _config_value(
        K.OFFLOAD_PARAM,
        zero.offload_param.device,
        zero.offload_param.device.value in ("cpu", "nvme"),
    )
    precision = effective.precision
    if precision.bf16_enabled.value is True:
        yield from _config_value(K.PRECISION, precision.bf16_enabled, "bf16")
    elif precision.fp16_enabled.value is True:
        yield from _config_value(K.PRECISION, precision.fp16_enabled, "fp16")
    kind = effective.optimizer.type.value
    if isinstance(kind, str):
        yield from _config_value(K.OPTIMIZER, effective.optimizer.type, kind.lower())


def _from_oom_message(facts: RunFacts) -> Iterator[ContextValue]:
    event = facts.first_gpu_oom()
    if event is None:
        return
    message = event.message
    limit = message.allowed or message.total_capacity
    if limit:
        what = "allowed" if message.allowed else "total capacity"
        yield ContextValue(
            K.GPU_CAPACITY,
            limit,
            Certainty.STATED,
            f"OOM message ({what})",
            event.source,
        )


def _tensor_at_least(printed: int) -> int:
    """The least a failing tensor can have held when torch printed ``Tried to allocate
    <printed>``: the figure is rounded (``printed_size_error``) and is the block size, which
    ``get_allocation_size`` rounds up from the tensor's (to ``K_ROUND_LARGE`` from
    ``K_MIN_LARGE_ALLOC`` on, by default)."""
    low = printed - printed_size_error(printed)
    return max(0, low - (K_ROUND_LARGE if low >= K_MIN_LARGE_ALLOC else 0))


def _from_failing_frames(facts: RunFacts, stated: list[ContextValue]) -> Iterator[ContextValue]:
    """What the first GPU OOM's traceback implies (``oomlens.knowledge.allocation_sites``):
    the ZeRO stage whose optimizer file it passes through, and a lower bound of the parameters
    from a request at a site that allocates the rank's partition."""
    event = facts.first_gpu_oom()
    if event is None or event.traceback is None:
        return
    frames = event.traceback.frames
    where = event.traceback.source
    stage = next((s for f in frames if (s := zero_stage_of(f.filename)) is not None), None)
    if stage is not None:
        yield ContextValue(
            K.ZERO_STAGE, stage, Certainty.DERIVED, "the failing traceback's ZeRO optimizer", where
        )
    request = event.message.tried_to_allocate
    if request is None:
        return
    for frame in reversed(frames):
        elements = partition_elements_at_least(
            frame.filename, frame.function, _tensor_at_least(request)
        )
        if elements is None:
            continue
        world = facts.world_size.value if facts.world_size is not None else None
        if world is None:
            world = next(
                (
                    int(v.value)
                    for v in stated
                    if v.key is K.WORLD_SIZE and isinstance(v.value, int)
                ),
                1,
            )
        yield ContextValue(
            K.PARAMS_AT_LEAST,
            elements * world,
            Certainty.DERIVED,
            f"the failing request at {frame.function}: {elements:,} elements of the rank's "
            f"partition x {world} rank(s)",
            event.source,
        )
        return


def _implied(stated: list[ContextValue]) -> Iterator[ContextValue]:
    """What names imply: a model id's size, a card's memory in its name."""
    for value in stated:
        if value.key is K.MODEL_NAME and isinstance(value.value, str):
            params = model_size_params(value.value)
            if params is not None:
                yield ContextValue(
                    K.PARAMS,
                    params,
                    Certainty.INFERRED,
                    f"the model's name ({value.value})",
                    value.source,
                    value.text,
                )
        if value.key is K.GPU_NAME and isinstance(value.value, str):
            memory = _CARD_MEMORY.search(value.value)
            if memory is not None:
                yield ContextValue(
                    K.GPU_CAPACITY,
                    int(memory.group(1)) * 2**30,
                    Certainty.INFERRED,
                    f"the card's name ({value.value})",
                    value.source,
                    value.text,
                )
