"""Model states that exceed the limit with nothing assumed name the cause: model_states_too_large
gains the account as evidence, activation_memory loses confidence (a smaller batch cannot fit).
The real runs' accounts, held to limits below their own model states."""

from __future__ import annotations

import functools
from dataclasses import replace

from oomlens.facts.account import QUANTIZED_WEIGHT_BYTES
from oomlens.facts.context import ContextKey
from oomlens.facts.run import RunFacts
from oomlens.rules.activation_memory import ActivationMemoryRule
from oomlens.rules.common.fit import states_certainly_exceed
from oomlens.rules.model_states_too_large import ModelStatesRule
from oomlens.rules.thresholds import Thresholds
from oomlens.session import analyze
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
