"""Model states that exceed the limit with nothing assumed name the cause: model_states_too_large
gains the account as evidence, activation_memory loses confidence (a smaller batch cannot fit).
The real runs' accounts, held to limits below their own model states."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from oomlens.facts.account import QUANTIZED_WEIGHT_BYTES, Term
from oomlens.facts.context import ContextKey
from oomlens.facts.run import RunFacts
from oomlens.rules.activation_memory import ActivationMemoryRule
from oomlens.rules.common.fit import prompts_fix, states_certainly_exceed, states_exceed
from oomlens.rules.model_states_too_large import ModelStatesRule
from oomlens.rules.thresholds import Thresholds
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import CORPUS_DIR, case_dir

GiB = 2**30


@functools.cache
def _facts(name: str) -> RunFacts:
    return analyze([case_dir(name)]).facts


def _under(facts: RunFacts, limit: int) -> RunFacts:
    assert facts.account is not None
    return replace(facts, account=replace(facts.account, limit=limit))


def test_measured_states_over_the_limit_are_the_cause_not_activations() -> None:
    # ZeRO-3's snapshot at the OOM: 2.18 GiB of partitions and buckets, measured
    facts = _facts("prefetch_overshoot")
    assert facts.account is not None and facts.account.states_at_least is not None
    states = facts.account.states_at_least
    assert not states_certainly_exceed(facts.account)
    under = _under(facts, states - GiB // 4)
    assert states_certainly_exceed(under.account)  # type: ignore[arg-type]
    found = list(ModelStatesRule().evaluate(under, Thresholds()))
    assert found and any("no batch fits" in e.note for e in found[0].evidence)


def test_the_account_lowers_activations_when_the_states_alone_exceed() -> None:
    facts = _facts("activation_memory")
    account = facts.account
    assert account is not None and account.states_at_least is not None
    before = [d.confidence for d in ActivationMemoryRule().evaluate(facts, Thresholds())]
    under = _under(facts, account.states_at_least // 2)
    after = list(ActivationMemoryRule().evaluate(under, Thresholds()))
    assert before and after and after[0].confidence < before[0]
    against = [e for e in after[0].evidence if not e.supports]
    assert any("a smaller batch cannot fit" in e.note for e in against)


def test_weights_that_may_be_quantized_count_at_four_bits() -> None:
    # a user's paste of a model named chatglm-6b-int4: its name gives 6e9 parameters, nothing
    # says what trains; only 4-bit weights are certain (16-bit ones would exceed its card)
    paste = CORPUS_DIR.parent / "field_logs" / "chatchat-33" / "paste.txt"
    facts = analyze([paste]).facts
    account = facts.account
    assert account is not None and account.limit is not None
    assert facts.context.integer(ContextKey.PARAMS) == 6_000_000_000
    assert facts.context.get(ContextKey.TRAINABLE_PARAMS) is None
    assert account.states_at_least == round(6_000_000_000 * QUANTIZED_WEIGHT_BYTES)
    assert 6_000_000_000 * 2 > account.limit * 0.7  # 16-bit weights would nearly fill it
    assert not states_certainly_exceed(account)


def test_a_generation_pass_meets_only_the_states_it_held() -> None:
    # the generation run's logs with the model's size given (--params: its snapshot measures
    # 450.9 MB of bf16 parameters, 225e6), no snapshot: inside generate() no gradient or
    # optimizer state appears, so the pass meets what was held when it failed, never more
    case = case_dir("generation_oom")
    logs = [case / "train.log", case / "torchrun_logs"]
    facts = analyze(logs, options=AnalysisOptions(params=225_000_000)).facts
    account = facts.account
    assert account is not None and account.phase == "generation"
    peak = account.states_at_peak
    assert peak is not None and peak == account.term(Term.MODEL_STATES)
    assert account.needed is not None and (peak.high or peak.bytes) <= account.needed
    assert not states_exceed(account)
    assert account.bytes_of(Term.KV_CACHE) > 0
    fix = prompts_fix(account, facts.context)
    assert fix is not None and int(next(iter(fix.arguments.values()))) < 128


def test_an_inference_run_is_sure_of_its_weights_only(tmp_path: Path) -> None:
    # the same run's lines without its training steps' lines (made from the real log): an
    # inference run, whose generation's states are bounded below by the weights alone
    case = case_dir("generation_oom")
    trained = (case / "train.log").read_text().splitlines(keepends=True)
    inference = tmp_path / "train.log"
    inference.write_text("".join(line for line in trained if " loss " not in line))
    options = AnalysisOptions(params=225_000_000)
    before = analyze([case / "train.log"], options=options).facts
    after = analyze([inference], options=options).facts
    assert before.last_step == 3 and after.last_step is None
    assert before.account is not None and after.account is not None
    low_before = before.account.states_at_peak.low  # type: ignore[union-attr]
    low_after = after.account.states_at_peak.low  # type: ignore[union-attr]
    assert low_after == 2 * 225_000_000  # 16-bit weights, the least a weight takes unquantized
    assert low_before is not None and low_before > low_after
