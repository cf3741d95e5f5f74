"""``oomlens.rules.common.fit``: the micro batch and the prompts per ``generate`` that fit,
from the accounts of real OOMs (the crash corpus), under limits other than the run's own."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from oomlens.facts.account import MemoryAccount
from oomlens.facts.config import Origin
from oomlens.facts.context import ContextKey
from oomlens.facts.run import RunFacts
from oomlens.rules.activation_memory import ActivationMemoryRule
from oomlens.rules.common.fit import (
    MARGIN,
    micro_batch_fix,
    prompts_fix,
    scale_fit,
    states_exceed,
    states_fixes,
)
from oomlens.rules.thresholds import Thresholds
from oomlens.session import analyze
from tests._corpus import case_dir

GiB = 2**30
# OOM cases whose failing pass has a known count (micro batch or prompts per generate)
CASES = {
    "activation_memory": 8,
    "compiled_activation": 48,
    "malloc_async_activation": 16,
    "accumulation_derived_micro": 16,
}


@functools.cache
def _facts(name: str) -> RunFacts:
    return analyze([case_dir(name)]).facts


def _account(name: str) -> MemoryAccount:
    account = _facts(name).account
    assert account is not None
    return account


def _limits(account: MemoryAccount) -> list[int]:
    base = account.limit or 0
    return [int(base * f / 8) for f in range(2, 33)]  # a quarter to four times the run's


@pytest.mark.parametrize(("name", "micro"), CASES.items())
def test_the_account_knows_the_runs_micro_batch(name: str, micro: int) -> None:
    assert _account(name).micro_batch == micro


@pytest.mark.parametrize("name", CASES)
def test_a_larger_limit_never_proposes_a_smaller_batch(name: str) -> None:
    account = _account(name)
    proposed = []
    for limit in _limits(account):
        fit = scale_fit(replace(account, limit=limit), account.micro_batch, divisor=True)
        assert fit is not None
        proposed.append(fit.proposed)
    assert proposed == sorted(proposed), proposed
    assert proposed[0] < proposed[-1]  # the limit matters


@pytest.mark.parametrize("name", CASES)
def test_the_proposal_divides_the_micro_batch_and_its_peak_fits(name: str) -> None:
    account = _account(name)
    current = account.micro_batch
    assert current is not None
    for limit in _limits(account):
        fit = scale_fit(replace(account, limit=limit), current, divisor=True)
        assert fit is not None
        assert 0 <= fit.proposed <= current
        if fit.proposed:
            assert current % fit.proposed == 0
            assert fit.predicted_peak <= limit * (1 - MARGIN)
            assert fit.proposed <= fit.at_most


@pytest.mark.parametrize("name", CASES)
def test_the_fix_keeps_the_global_batch(name: str) -> None:
    account = _account(name)
    context = _facts(name).context
    fix, fit = micro_batch_fix(account, context, ds_config=False)
    assert fit is not None
    if fix is None:  # the run's own limit may leave no smaller batch that fits
        return
    assert fix.predicted_peak_bytes == fit.predicted_peak
    assert fix.predicted_peak_bytes is not None and account.limit is not None
    assert fix.predicted_peak_bytes <= account.limit
    values = {k: int(v) for k, v in fix.arguments.items()}
    batch = next(v for k, v in values.items() if "batch" in k)
    accumulation = next(v for k, v in values.items() if "accum" in k)
    before = context.integer(ContextKey.GRAD_ACCUM) or 1
    assert batch * accumulation == (account.micro_batch or 0) * before


@pytest.mark.parametrize("name", CASES)
def test_no_batch_when_the_model_states_exceed_the_limit(name: str) -> None:
    account = _account(name)
    peak = account.states_at_peak
    assert peak is not None
    states = peak.high if peak.high is not None else peak.bytes
    small = replace(account, limit=int(states / (1 - MARGIN)) - 1)
    assert states_exceed(small)
    fit = scale_fit(small, account.micro_batch, divisor=True)
    assert fit is not None and fit.proposed == 0 and fit.at_most == 0
    fix, _ = micro_batch_fix(small, _facts(name).context, ds_config=False)
    assert fix is None


def test_activation_memory_proposes_no_batch_when_no_batch_can_fit() -> None:
    # activation_memory's run (8 x 4096 tokens of a 220M model): under a limit its model
    # states alone exceed, the rule gives no batch fix, only checkpointing
    facts = _facts("activation_memory")
    account = facts.account
    assert account is not None
    diagnoses = list(ActivationMemoryRule().evaluate(facts, Thresholds()))
    assert diagnoses and any("Micro batch 8 ->" in f.summary for f in diagnoses[0].fixes)
    peak = account.states_at_peak
    assert peak is not None and peak.high is not None
    starved = replace(facts, account=replace(account, limit=int(peak.high / (1 - MARGIN)) - 1))
    diagnoses = list(ActivationMemoryRule().evaluate(starved, Thresholds()))
    assert diagnoses
    for diagnosis in diagnoses:
        summaries = [f.summary.lower() for f in diagnosis.fixes]
        assert not any("batch" in s for s in summaries), summaries
        assert any("recompute activations" in s for s in summaries)


def test_prompts_that_fit_the_kv_cache() -> None:
    facts = _facts("generation_oom")
    account = facts.account
    assert account is not None
    fix = prompts_fix(account, facts.context)
    assert fix is not None
    # 128 prompts per generate in the run; the proposal divides them and its peak fits
    proposed = int(fix.summary.split()[2])
    assert 128 % proposed == 0 and proposed < 128
    assert fix.predicted_peak_bytes is not None and account.limit is not None
    assert fix.predicted_peak_bytes <= account.limit * (1 - MARGIN)
    # a limit four times larger allows at least as many
    roomy = prompts_fix(replace(account, limit=account.limit * 4), facts.context)
    assert roomy is None or int(roomy.summary.split()[2]) >= proposed


def test_no_batch_fix_of_unknown_size_when_the_states_exceed() -> None:
    # accelerate's DeepSpeed plugin run: the log does not state the micro batch, so the fix
    # is a factor to divide it by; under a limit the states alone exceed, none at all
    facts = _facts("accelerate_deepspeed_activation")
    account = facts.account
    assert account is not None and account.micro_batch is None
    fixes = [f for d in ActivationMemoryRule().evaluate(facts, Thresholds()) for f in d.fixes]
    assert any(f.summary.startswith("Divide the micro batch by") for f in fixes)
    peak = account.states_at_peak
    assert peak is not None
    states = peak.high if peak.high is not None else peak.bytes
    starved = replace(facts, account=replace(account, limit=int(states / (1 - MARGIN)) - 1))
    fixes = [f for d in ActivationMemoryRule().evaluate(starved, Thresholds()) for f in d.fixes]
    assert fixes and not any("batch" in f.summary.lower() for f in fixes)


def test_a_batch_the_trainer_fills_in_is_set_by_its_arguments(tmp_path: Path) -> None:
    # accumulation_derived_micro's config with the batch triple "auto" (as the HF Trainer's
    # and Accelerate's examples write it): a number patched into the config would contradict
    # TrainingArguments (transformers' trainer_config_finalize refuses the mismatch at start):
    # the fix is the trainer's arguments, not a config patch
    config = json.loads((case_dir("accumulation_derived_micro") / "ds_config.json").read_text())
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        config[key] = "auto"
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    case = case_dir("accumulation_derived_micro")
    facts = analyze([case / "train.log", case / "snapshot_rank1.pickle", path]).facts
    assert facts.config is not None
    batch = facts.config.reading.effective.batch.micro_batch_per_gpu
    assert batch.origin in (Origin.AUTO_RESOLVED, Origin.AUTO_UNRESOLVED)
    fixes = [f for d in ActivationMemoryRule().evaluate(facts, Thresholds()) for f in d.fixes]
    computed = next(f for f in fixes if f.summary.startswith("Micro batch 16 ->"))
    assert not computed.config_patch
    assert set(computed.arguments) == {
        "--per_device_train_batch_size",
        "--gradient_accumulation_steps",
    }
    # the config as the run wrote it (numbers): the patch goes into the config
    facts = analyze(
        [case / "train.log", case / "snapshot_rank1.pickle", case / "ds_config.json"]
    ).facts
    fixes = [f for d in ActivationMemoryRule().evaluate(facts, Thresholds()) for f in d.fixes]
    computed = next(f for f in fixes if f.summary.startswith("Micro batch 16 ->"))
    assert set(computed.config_patch or {}) == {
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    }
    assert not computed.arguments


def test_states_known_only_from_below_get_the_offload_and_the_gpus_with_their_bounds() -> None:
    # Lightning's ZeRO-3 on one GPU failed making the fp32 master copy: the parameters are
    # known only as at least the sub group's elements; 16 bytes each exceed the 12 GiB cap
    facts = _facts("lightning_deepspeed_states")
    account, context = facts.account, facts.context
    assert account is not None and states_exceed(account)
    fixes = states_fixes(account, context)
    offload, shard = fixes[0], fixes[1]
    bound = context.integer(ContextKey.PARAMS_AT_LEAST)
    assert bound is not None
    assert offload.config_patch == {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "zero_force_ds_cpu_optimizer": False,  # the client's torch optimizer: refused otherwise
    }
    # a bound gives no predicted peak, but the largest model the offload fits
    assert offload.predicted_peak_bytes is None
    room = int(account.limit * (1 - MARGIN)) - 0  # a per-process cap: nothing outside counts
    assert f"at most {int(room / 4):,} parameters" in offload.summary
    assert f"at least {bound:,}" in offload.summary
    # the failed request is one of the states here, not a pass's tensors beside them
    assert "beside this pass's own 0 B" in shard.summary
    assert "over at least 2 GPUs" in shard.summary


def test_with_the_count_known_the_offload_predicts_what_stays_on_the_gpu() -> None:
    facts = _facts("lightning_deepspeed_states")
    assert facts.account is not None
    bound = facts.context.integer(ContextKey.PARAMS_AT_LEAST)
    assert bound is not None
    values = dict(facts.context.values)
    values[ContextKey.PARAMS] = replace(values[ContextKey.PARAMS_AT_LEAST], key=ContextKey.PARAMS)
    known = replace(facts.context, values=values)
    offload = states_fixes(facts.account, known)[0]
    assert offload.predicted_peak_bytes == 4 * bound  # 16-bit weights and gradients, one rank
    assert "at least" not in offload.summary
