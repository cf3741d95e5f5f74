"""The setting that makes the failing term fit, computed from the run's memory account.

What the account measures at the failure is a lower bound of what the failing pass needs:
the pass was cut short by the failure.  Where it stopped inside the pass is not known, so the
fit assumes the pass had done at least ``PASS_DONE_AT_LEAST`` of its allocations (a forward
that failed in its last layers needs a little more than it held; one that failed in its first
ones, much more).  The value that fits keeps ``MARGIN`` of the limit free (the allocator's
rounding and cached blocks, a context that grows).  Each result states its arithmetic, so the
assumption is in the report, not hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomlens.diagnosis import Fix
from oomlens.facts.account import MemoryAccount, Term
from oomlens.facts.context import ContextKey, RunContext
from oomlens.rules.common.evidence import size

MARGIN = 0.10
"""Of the limit, kept free by a computed setting."""
PASS_DONE_AT_LEAST = 0.5
"""How much of its allocations the failing pass is assumed to have made (see the docstring)."""
PHASE_TERMS = (Term.ACTIVATIONS, Term.KV_CACHE, Term.EVAL_OUTPUTS)


@dataclass(frozen=True, slots=True)
class ScaleFit:
    """A count that scales the failing term (micro batch, prompts per ``generate``): the
    current value, the largest that can fit at all (``at_most``: from what the pass held when
    it failed), the value proposed (``proposed``: with the pass assumed half done and the
    margin kept), and the peak predicted at ``proposed``."""

    current: int
    at_most: int
    proposed: int
    predicted_peak: int
    budget: int
    per_unit_low: int
    arithmetic: str


def _states_at_peak(account: MemoryAccount) -> int:
    peak = account.states_at_peak
    if peak is None:
        return account.bytes_of(Term.MODEL_STATES)
    return peak.high if peak.high is not None else peak.bytes


def _outside_allocator(account: MemoryAccount) -> int:
    """What the limit must also hold besides tensors: under a per-process cap
    (``allowed``) only the allocator counts; against the card, this process' non-PyTorch
    memory and other processes do."""
    if account.limit_is_cap:
        return 0
    return account.bytes_of(Term.NON_PYTORCH) + account.bytes_of(Term.OTHER_PROCESSES)


def scale_fit(account: MemoryAccount, current: int | None, *, divisor: bool) -> ScaleFit | None:
    """The count that fits, for a failing term proportional to ``current`` (None when the
    account lacks the figures or the count is unknown).  ``divisor``: the proposal divides
    ``current`` (a micro batch whose global batch accumulation keeps)."""
    term = next((account.term(t) for t in PHASE_TERMS if account.term(t) is not None), None)
    if term is None or current is None or current < 1 or account.limit is None:
        return None
    # what the pass cost the allocator: its tensors, the request, and the cached blocks its
    # churn left unusable (a KV cache grown by concatenation leaves many)
    held = term.bytes + account.bytes_of(Term.REQUEST) + account.bytes_of(Term.CACHED_UNUSED)
    per_unit_low = math.ceil(held / current)
    if per_unit_low <= 0:
        return None
    states = _states_at_peak(account)
    outside = _outside_allocator(account)
    budget = int(account.limit * (1 - MARGIN)) - states - outside
    if budget <= 0:
        return ScaleFit(
            current,
            0,
            0,
            states + outside,
            budget,
            per_unit_low,
            _arith(account, states, outside, budget, per_unit_low, 0, 0),
        )
    at_most = min(current, budget // per_unit_low)
    per_unit_high = math.ceil(per_unit_low / PASS_DONE_AT_LEAST)
    proposed = min(current, budget // per_unit_high)
    if divisor and proposed >= 1:
        proposed = max(d for d in range(1, proposed + 1) if current % d == 0)
    peak = states + outside + proposed * per_unit_high
    return ScaleFit(
        current,
        at_most,
        proposed,
        peak,
        budget,
        per_unit_low,
        _arith(account, states, outside, budget, per_unit_low, at_most, proposed),
    )


def _arith(
    account: MemoryAccount,
    states: int,
    outside: int,
    budget: int,
    per_unit_low: int,
    at_most: int,
    proposed: int,
) -> str:
    limit = account.limit or 0
    text = (
        f"{size(limit)} limit less {MARGIN:.0%} margin, {size(states)} of model states"
        + (f", {size(outside)} outside the allocator" if outside else "")
        + f" leaves {size(max(budget, 0))}; the failing pass held at least {size(per_unit_low)} "
        f"per unit when it failed, so at most {at_most} can fit"
    )
    if proposed:
        text += (
            f"; {proposed} fits if the pass had done at least {PASS_DONE_AT_LEAST:.0%} of its "
            f"allocations ({size(math.ceil(per_unit_low / PASS_DONE_AT_LEAST))} per unit)"
        )
    return text


def states_exceed(account: MemoryAccount) -> bool:
    """The model states alone (once all exist) leave no room under the limit."""
    if account.limit is None:
        return False
    return _states_at_peak(account) + _outside_allocator(account) > account.limit * (1 - MARGIN)


def states_certainly_exceed(account: MemoryAccount) -> bool:
    """The model states, counted with nothing assumed (``states_at_least``), exceed the
    limit on their own: no batch, no allocator setting can make the run fit."""
    if account.limit is None or account.states_at_least is None:
        return False
    return account.states_at_least + _outside_allocator(account) > account.limit


def _flag_of(text: str) -> str | None:
    """The command-line flag a context value was read from (``--micro-batch 8`` ->
    ``--micro-batch``), when it was one."""
    head = text.strip().strip("'\"")
    if not head.startswith("-"):
        return None
    flag = head.split("=", 1)[0].split()[0].rstrip("'\",")
    return flag if len(flag) > 2 else None


def _setting(context: RunContext, key: ContextKey, default_flag: str) -> tuple[str, bool]:
    """How to set ``key``: the run's own flag when the log showed one, else ``default_flag``;
    and whether it was the run's own."""
    found = context.get(key)
    flag = _flag_of(found.text) if found is not None else None
    return (flag, True) if flag else (default_flag, False)


def micro_batch_fix(
    account: MemoryAccount, context: RunContext, *, ds_config: bool
) -> tuple[Fix | None, ScaleFit | None]:
    """The micro batch that fits, with the accumulation that keeps the global batch: a
    config patch for a DeepSpeed run, the run's own command-line flags otherwise.  (None, fit)
    when nothing smaller fits (the model states leave no room) or it is already 1."""
    current = account.micro_batch
    fit = scale_fit(account, current, divisor=True)
    if fit is None or current is None or fit.proposed < 1 or fit.proposed >= current:
        return None, fit
    accumulation = context.integer(ContextKey.GRAD_ACCUM) or 1
    new_accumulation = accumulation * current // fit.proposed
    summary = (
        f"Micro batch {current} -> {fit.proposed} with gradient accumulation {accumulation} -> "
        f"{new_accumulation} (the same global batch); predicted peak {size(fit.predicted_peak)} "
        f"of {size(account.limit)}. {fit.arithmetic}."
    )
    if ds_config:
        return (
            Fix(
                summary,
                config_patch={
                    "train_micro_batch_size_per_gpu": fit.proposed,
                    "gradient_accumulation_steps": new_accumulation,
                },
                predicted_peak_bytes=fit.predicted_peak,
                cost="the same samples per optimizer step, in more, smaller passes",
            ),
            fit,
        )
    batch_flag, own = _setting(context, ContextKey.MICRO_BATCH, "--per_device_train_batch_size")
    accum_flag, _ = _setting(context, ContextKey.GRAD_ACCUM, "--gradient_accumulation_steps")
    command = f"{batch_flag} {fit.proposed} {accum_flag} {new_accumulation}"
    if not own:
        command += "  (HF Trainer's names; use your script's)"
    return (
        Fix(
            summary,
            command=command,
            arguments={batch_flag: str(fit.proposed), accum_flag: str(new_accumulation)},
            predicted_peak_bytes=fit.predicted_peak,
            cost="the same samples per optimizer step, in more, smaller passes",
        ),
        fit,
    )


def prompts_fix(account: MemoryAccount, context: RunContext) -> Fix | None:
    """The number of sequences per ``generate`` call that fits the KV cache."""
    current = context.integer(ContextKey.PROMPTS)
    if account.term(Term.KV_CACHE) is None:
        return None
    fit = scale_fit(account, current, divisor=True)
    if fit is None or current is None or fit.proposed < 1 or fit.proposed >= current:
        return None
    flag, own = _setting(context, ContextKey.PROMPTS, "--generation_batch_size")
    return Fix(
        f"Generate for {fit.proposed} sequences per call instead of {current} (call generate "
        f"{current // fit.proposed} times); predicted peak {size(fit.predicted_peak)} of "
        f"{size(account.limit)}. {fit.arithmetic}.",
        command=f"{flag} {fit.proposed}" + ("" if own else "  (or your script's equivalent)"),
        arguments={flag: str(fit.proposed)},
        predicted_peak_bytes=fit.predicted_peak,
        cost="more generate calls, the same outputs",
    )


def divide_batch_fix(account: MemoryAccount, context: RunContext) -> Fix | None:
    """When the micro batch itself is unknown: the factor to divide it by, from the same
    arithmetic with the failing pass as one unit."""
    if context.integer(ContextKey.MICRO_BATCH) is not None:
        return None
    fit = scale_fit(account, 1000, divisor=False)
    if fit is None or fit.proposed < 1 or fit.proposed >= 1000:
        return None
    factor = math.ceil(1000 / fit.proposed)
    return Fix(
        f"Divide the micro batch by {factor} and multiply gradient accumulation by {factor} "
        f"(the same global batch): the failing pass needs about {1000 / fit.proposed:.1f}x "
        f"what fits. {fit.arithmetic.replace('per unit', 'per 1/1000 of the batch')}.",
        command=f"--per_device_train_batch_size B/{factor} --gradient_accumulation_steps "
        f"G*{factor} (HF Trainer's names; B, G: the run's values)",
        arguments={
            "--per_device_train_batch_size": f"/{factor}",
            "--gradient_accumulation_steps": f"*{factor}",
        },
        predicted_peak_bytes=fit.predicted_peak,
        cost="the same samples per optimizer step, in more, smaller passes",
    )


def states_fixes(account: MemoryAccount, context: RunContext) -> list[Fix]:
    """For model states that leave no room (``states_exceed``), the settings that bring them
    under the limit, each with its numbers: the GPU count a full sharding (ZeRO-3 / FSDP)
    needs; under DeepSpeed ZeRO (its stage known, no config among the inputs), the optimizer's
    offload and what it leaves on the GPU; what an optimizer with smaller states leaves (8-bit
    Adam).  Where the parameter count is only a lower bound, so are the figures ("at least")."""
    peak = account.states_at_peak
    if peak is None or account.limit is None:
        return []
    states = peak.high if peak.high is not None else peak.bytes
    phase_terms = [account.term(t) for t in PHASE_TERMS if account.term(t) is not None]
    # the request belongs to the pass's own tensors when the failure is in a pass; while the
    # model is built or the optimizer steps, it is one of the states
    others = sum(t.bytes for t in phase_terms if t is not None) + (
        account.bytes_of(Term.REQUEST) if phase_terms else 0
    )
    room = int(account.limit * (1 - MARGIN)) - _outside_allocator(account) - others
    params = context.integer(ContextKey.PARAMS)
    bound = context.integer(ContextKey.PARAMS_AT_LEAST) if params is None else None
    least = "at least " if bound is not None else ""
    fixes: list[Fix] = []
    world = context.integer(ContextKey.WORLD_SIZE) or 1
    stage = context.integer(ContextKey.ZERO_STAGE)
    if room > 0:
        total = states * (world if stage else 1)  # the states of the whole model
        gpus = math.ceil(total / room)
        if max(1, world if stage == 3 else 1) < gpus <= 4096:
            fixes.append(
                Fix(
                    f"Shard parameters, gradients and optimizer states over {least}{gpus} GPUs "
                    f"(ZeRO-3 or FSDP full sharding): {least}{size(total)} of model states / "
                    f"{gpus} = {size(total // gpus)} per GPU, under the {size(room)} the limit "
                    f"leaves beside this pass's own {size(others)} (with a {MARGIN:.0%} margin).",
                    config_patch=(
                        {"zero_optimization": {"stage": 3}}
                        if stage is not None and stage < 3
                        else None
                    ),
                    cost="communication per step; the GPUs",
                )
            )
    count = params if params is not None else bound
    if count is not None and stage is not None and stage >= 1:
        offload = _zero_offload_fix(count, world, stage, room, least)
        if offload is not None:
            fixes.insert(0, offload)
    if params is not None:
        eight_bit = round(params * 2 * (world if not stage else 1) / (world if stage else 1))
        saving = max(0, min(states, params * 8) - eight_bit)
        if saving > 0 and states - saving <= room:
            fixes.append(
                Fix(
                    f"Use 8-bit Adam (bitsandbytes): its two states take 2 bytes per parameter "
                    f"instead of 8, saving about {size(saving)} of the {size(states)} of model "
                    "states.",
                    command="--optim adamw_bnb_8bit  (HF; or bitsandbytes.optim.AdamW8bit)",
                    cost="8-bit optimizer states: usually the same convergence",
                )
            )
    return fixes


def _zero_offload_fix(params: int, world: int, stage: int, room: int, least: str) -> Fix | None:
    """ZeRO's optimizer offload, when what it leaves on the GPU fits ``room``: the 16-bit
    weights (partitioned by stage 3) and gradients (partitioned by stages 2 and 3); the fp32
    master weights, moments and gradient partitions move to host memory.  The patch is complete
    for a run whose client code passes a torch optimizer (Lightning's ``configure_optimizers``,
    accelerate): DeepSpeed refuses a client optimizer under offload unless
    ``zero_force_ds_cpu_optimizer`` is false."""
    per_param = 2 / (world if stage == 3 else 1) + 2 / (world if stage >= 2 else 1)
    on_gpu = round(params * per_param)
    if on_gpu > room:
        return None
    bound = (
        f" (it fits while the model has at most {int(room / per_param):,} parameters; the "
        f"failing request shows at least {params:,})"
        if least
        else ""
    )
    return Fix(
        f"Offload the optimizer to the CPU (ZeRO-{stage}): the GPU keeps the 16-bit weights and "
        f"gradients, {least}{size(on_gpu)} per GPU, under the {size(room)} the limit leaves"
        f"{bound}; the fp32 master weights and Adam's moments, 12 bytes per parameter, move to "
        "host memory. `zero_force_ds_cpu_optimizer: false` lets DeepSpeed run the client's own "
        "optimizer on the CPU copies (it refuses otherwise). Merge into the run's DeepSpeed "
        "config; with Lightning, pass the file as DeepSpeedStrategy(config=...).",
        config_patch={
            "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}},
            "zero_force_ds_cpu_optimizer": False,
        },
        predicted_peak_bytes=on_gpu if not least else None,
        cost=f"the optimizer step on the CPU: slower steps; {least}{size(12 * params)} of host "
        "memory (pinned)",
    )
