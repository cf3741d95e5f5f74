"""DeepSpeed's batch arithmetic, repeated exactly, and corrected triples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomlens.analysis.batch import (
    BatchTriple,
    assert_batch,
    batch_hazards,
    check_batch,
    derive_batch,
    with_derived_batch,
)
from oomlens.analysis.ds_resolve import resolve_effective_config
from oomlens.analysis.ds_validation import validate_with_oomlens
from oomlens.facts.config import ConfigSeverity, Origin
from oomlens.facts.run import WorldSizeFact
from oomlens.ingest.ds_config import document_from_mapping


def _effective(train: Any = None, micro: Any = None, gas: Any = None, **extra: Any):
    given = {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
    }
    data: dict[str, Any] = {**extra, **{k: v for k, v in given.items() if v is not None}}
    return resolve_effective_config(document_from_mapping(data))


def _deepspeed_outcome(train: Any, micro: Any, gas: Any, ws: int) -> tuple[str, Any]:
    config = pytest.importorskip("deepspeed.runtime.config")
    state = SimpleNamespace(
        train_batch_size=train,
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=gas,
        world_size=ws,
    )
    try:
        config.DeepSpeedConfig._set_batch_related_parameters(state)
        config.DeepSpeedConfig._batch_assertion(state)
    except Exception as exc:  # what DeepSpeed raises is the point of the comparison
        return type(exc).__name__, str(exc)
    return "ok", (
        state.train_batch_size,
        state.train_micro_batch_size_per_gpu,
        state.gradient_accumulation_steps,
    )


def _oomlens_outcome(train: Any, micro: Any, gas: Any, ws: int) -> tuple[str, Any]:
    try:
        triple, _, _ = derive_batch(train, micro, gas, ws)
        assert_batch(triple, ws)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", (
        triple.train_batch_size,
        triple.micro_batch_per_gpu,
        triple.gradient_accumulation_steps,
    )


batch_value = st.none() | st.integers(-2, 70) | st.sampled_from(["auto", 8.0, 7.5, True, [1], []])


@pytest.mark.deepspeed
@settings(max_examples=600, deadline=None)
@given(batch_value, batch_value, batch_value, st.integers(1, 16))
def test_derivation_and_assertion_are_deepspeeds(train: Any, micro: Any, gas: Any, ws: int) -> None:
    assert _oomlens_outcome(train, micro, gas, ws) == _deepspeed_outcome(train, micro, gas, ws)


def test_floor_division_mismatch_from_the_reference() -> None:
    # train=32, micro=3, world=4: gas = 32 // 3 // 4 = 2, then 32 != 3 * 2 * 4
    check = check_batch(_effective(32, 3), WorldSizeFact(4, "--gpus"))
    assert check.error == (
        "AssertionError: Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 3 * 2 * 4"
    )
    assert check.error_code == "batch_mismatch"
    assert check.derivations == ("gradient_accumulation_steps = 32 // 3 // 4 = 2",)
    assert check.floor_loss


def test_train_below_world_size_gives_micro_zero() -> None:
    check = check_batch(_effective(4), WorldSizeFact(8, "--gpus"))
    assert check.error == "AssertionError: Micro batch size per gpu: 0 has to be greater than 0"
    assert (
        check.error_code == "batch_nonpositive"
        and check.error_key == "train_micro_batch_size_per_gpu"
    )


def test_auto_fails_like_deepspeed_alone() -> None:
    check = check_batch(_effective("auto", 4), WorldSizeFact(2, "--gpus"))
    assert check.error_code == "batch_type_error" and check.error_key == "train_batch_size"
    assert check.error.startswith("TypeError: ")
    assert check.corrections == ()


@pytest.mark.parametrize(
    ("micro", "gas", "key"),
    [
        ([1], 2_000_000_000, "train_micro_batch_size_per_gpu"),  # DeepSpeed: a 16 GB list first
        ([1], 10**400, "train_micro_batch_size_per_gpu"),  # DeepSpeed: OverflowError
        ("A", 10**400, "train_micro_batch_size_per_gpu"),
        (8.0, 10**400, "train_batch_size"),  # a float times an int too big for a float
    ],
)
def test_a_value_deepspeed_cannot_multiply_is_a_type_error_not_a_crash(
    micro: Any, gas: int, key: str
) -> None:
    check = check_batch(_effective(micro=micro, gas=gas), WorldSizeFact(8, "--gpus"))
    assert check.error_code == "batch_type_error" and check.error_key == key
    assert check.error is not None and check.error.split(":")[0] in ("TypeError", "OverflowError")
    doc = document_from_mapping(
        {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas}
    )
    problems = validate_with_oomlens(doc, world_size=8)
    assert [p.code for p in problems if p.code.startswith("batch")] == ["batch_type_error"]


def test_derived_micro_batch_is_reported_with_its_division() -> None:
    # GIVEN train_batch_size and gradient_accumulation_steps only (the corpus' accum_derived shape)
    check = check_batch(_effective(64, gas=2), WorldSizeFact(2, "launcher world info"))
    # THEN DeepSpeed derives a micro batch of 16 per GPU, and says how
    assert check.ok and check.derived == BatchTriple(64, 16, 2)
    assert check.derivations == ("train_micro_batch_size_per_gpu = 64 // 2 // 2 = 16",)
    assert not check.floor_loss
    (hazard,) = batch_hazards(check)
    assert hazard.code == "derived_micro_batch" and hazard.severity is ConfigSeverity.MEDIUM
    assert "derives 16 per GPU at 2 GPUs" in hazard.message
    # AND the corrections keep the global batch with a smaller, explicit micro batch
    assert [c.triple for c in check.corrections] == [BatchTriple(64, 8, 4), BatchTriple(64, 4, 8)]
    first = check.corrections[0]
    assert not first.changes_effective_batch and first.micro_batch_change == -8
    assert first.patch.merge_patch() == {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
    }
    # a written micro batch is no hazard
    assert batch_hazards(check_batch(_effective(64, 16, 2), WorldSizeFact(2, "--gpus"))) == []


def test_corrections_pass_deepspeeds_assertion_and_say_what_they_change() -> None:
    # GIVEN a triple written for 4 GPUs, run on 8
    effective = _effective(32, 4, 2)
    check = check_batch(effective, WorldSizeFact(8, "--gpus"))
    assert check.error_code == "batch_mismatch"
    # THEN every correction is accepted at 8 GPUs
    assert check.corrections
    for correction in check.corrections:
        patched = correction.patch.apply_to(effective_raw(32, 4, 2))
        assert validate_with_oomlens(document_from_mapping(patched), world_size=8) == []
        assert correction.triple.train_batch_size == (
            correction.triple.micro_batch_per_gpu
            * correction.triple.gradient_accumulation_steps
            * 8
        )
    first = check.corrections[0]
    assert first.keeps == "train_batch_size" and not first.changes_effective_batch
    assert first.triple == BatchTriple(32, 4, 1)
    assert first.patch.merge_patch() == {"gradient_accumulation_steps": 1}  # only what changes
    keep_micro = [c for c in check.corrections if c.keeps.startswith("train_micro")]
    assert keep_micro and keep_micro[0].changes_effective_batch
    assert keep_micro[0].triple == BatchTriple(64, 4, 2)
    assert keep_micro[0].patch.merge_patch() == {"train_batch_size": 64}


def effective_raw(train: int, micro: int, gas: int) -> dict[str, int]:
    return {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
    }


def test_corrections_do_not_raise_the_micro_batch_when_keeping_the_global_batch() -> None:
    check = check_batch(_effective(48, 3, 1), WorldSizeFact(8, "--gpus"))
    keep_train = [c for c in check.corrections if c.keeps == "train_batch_size"]
    assert keep_train
    assert all(c.triple.micro_batch_per_gpu <= 3 for c in keep_train)
    assert keep_train[0].triple == BatchTriple(48, 3, 2)
    assert keep_train[0].micro_batch_change == 0


def test_with_derived_batch_marks_derived_values() -> None:
    effective = with_derived_batch(_effective(64, gas=2), WorldSizeFact(2, "--gpus"))
    micro = effective.batch.micro_batch_per_gpu
    assert micro.value == 16 and micro.origin is Origin.DERIVED
    assert "64 // 2 // 2" in micro.note
    assert effective.batch.train_batch_size.origin is Origin.USER
    untouched = _effective("auto", 4)
    assert with_derived_batch(untouched, WorldSizeFact(2, "--gpus")) is untouched


@given(st.integers(1, 512), st.integers(1, 16), st.integers(1, 8), st.integers(1, 64))
def test_every_correction_is_consistent(train: int, micro: int, gas: int, ws: int) -> None:
    check = check_batch(_effective(train, micro, gas), WorldSizeFact(ws, "--gpus"))
    for correction in check.corrections:
        t = correction.triple
        assert t.train_batch_size == t.micro_batch_per_gpu * t.gradient_accumulation_steps * ws
        assert correction.changes_effective_batch == (t.train_batch_size != train)
        assert correction.patch.changes  # never an empty patch
        for change in correction.patch.changes:
            assert change.new != change.old  # never re-proposes a value in force
