"""``oomlens.derive.account``: the memory account of the first GPU OOM, on the crash corpus.

Model states come from the failing rank's snapshot when there is one, from the ZeRO memory
model for a DeepSpeed config, from parameters x bytes per parameter otherwise; ``needed`` is
what the OOM message says was allocated plus its request.  The model-state terms are held
against DeepSpeed 0.19.8's own estimators where those cover the case.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import re

import pytest

from oomlens.facts.account import MemoryAccount, Term, TermBasis
from oomlens.facts.snapshot import MemoryCategory
from oomlens.report import Report
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import CORPUS_DIR, case_dir, case_names, checkable, manifest

_STATE_CATEGORIES = (
    MemoryCategory.PARAMETERS,
    MemoryCategory.GRADIENTS,
    MemoryCategory.OPTIMIZER_STATE,
    MemoryCategory.ZERO_BUCKETS,
)


@functools.cache
def _report(name: str, *files: str, params: int | None = None) -> Report:
    inputs = [case_dir(name) / f for f in files] if files else [case_dir(name)]
    return analyze(inputs, options=AnalysisOptions(params=params))


def _account(name: str, *files: str) -> MemoryAccount:
    account = _report(name, *files).facts.account
    assert account is not None, name
    return account


def _gpu_oom_cases() -> list[str]:
    return [n for n in case_names() if manifest(n)["expected"]["verdict"] == "gpu_oom"]


# -- the frame: every term, and what was needed --------------------------------------------------


@pytest.mark.parametrize("name", _gpu_oom_cases())
def test_terms_are_non_negative_and_ranges_hold_their_value(name: str) -> None:
    account = _report(name).facts.account
    if account is None:
        # only a driver error, whose message has no allocator figures, has none
        assert name == "driver_oom_other_process"
        return
    for term in (*account.terms, account.states_at_peak):
        if term is None:
            continue
        assert term.bytes >= 0, (name, term)
        if term.low is not None or term.high is not None:
            assert term.low is not None and term.high is not None, (name, term)
            assert 0 <= term.low <= term.bytes <= term.high, (name, term)
    assert account.limit is not None and account.limit > 0
    # one term per kind
    kinds = [t.term for t in account.terms]
    assert len(kinds) == len(set(kinds)), name


@pytest.mark.parametrize("name", _gpu_oom_cases())
def test_needed_is_what_the_message_says_was_allocated_plus_its_request(name: str) -> None:
    account = _report(name).facts.account
    if account is None:
        return
    by_rank = manifest(name)["measured"].get("oom_messages_by_rank", {})
    measured = by_rank.get(str(account.rank if account.rank is not None else 0))
    if measured is None:
        pytest.skip(f"{name}: the manifest records no message numbers for rank {account.rank}")
    assert account.needed == measured["allocated_by_pytorch"] + measured["tried_to_allocate"]
    assert account.bytes_of(Term.REQUEST) == measured["tried_to_allocate"]
    # the live tensors are split, not invented: states + the phase's term = allocated
    live = measured["allocated_by_pytorch"]
    phase_terms = [
        t
        for t in account.terms
        if t.term not in (Term.REQUEST, Term.CACHED_UNUSED, Term.NON_PYTORCH, Term.OTHER_PROCESSES)
    ]
    assert sum(t.bytes for t in phase_terms) == live or any(
        t.term is Term.MODEL_STATES and t.bytes > live for t in phase_terms
    )
    if "allowed" in measured:
        assert account.limit == measured["allowed"]
        assert account.limit_is_cap


@pytest.mark.parametrize(
    "name",
    [n for n in case_names() if manifest(n)["expected"]["verdict"] != "gpu_oom"],
)
def test_no_account_without_a_gpu_oom(name: str) -> None:
    # no_failure (oom_caught_and_retried logs ten OOMs it survived: a warning, not the end),
    # host kills, config errors, NCCL and device-side failures
    assert _report(name).facts.account is None


def test_no_account_for_a_driver_error() -> None:
    report = _report("driver_oom_other_process")
    assert report.facts.first_gpu_oom() is not None
    assert report.facts.account is None


# -- where the model states come from -------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["activation_memory", "model_states_too_large", "generation_oom", "memory_leak"]
)
def test_model_states_from_the_snapshot_when_there_is_one(name: str) -> None:
    report = _report(name)
    account = report.facts.account
    assert account is not None
    states = account.term(Term.MODEL_STATES)
    assert states is not None and states.basis is TermBasis.MEASURED
    event = report.facts.first_gpu_oom()
    assert event is not None
    located = report.facts.snapshot_for(event)
    assert located is not None
    _, device = located
    held = sum(c.bytes for c in device.live_by_category if c.category in _STATE_CATEGORIES)
    assert states.bytes == held
    assert f"snapshot_rank{account.rank}" in states.source


def test_model_states_from_the_zero_model_without_a_snapshot() -> None:
    # 2.68B parameters (the log's count), ZeRO-3 over 2 ranks, bf16, AdamW, no offload: 2 B
    # partition + 2 B gradient partition + 4 B fp32 master + 8 B Adam = 16 B / 2 ranks
    account = _account(
        "model_states_too_large",
        "train.log",
        "ds_config.json",
        "rank_logs/20261130063218_rank0.log",
        "rank_logs/20261130063218_rank1.log",
    )
    states = account.term(Term.MODEL_STATES)
    assert states is not None and states.basis is TermBasis.MODEL
    assert states.bytes == 16 * 2_680_000_000 // 2
    assert account.states_at_peak is not None
    assert account.states_at_peak.bytes == states.bytes


def test_every_state_offloaded_leaves_none_on_the_gpu() -> None:
    # ZeRO-3 with the parameters and the optimizer offloaded to the CPU: the memory model puts
    # no model state on the GPU; the arithmetic, which knows nothing of offload, must not
    # stand in (it said 41.8 GB for these 3.48B parameters)
    account = _account("prefetch_overshoot_captured", "train.log", "ds_config.json")
    peak = account.states_at_peak
    assert peak is not None and peak.basis is TermBasis.MODEL
    assert peak.bytes == 0
    states = account.term(Term.MODEL_STATES)
    assert states is not None and states.basis is TermBasis.MODEL and states.bytes == 0


def test_arithmetic_range_without_snapshot_or_config() -> None:
    # activation_memory's log: 220M parameters, precision and optimizer unstated
    account = _account("activation_memory", "train.log")
    peak = account.states_at_peak
    assert peak is not None and peak.basis is TermBasis.ARITHMETIC
    assert peak.low is not None and peak.high is not None
    # 16-bit Adam (8 B) to fp32 Adam (16 B) per parameter, unsharded (DDP)
    assert (peak.low, peak.high) == (8 * 220_000_000, 16 * 220_000_000)
    assert "precision unknown" in peak.note and "Adam" in peak.note
    states = account.term(Term.MODEL_STATES)
    assert states is not None and states.basis is TermBasis.ARITHMETIC
    # the failure came before the first optimizer step: the weights alone are sure
    assert states.low == 2 * 220_000_000  # 16-bit weights: the precision is not known
    activations = account.term(Term.ACTIVATIONS)
    assert activations is not None and activations.basis is TermBasis.REMAINDER


def test_unattributed_snapshot_blocks_bound_the_states_instead_of_reading_zero() -> None:
    # the capture's snapshot attributes almost nothing (no stacks): 0 measured would be a
    # confident wrong answer; the states are bounded by what it cannot attribute
    account = _account("fragmentation_captured")
    states = account.term(Term.MODEL_STATES)
    assert states is not None and states.basis is TermBasis.MEASURED
    assert states.low == 0 and states.high is not None and states.high > 3 * 2**30
    assert "cannot attribute" in states.note


# -- agreement with DeepSpeed's own estimators ----------------------------------------------------


def _scenario_model(size: str):  # type: ignore[no-untyped-def]
    """The corpus' scenario GPT (fixtures/crash_logs/_scenarios/model.py) built on the meta
    device, each parameter then replaced by a one-element tensor expanded to its shape: the
    module tree and every parameter's numel are the real model's, with distinct storage (the
    estimators count parameters by ``data_ptr``), without allocating the weights."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(
        "scenario_model", CORPUS_DIR / "_scenarios" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        model = module.GPT(module.GPTConfig.named(size))
    for sub in model.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = torch.nn.Parameter(
                    torch.zeros(1).expand(param.shape), requires_grad=False
                )
    return model


_ROW = re.compile(
    r"^\s*(?P<cpu>[\d.]+)GB \|\s*(?P<gpu>[\d.]+)GB \| offload_param=(?P<op>[\w.]+)\s*, "
    r"offload_optimizer=(?P<oo>[\w.]+)\s*, zero_init=(?P<init>\d)"
)


def _zero3_live_estimate(model, gpus: int, offload_param: bool, offload_optimizer: bool):  # type: ignore[no-untyped-def]
    """``estimate_zero3_model_states_mem_needs_all_live``'s per-GPU figure (GiB, 2 decimals,
    as it prints it) for the row of this offload, with zero.Init; and the parameter count and
    largest layer it read from the model."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        stage3.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=gpus)
    for line in printed.getvalue().splitlines():
        row = _ROW.match(line)
        if (
            row is not None
            and row["op"].endswith("cpu") == offload_param  # "OffloadDeviceEnum.cpu"
            and row["oo"].endswith("cpu") == offload_optimizer
            and row["init"] == "1"
        ):
            return float(row["gpu"]) * 2**30, *stage3.model_to_params(model)
    raise AssertionError(printed.getvalue())


_ZERO3_CASES = [
    n
    for n in case_names()
    if checkable(n) and manifest(n)["expected"]["verdict"] in ("gpu_oom", "no_failure")
]


@pytest.mark.parametrize("name", _ZERO3_CASES)
def test_zero3_model_states_agree_with_deepspeeds_estimator(name: str) -> None:
    """The account's model states at peak (the ZeRO memory model, no snapshot given) against
    ``estimate_zero3_model_states_mem_needs_all_live`` on the same model, world and offload.

    What each counts: DeepSpeed's estimate is ``4 x largest layer + 18 B x params / GPUs``
    without offload (``+ 2 B x params / GPUs`` with the optimizer offloaded, the largest layer
    alone with both): the largest layer gathered whole, and 18 B per parameter.  The account
    counts the persistent states only (the gathered layer is the forward's working set, and the
    fp32 gradients exist for one optimizer sub-group at the step): 16 B per parameter for bf16
    with AdamW (2 B partition, 2 B gradient, 4 B fp32 master, 8 B Adam), 2 B with the optimizer
    offloaded, none with both.  So the account equals (estimate - 4 x largest layer) x 16/18,
    x 1, x 0 respectively, within the estimator's printed rounding (0.005 GiB)."""
    torch = pytest.importorskip("torch")
    del torch
    command = manifest(name)["command"]
    size = re.search(r"--model (\S+)", command)
    gpus = re.search(r"--num_gpus (\d+)", command)
    assert size is not None and gpus is not None
    world = int(gpus.group(1))
    model = _scenario_model(size.group(1))
    config = (case_dir(name) / "ds_config.json").read_text()
    zero = re.search(r'"stage":\s*(\d)', config)
    assert zero is not None and zero.group(1) == "3"
    offload_optimizer = re.search(r'"offload_optimizer":\s*\{[^}]*"device":\s*"cpu"', config)
    offload_param = re.search(r'"offload_param":\s*\{[^}]*"device":\s*"cpu"', config)
    estimate, params, largest = _zero3_live_estimate(
        model, world, offload_param is not None, offload_optimizer is not None
    )
    report = _report(name, "train.log", "ds_config.json", params=params)
    memory_model = report.facts.memory_model
    assert memory_model is not None
    account = report.facts.account
    if account is not None:
        peak = account.states_at_peak
        assert peak is not None and peak.basis is TermBasis.MODEL
        ours = peak.bytes
    else:  # a run that did not fail has no account: the same components of its model
        from oomlens.derive.account import _from_memory_model

        term = _from_memory_model(memory_model)
        assert term is not None
        ours = term.bytes
    if offload_param is not None and offload_optimizer is not None:
        factor = 0.0
    elif offload_optimizer is not None:
        factor = 1.0
    else:
        factor = 16 / 18
    expected = (estimate - 4 * largest) * factor
    tolerance = 0.005 * 2**30 * max(factor, 1.0) + 1
    assert abs(ours - expected) <= tolerance, (name, ours, expected, estimate, params, largest)


def _zero2_live_estimate(model, gpus: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """``estimate_zero2_model_states_mem_needs_all_live``'s per-GPU figure without offload
    (bytes, from its GiB with 2 decimals) and the parameter count it read."""
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        stage12.estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=gpus)
    for line in printed.getvalue().splitlines():
        row = re.match(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| offload_optimizer=none\b", line)
        if row is not None:
            return float(row.group(2)) * 2**30, stage12.model_to_params(model)
    raise AssertionError(printed.getvalue())


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_zero2_model_states_agree_with_deepspeeds_estimator(gpus: int) -> None:
    """accelerate_deepspeed_activation's setup (``accelerate launch --use_deepspeed
    --zero_stage 2 --mixed_precision bf16``, the 350m scenario GPT) as accelerate's
    DeepSpeedPlugin writes its config (``zero_optimization.stage``, ``offload_optimizer.device``
    "none", bf16), against ``estimate_zero2_model_states_mem_needs_all_live``.

    DeepSpeed counts ``2 B x params + 18 B x params / GPUs`` (its comment: 2 B 16-bit grads +
    4 B fp32 grads + 4 B fp32 params + 8 B Adam states); the memory model keeps the fp32
    gradient partition for the optimizer step only (``step_fp32_grads``), so the persistent
    states the account takes are DeepSpeed's figure less 4 B x params / GPUs."""
    from oomlens.analysis.ds_resolve import resolve_effective_config
    from oomlens.analysis.zero_model import build_budget
    from oomlens.derive.account import _from_memory_model
    from oomlens.facts.memory_model import MemoryModelFacts, ModelSize, Topology
    from oomlens.ingest.ds_config import document_from_mapping

    assert "--zero_stage 2" in manifest("accelerate_deepspeed_activation")["command"]
    model = _scenario_model("350m")
    estimate, params = _zero2_live_estimate(model, gpus)
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}},
        "bf16": {"enabled": True},
    }
    effective = resolve_effective_config(document_from_mapping(config))
    budget = build_budget(effective, ModelSize(params), Topology(gpus, gpus))
    term = _from_memory_model(MemoryModelFacts(budget, (), (), ()))
    assert term is not None and term.basis is TermBasis.MODEL
    expected = estimate - 4 * params / gpus
    assert abs(term.bytes - expected) <= 0.005 * 2**30 + 1, (term.bytes, expected, estimate)
