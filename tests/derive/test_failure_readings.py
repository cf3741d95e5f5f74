"""Readings of how a run failed when no OOM message says it: refused configurations, signal
deaths and silent deaths, bugs behind library status errors, failed pinned allocations.  Every
input is a real log or paste (or code-built from one, said where)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.derive.lookalikes import library_failure_explained
from oomlens.derive.pinned import pinned_failure
from oomlens.derive.rejections import Rejection, config_rejections, rejection_of
from oomlens.derive.signals import (
    host_memory_pressure,
    signal_deaths,
    signal_of_exit,
    silent_death,
)
from oomlens.session import gather_facts

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "fixtures" / "field_logs"
CRASH = ROOT / "fixtures" / "crash_logs"


def _paste(case: str) -> Path:
    return FIELD / case / "paste.txt"


# -- refused configurations


def test_transformers_mismatch_listing_batch_keys_is_batch_arithmetic() -> None:
    facts = gather_facts([CRASH / "hf_trainer_config_mismatch" / "train.log"])
    [refused] = config_rejections(facts.logs)
    assert refused.kind is Rejection.BATCH
    assert refused.keys == ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def test_a_config_models_validation_error_is_a_schema_rejection() -> None:
    text = (_paste("deepspeed-3827")).read_text()
    found = rejection_of("ValidationError", text)
    assert found is not None and found.kind is Rejection.SCHEMA
    assert found.model == "DeepSpeedZeroConfig"


def test_a_trainers_divisibility_check_is_batch_arithmetic() -> None:
    # TRL's GRPO check, as the paste prints its last line
    line = _paste("openr1-217").read_text().splitlines()[-1]
    found = rejection_of("ValueError", line.split("ValueError: ", 1)[1])
    assert found is not None and found.kind is Rejection.BATCH


@pytest.mark.parametrize(
    ("exception_class", "text"),
    [
        ("ValueError", "too many values to unpack (expected 2)"),
        ("RuntimeError", "CUDA error: device-side assert triggered"),
        # a ValidationError that is not about a config model's fields
        ("ValidationError", "the dataset row 3 has no 'text' column"),
    ],
)
def test_other_errors_are_not_rejections(exception_class: str, text: str) -> None:
    assert rejection_of(exception_class, text) is None


# -- signals


@pytest.mark.parametrize(
    ("code", "signal"),
    [
        (-9, "SIGKILL"),
        (137, "SIGKILL"),
        (247, "SIGKILL"),
        (-7, "SIGBUS"),
        (135, "SIGBUS"),
        (-11, "SIGSEGV"),
        (139, "SIGSEGV"),
        (-6, "SIGABRT"),
        (1, None),
        (0, None),
        (None, None),
    ],
)
def test_exit_codes_name_their_signal(code: int | None, signal: str | None) -> None:
    assert signal_of_exit(code) == signal


def test_the_crash_corpus_kill_is_a_sigkill_death() -> None:
    facts = gather_facts([CRASH / "pinned_memory_exhaustion"])
    assert any(d.signal == "SIGKILL" for d in signal_deaths(facts))


def test_a_worker_that_died_silently_under_memory_pressure() -> None:
    # DeepSpeed launcher kills the ranks right after "CPU Virtual Memory: ... percent = 84.6%"
    facts = gather_facts([_paste("deepspeed-4571")])
    silent = silent_death(facts)
    assert silent is not None and "Killing subprocess 1080504" in silent.text
    pressure = host_memory_pressure(facts)
    assert pressure is not None and pressure.cpu_percent == pytest.approx(84.6)


def test_a_launcher_exit_code_1_is_a_python_error_elsewhere_not_a_silent_death() -> None:
    # DeepSpeed-Chat step 2: "Killing subprocess" and "exits with return code = 1"
    facts = gather_facts([_paste("deepspeedexamples-380")])
    assert silent_death(facts) is None


# -- look-alikes and pinned memory


def test_a_cublas_status_beside_an_index_error_is_explained_by_the_bug() -> None:
    facts = gather_facts([_paste("transformers-12935")])
    bug = library_failure_explained(facts.logs, facts.gpu_oom_events())
    assert bug is not None and "index out of range" in bug.text


def test_a_real_oom_is_never_explained_away() -> None:
    facts = gather_facts([CRASH / "device_side_assert" / "train.log"])
    # the case's cuBLAS error follows a device-side assert (no OOM events at all there)
    assert library_failure_explained(facts.logs, facts.gpu_oom_events()) is None
    oom = gather_facts([CRASH / "activation_memory" / "train.log"])
    assert library_failure_explained(oom.logs, oom.gpu_oom_events()) is None


def test_a_failed_pin_memory_thread_is_a_pinned_failure() -> None:
    facts = gather_facts([_paste("heareval-316")])
    failure = pinned_failure(facts)
    assert failure is not None and not failure.oom
    assert "pin memory thread" in failure.text
    assert pinned_failure(gather_facts([CRASH / "activation_memory" / "train.log"])) is None
