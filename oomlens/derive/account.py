"""The memory account of the first GPU OOM (``oomlens.facts.account``).

The OOM message is the frame: what torch had allocated and cached, the request, what this
process held outside its allocator, what others held, and the limit.  The live tensors are
split into the model states and the phase's own tensors (activations, evaluation outputs, the
KV cache), best source first:

1. a snapshot of the failing rank: the allocator's own categories (measured);
2. the ZeRO memory model of the config DeepSpeed ran with: its persistent GPU components;
3. parameters x bytes per parameter (``STATE_BYTES``) for the precision and optimizer the
   context shows, sharded as the ZeRO stage shards them; a range where either is unknown.

The phase's term is what the live tensors leave once the states are taken out.  Before the
first optimizer step, gradients and optimizer states may not exist yet: the states at the
failure are then bounded below by the weights alone, and ``states_at_peak`` is the full set
(what a fix must leave room for).
"""

from __future__ import annotations

from dataclasses import replace

from oomlens.facts.account import (
    QUANTIZED_WEIGHT_BYTES,
    STATE_BYTES,
    AccountTerm,
    MemoryAccount,
    StateBytes,
    Term,
    TermBasis,
)
from oomlens.facts.context import ContextKey, RunContext
from oomlens.facts.log import OomEvent, OomKind, Phase
from oomlens.facts.memory_model import (
    MODEL_STATE_COMPONENTS,
    BudgetPhase,
    Device,
    MemoryModelFacts,
)
from oomlens.facts.oom_balance import balance
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory

SELF_SLACK_BYTES = 2 * 1024**3
"""A listed process within this of the allocator's reservation is this process (containers)."""

_STATE_CATEGORIES = (
    MemoryCategory.PARAMETERS,
    MemoryCategory.GRADIENTS,
    MemoryCategory.OPTIMIZER_STATE,
    MemoryCategory.ZERO_BUCKETS,
)
_PHASE_TERMS = {
    Phase.FORWARD: Term.ACTIVATIONS,
    Phase.BACKWARD: Term.ACTIVATIONS,
    Phase.EVALUATION: Term.EVAL_OUTPUTS,
    Phase.GENERATION: Term.KV_CACHE,
}
_PASS_WITHOUT_STEP = (Phase.EVALUATION, Phase.GENERATION)
_MODEL_STATE_CODES = MODEL_STATE_COMPONENTS | {"persistent_params"}
"""Model states, and the small parameters ZeRO-3 keeps whole on every rank."""


def derive_account(facts: RunFacts, context: RunContext) -> MemoryAccount | None:
    """The account of ``facts.first_gpu_oom()``, or None when its message gives no figures
    of this process' allocator (a driver error, a message cut before its numbers)."""
    event = facts.first_gpu_oom()
    if event is None or event.message.kind is OomKind.HOST:
        return None
    b = balance(event.message, SELF_SLACK_BYTES)
    if b.allocated is None or b.request is None:
        return None
    where = f"OOM message at {event.source.describe()}"
    live = b.allocated
    states, at_peak = _model_states(facts, context, event, live)
    phase_term = _PHASE_TERMS.get(event.phase, Term.OTHER_LIVE)
    terms: list[AccountTerm] = []
    if states is not None:
        terms.append(states)
        rest_low = max(0, live - (states.high if states.high is not None else states.bytes))
        rest_high = max(0, live - (states.low if states.low is not None else states.bytes))
        rest = max(0, live - states.bytes)
        terms.append(
            AccountTerm(
                phase_term,
                rest,
                TermBasis.REMAINDER,
                f"{where}: {_gib(live)} allocated less the model states",
                low=rest_low if rest_low != rest_high else None,
                high=rest_high if rest_low != rest_high else None,
            )
        )
    else:
        terms.append(
            AccountTerm(
                phase_term,
                live,
                TermBasis.MEASURED,
                f"{where}: allocated by PyTorch (model states included: their size is unknown)",
            )
        )
    terms.append(AccountTerm(Term.REQUEST, b.request, TermBasis.MEASURED, where))
    if b.unallocated is not None:
        terms.append(AccountTerm(Term.CACHED_UNUSED, b.unallocated, TermBasis.MEASURED, where))
    if b.non_pytorch_self is not None:
        terms.append(AccountTerm(Term.NON_PYTORCH, b.non_pytorch_self, TermBasis.MEASURED, where))
    others = b.others_total or (b.outside_unlisted if b.in_use_self is not None else 0) or 0
    if others and not b.capped:
        terms.append(AccountTerm(Term.OTHER_PROCESSES, others, TermBasis.MEASURED, where))
    limit = event.message.allowed or event.message.total_capacity
    return MemoryAccount(
        rank=event.rank,
        device=event.message.device,
        phase=event.phase.value,
        limit=limit,
        limit_source=f"{where} ({'allowed' if event.message.allowed else 'total capacity'})",
        limit_is_cap=event.message.allowed is not None,
        needed=live + b.request,
        terms=tuple(terms),
        states_at_peak=at_peak,
        micro_batch=context.integer(ContextKey.MICRO_BATCH),
        states_at_least=_states_at_least(facts, context, event, at_peak),
    )


def _gib(value: int) -> str:
    if value < 1024**3:
        return f"{value / 1024**2:.1f} MiB"
    return f"{value / 1024**3:.2f} GiB"


def _model_states(
    facts: RunFacts, context: RunContext, event: OomEvent, live: int
) -> tuple[AccountTerm | None, AccountTerm | None]:
    """The model states at the failure and once all of them exist (see the module docstring)."""
    located = facts.snapshot_for(event)
    modelled = _from_memory_model(facts.memory_model)
    if located is not None:
        snapshot, device = located
        held = sum(c.bytes for c in device.live_by_category if c.category in _STATE_CATEGORIES)
        # blocks whose stacks name no known frame (a snapshot recorded without stacks) may be
        # model states too: the measurement bounds them, it does not rule them out
        unsure = sum(
            c.bytes for c in device.live_by_category if c.category is MemoryCategory.UNKNOWN
        )
        where = f"snapshot {snapshot.source.path} (device {device.device})"
        measured = AccountTerm(
            Term.MODEL_STATES,
            held,
            TermBasis.MEASURED,
            f"{where}: parameters, gradients, optimizer states and ZeRO buffers",
            low=held if unsure else None,
            high=held + unsure if unsure else None,
            note=f"{_gib(unsure)} of live blocks the snapshot cannot attribute" if unsure else "",
        )
        peak = modelled or _from_arithmetic(context)
        if peak is None or peak.bytes < held:
            # the phase's term is what the live tensors leave once ``held`` is taken out:
            # unattributed blocks are counted there, not twice
            peak = replace(measured, low=None, high=None)
        return measured, peak
    if modelled is not None:
        return modelled, modelled
    computed = _from_arithmetic(context)
    if computed is None:
        return None, None
    low = computed.low if computed.low is not None else computed.bytes
    if _before_first_step(facts, event):
        # Gradients and optimizer states come with the first backward and step: before it,
        # only the weights are sure to be there.
        weights = _weights_only(context)
        low = min(low, weights) if weights is not None else low
    high = computed.high if computed.high is not None else computed.bytes
    high = min(high, live)
    low = min(low, high)
    at_failure = AccountTerm(
        Term.MODEL_STATES,
        (low + high) // 2,
        TermBasis.ARITHMETIC,
        computed.source,
        low=low if low != high else None,
        high=high if low != high else None,
        note=computed.note,
    )
    if event.phase in _PASS_WITHOUT_STEP:
        # evaluation and generation make no gradients and take no optimizer step: the states
        # the pass meets are those held when it failed (a training run's among them)
        return at_failure, at_failure
    return at_failure, computed


def _before_first_step(facts: RunFacts, event: OomEvent) -> bool:
    """Only the weights are sure to exist: a training pass before the first optimizer step,
    or an evaluation or generation with no training step logged (an inference run has no
    gradients or optimizer states at all)."""
    if event.phase in _PASS_WITHOUT_STEP:
        return facts.last_step in (None, 0)
    return facts.last_step in (None, 0, 1) and event.phase in (
        Phase.FORWARD,
        Phase.BACKWARD,
        Phase.MODEL_INIT,
    )


def _from_memory_model(model: MemoryModelFacts | None) -> AccountTerm | None:
    if model is None:
        return None
    parts = [
        c
        for c in model.budget.components
        if c.device is Device.GPU
        and c.phase is BudgetPhase.PERSISTENT
        and c.code in _MODEL_STATE_CODES
    ]
    # none on the GPU is an answer (every state offloaded), not a gap to fill with the
    # arithmetic, which knows nothing of offload
    total = sum(c.bytes for c in parts)
    return AccountTerm(
        Term.MODEL_STATES,
        total,
        TermBasis.MODEL,
        "ZeRO memory model of the config: "
        + (", ".join(c.code for c in parts) if parts else "every model state offloaded"),
    )


def _layout(context: RunContext) -> tuple[float, str]:
    """The share of the states one rank holds (ZeRO's partitioning) and how it is known."""
    stage = context.integer(ContextKey.ZERO_STAGE) or 0
    world = context.integer(ContextKey.WORLD_SIZE) or 1
    if stage >= 1 and world > 1:
        return 1 / world, f"ZeRO-{stage} over {world} ranks"
    return 1.0, "not sharded"


def _bytes_per_param(context: RunContext) -> tuple[StateBytes, StateBytes, str]:
    """The lowest and highest ``StateBytes`` the context allows, and what was assumed."""
    precision = context.get(ContextKey.PRECISION)
    optimizer = context.get(ContextKey.OPTIMIZER)
    family = optimizer.value if optimizer is not None and isinstance(optimizer.value, str) else None
    if family is not None and family not in ("adam", "adam_8bit", "sgd", "adafactor"):
        family = None
    assumed_family = family or "adam"
    zero = context.integer(ContextKey.ZERO_STAGE)
    if precision is not None and precision.value == "fp32":
        kinds = ["fp32"]
    elif precision is not None and zero is not None and zero >= 1 and assumed_family == "adam":
        kinds = ["zero16"]  # DeepSpeed's ZeRO optimizers keep fp32 master weights
    elif precision is not None:
        kinds = ["bf16", "amp"]  # a cast model or autocast over fp32 weights
    else:
        kinds = ["bf16", "fp32"]
    families = [family] if family is not None else ["adam"]
    options = [
        STATE_BYTES.get((kind, fam)) or STATE_BYTES[("fp32", fam)]
        for kind in kinds
        for fam in families
    ]
    low = min(options, key=lambda s: s.per_trainable)
    high = max(options, key=lambda s: s.per_trainable)
    assumed = []
    if precision is None:
        assumed.append("precision unknown (16-bit to fp32)")
    if family is None:
        assumed.append("optimizer assumed Adam")
    return low, high, "; ".join(assumed)


def _params(context: RunContext) -> tuple[int, bool] | None:
    """The parameter count and whether it is exact (False: ``PARAMS_AT_LEAST``, a bound)."""
    params = context.integer(ContextKey.PARAMS)
    if params is not None:
        return params, True
    at_least = context.integer(ContextKey.PARAMS_AT_LEAST)
    return (at_least, False) if at_least is not None else None


def _from_arithmetic(context: RunContext) -> AccountTerm | None:
    counted = _params(context)
    if counted is None:
        return None
    params, exact = counted
    trainable = context.integer(ContextKey.TRAINABLE_PARAMS)
    trainable = params if trainable is None or trainable > params else trainable
    frozen = params - trainable
    low_bytes, high_bytes, assumed = _bytes_per_param(context)
    share, layout = _layout(context)

    def total(s: StateBytes) -> int:
        return round((trainable * s.per_trainable + frozen * s.weights) * share)

    low, high = total(low_bytes), total(high_bytes)
    source = (
        ("" if exact else "at least ")
        + f"{params:,} parameters ({trainable:,} trainable) x {low_bytes.per_trainable:g}"
        + (f"-{high_bytes.per_trainable:g}" if high != low else "")
        + f" bytes, {layout}"
    )
    return AccountTerm(
        Term.MODEL_STATES,
        (low + high) // 2,
        TermBasis.ARITHMETIC,
        source,
        low=low if low != high else None,
        high=high if low != high else None,
        note=assumed,
    )


def _weights_only(context: RunContext) -> int | None:
    counted = _params(context)
    if counted is None:
        return None
    params = counted[0]
    precision = context.get(ContextKey.PRECISION)
    # a lower bound: 16-bit weights unless the run is known to be fp32 (an unknown precision
    # may be a cast model; bf16 may be autocast over fp32 weights, at least 2 B either way)
    size = 4 if precision is not None and precision.value == "fp32" else 2
    share, _ = _layout(context)
    return round(params * size * share)


_TRAINING_PHASES = (Phase.BACKWARD, Phase.OPTIMIZER_STEP)


def _states_at_least(
    facts: RunFacts, context: RunContext, event: OomEvent, at_peak: AccountTerm | None
) -> int | None:
    """``MemoryAccount.states_at_least``: what the states need whatever was assumed.  Weights
    that may be frozen are counted at ``QUANTIZED_WEIGHT_BYTES`` (a 4-bit base model under
    QLoRA states bf16 too); a parameter known to train has its precision's weight, its
    gradient when the run is known to train, and the optimizer's states when it is known."""
    if at_peak is not None and at_peak.basis in (TermBasis.MODEL, TermBasis.MEASURED):
        return at_peak.bytes
    counted = _params(context)
    offloaded = any(
        (value := context.get(key)) is not None and value.value is True
        for key in (ContextKey.OFFLOAD_OPTIMIZER, ContextKey.OFFLOAD_PARAM)
    )
    if counted is None or offloaded:
        # the arithmetic knows nothing of what an offload keeps on the host
        return None
    params = counted[0]
    trainable = context.integer(ContextKey.TRAINABLE_PARAMS)
    if trainable is None or trainable > params:
        return round(params * QUANTIZED_WEIGHT_BYTES * _layout(context)[0])
    optimizer_known = context.get(ContextKey.OPTIMIZER) is not None
    training = (
        event.phase in _TRAINING_PHASES
        or (facts.last_step is not None and facts.last_step >= 1)
        or optimizer_known
    )
    low, _, _ = _bytes_per_param(context)
    per_trainable = (
        low.weights + (low.gradients if training else 0) + (low.optimizer if optimizer_known else 0)
    )
    frozen = params - trainable
    share, _ = _layout(context)
    return round((trainable * per_trainable + frozen * QUANTIZED_WEIGHT_BYTES) * share)
