"""DeepSpeed's batch arithmetic, exactly, and the corrections for a batch triple it refuses.

DeepSpeed (``DeepSpeedConfig._set_batch_related_parameters`` then ``_batch_assertion``,
deepspeed/runtime/config.py) derives the missing one of ``train_batch_size``,
``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` by **floor division**,
then asserts ``train_batch_size == micro * gas * world_size``.  ``world_size`` is the
data-parallel size: every GPU unless tensor/pipeline/sequence parallelism divides it.

``check_batch`` repeats those Python operations on the same values (so a float, a bool or
``"auto"`` behaves exactly as in DeepSpeed, ``TypeError`` included) and, when DeepSpeed would
refuse the triple or derive a micro batch nobody wrote, proposes corrected triples as JSON
merge patches, saying which of them change the effective (global) batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from oomlens.analysis.config_patch import make_patch
from oomlens.facts.config import (
    BatchSettings,
    ConfigHazard,
    ConfigSeverity,
    ConfigValue,
    EffectiveDsConfig,
    Origin,
)
from oomlens.facts.memory_model import ConfigChange
from oomlens.facts.preflight import BatchCheck, BatchCorrection, BatchTriple, BatchWorldSizes
from oomlens.facts.run import WorldSizeFact

TRAIN = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
GAS = "gradient_accumulation_steps"


def _value(item: ConfigValue[Any]) -> Any:
    return item.value if item.origin is not Origin.DEFAULT or item.value is not None else None


def derive_batch(
    train: Any, micro: Any, gas: Any, world_size: Any
) -> tuple[BatchTriple, list[str], bool]:
    """``_set_batch_related_parameters`` as written in DeepSpeed 0.19.8, with an account.

    Returns the resulting triple, the derivation steps, and whether a floor division dropped a
    remainder.  Raises what DeepSpeed raises (``AssertionError`` for neither value given,
    ``TypeError`` for strings such as ``"auto"``, ``ZeroDivisionError``).
    """
    steps: list[str] = []
    lossy = False
    if train is not None and micro is not None and gas is not None:
        return BatchTriple(train, micro, gas), steps, lossy
    if train is not None and micro is not None:
        new_gas = train // micro
        new_gas //= world_size
        lossy = new_gas * micro * world_size != train
        steps.append(
            f"gradient_accumulation_steps = {train} // {micro} // {world_size} = {new_gas}"
        )
        return BatchTriple(train, micro, new_gas), steps, lossy
    if train is not None and gas is not None:
        new_micro = train // world_size
        new_micro //= gas
        lossy = new_micro * gas * world_size != train
        steps.append(
            f"train_micro_batch_size_per_gpu = {train} // {world_size} // {gas} = {new_micro}"
        )
        return BatchTriple(train, new_micro, gas), steps, lossy
    if micro is not None and gas is not None:
        new_train = _product(micro, gas, world_size)
        steps.append(f"train_batch_size = {micro} * {gas} * {world_size} = {new_train}")
        return BatchTriple(new_train, micro, gas), steps, lossy
    if train is not None:
        new_micro = train // world_size
        lossy = new_micro * world_size != train
        steps.append("gradient_accumulation_steps = 1 (not given)")
        steps.append(f"train_micro_batch_size_per_gpu = {train} // {world_size} = {new_micro}")
        return BatchTriple(train, new_micro, 1), steps, lossy
    if micro is not None:
        new_train = _product(micro, world_size)
        steps.append(f"train_batch_size = {micro} * {world_size} = {new_train}")
        steps.append("gradient_accumulation_steps = 1 (not given)")
        return BatchTriple(new_train, micro, 1), steps, lossy
    raise AssertionError(
        "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"
    )


def repeated_by_multiplying(value: Any) -> bool:
    """Whether ``value * n`` repeats ``value`` (a text or a JSON list): DeepSpeed's batch
    arithmetic would build ``n`` copies before failing."""
    return isinstance(value, str | bytes | list | tuple)


def _product(*factors: Any) -> Any:
    """``a * b * ...`` as DeepSpeed computes it, except that a text or a list is not repeated.

    DeepSpeed multiplies whatever the config holds: ``"A" * 2_000_000_000`` builds a 2 GB string
    (``[1] * 2_000_000_000`` 16 GB of list; ``"A" * 2**63`` raises OverflowError) before its
    ``train_batch > 0`` assertion fails with a TypeError.  That TypeError is raised here at once.
    """
    texts = [factor for factor in factors if repeated_by_multiplying(factor)]
    others = [factor for factor in factors if not repeated_by_multiplying(factor)]
    if len(texts) == 1 and all(isinstance(f, int) for f in others):
        kind = type(texts[0]).__name__
        raise TypeError(f"'>' not supported between instances of '{kind}' and 'int'")
    result = factors[0]
    for factor in factors[1:]:
        result = result * factor
    return result


def assert_batch(triple: BatchTriple, world_size: Any) -> None:
    """``_batch_assertion`` as written in DeepSpeed 0.19.8 (same messages)."""
    train_batch = triple.train_batch_size
    micro_batch = triple.micro_batch_per_gpu
    grad_acc = triple.gradient_accumulation_steps
    assert train_batch > 0, f"Train batch size: {train_batch} has to be greater than 0"
    assert micro_batch > 0, f"Micro batch size per gpu: {micro_batch} has to be greater than 0"
    assert grad_acc > 0, f"Gradient accumulation steps: {grad_acc} has to be greater than 0"
    assert train_batch == micro_batch * grad_acc * world_size, (
        "Check batch related parameters. train_batch_size is not equal "
        "to micro_batch_per_gpu * gradient_acc_step * world_size "
        f"{train_batch} != {micro_batch} * {grad_acc} * {world_size}"
    )


def check_batch(effective: EffectiveDsConfig, world_size: WorldSizeFact) -> BatchCheck:
    """Run DeepSpeed's batch logic on ``effective.batch`` at ``world_size``; never raises.

    On failure (or a floor-division derivation), ``corrections`` holds the triples that pass:
    keep ``train_batch_size`` and solve for micro/gas (largest micro batch not above the one in
    force first), and keep micro and gas and fix ``train_batch_size`` (changes the global batch).
    """
    given = effective.batch
    train, micro, gas = (
        _value(given.train_batch_size),
        _value(given.micro_batch_per_gpu),
        _value(given.gradient_accumulation_steps),
    )
    ws = world_size.value
    derived: BatchTriple | None = None
    steps: list[str] = []
    lossy = False
    error = code = key = None
    try:
        derived, steps, lossy = derive_batch(train, micro, gas, ws)
        assert_batch(derived, ws)
    except AssertionError as exc:
        error = f"AssertionError: {exc}"
        text = str(exc)
        if text.startswith("Check batch"):
            code, key = "batch_mismatch", TRAIN
        elif text.startswith("Either"):
            code, key = "batch_missing", TRAIN
        else:
            code = "batch_nonpositive"
            key = TRAIN if text.startswith("Train") else MICRO if text.startswith("Micro") else GAS
    except (TypeError, OverflowError) as exc:  # a value that is not a number, or one too big
        error, code = f"{type(exc).__name__}: {exc}", "batch_type_error"
        key = next(
            (
                k
                for k, v in ((TRAIN, train), (MICRO, micro), (GAS, gas))
                if v is not None and (isinstance(v, bool) or not isinstance(v, int | float))
            ),
            TRAIN,
        )
    except ZeroDivisionError as exc:
        error, code = f"ZeroDivisionError: {exc}", "batch_zero_division"
        key = MICRO if micro == 0 else GAS
    if error is not None:
        derived_ok = None
    else:
        derived_ok = derived
    corrections: tuple[BatchCorrection, ...] = ()
    micro_derived = error is None and micro is None and derived is not None
    if code in ("batch_mismatch", "batch_nonpositive") or micro_derived:
        corrections = tuple(
            _corrections(effective, train, micro, gas, ws, derived, smaller_only=micro_derived)
        )
    return BatchCheck(
        given=given,
        world_size=world_size,
        derived=derived_ok,
        derivations=tuple(steps),
        error=error,
        error_code=code,
        error_key=key,
        floor_loss=lossy,
        corrections=corrections,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _corrections(
    effective: EffectiveDsConfig,
    train: Any,
    micro: Any,
    gas: Any,
    ws: int,
    derived: BatchTriple | None,
    *,
    smaller_only: bool = False,
) -> list[BatchCorrection]:
    out: list[BatchCorrection] = []
    micro_in_force = (
        derived.micro_batch_per_gpu
        if derived is not None and _is_int(derived.micro_batch_per_gpu)
        else micro
    )
    seen: set[tuple[int, int, int]] = set()

    def add(triple: BatchTriple, keeps: str) -> None:
        t, m, g = (
            triple.train_batch_size,
            triple.micro_batch_per_gpu,
            triple.gradient_accumulation_steps,
        )
        if (t, m, g) in seen or m < 1 or g < 1 or t != m * g * ws:
            return
        seen.add((t, m, g))
        changes: list[ConfigChange] = []
        for key, new in ((TRAIN, t), (MICRO, m), (GAS, g)):
            changes.append(ConfigChange(key, new))
        changes_global = not (_is_int(train) and t == train)
        micro_delta = m - micro_in_force if _is_int(micro_in_force) else 0
        cost = "none: the same samples per optimizer step"
        if changes_global:
            cost = (
                f"the global batch becomes {t} samples per optimizer step (learning-rate "
                "schedules may need retuning)"
            )
        elif micro_delta > 0:
            cost = f"the micro batch grows by {micro_delta}: more activation memory per GPU"
        elif micro_delta < 0:
            cost = "smaller micro batch: more accumulation steps, lower throughput per step"
        patch = make_patch(
            effective,
            changes,
            summary=f"set {triple.describe()} (world size {ws})",
            cost=cost,
        )
        if patch is None:
            return
        out.append(
            BatchCorrection(
                triple=triple,
                keeps=keeps,
                changes_effective_batch=changes_global,
                micro_batch_change=micro_delta,
                patch=patch,
            )
        )

    if _is_int(train) and train > 0 and train % ws == 0:
        per_rank = train // ws
        cap = micro_in_force if _is_int(micro_in_force) and micro_in_force > 0 else per_rank
        if smaller_only:
            cap -= 1  # a derived micro batch: propose smaller ones, written explicitly
        # Keep train_batch_size: largest micro batch not above the one in force, then smaller ones.
        for m in _divisors_from_top(per_rank, cap, 2):
            add(BatchTriple(train, m, per_rank // m), "train_batch_size")
        if not smaller_only and _is_int(gas) and gas > 0 and per_rank % gas == 0:
            add(
                BatchTriple(train, per_rank // gas, gas),
                "train_batch_size and gradient_accumulation_steps",
            )
    if not smaller_only and _is_int(micro) and _is_int(gas) and micro > 0 and gas > 0:
        add(
            BatchTriple(micro * gas * ws, micro, gas),
            "train_micro_batch_size_per_gpu and gradient_accumulation_steps",
        )
    return out


def _divisors_from_top(n: int, cap: int, count: int, budget: int = 100_000) -> list[int]:
    """The ``count`` largest divisors of ``n`` not above ``cap``, largest first, looking at no
    more than ``2 * budget`` candidates (exact for ``n`` up to ``budget``; a config may say
    ``10**400``): ``n // k`` for small ``k``, then small divisors themselves."""
    found = [n // k for k in range(1, min(n, budget) + 1) if n % k == 0 and n // k <= cap]
    top = min(cap, n // (budget + 1))
    found += [m for m in range(top, max(0, top - budget), -1) if n % m == 0]
    return found[:count]


WORLD_SIZE_SCAN = 1024
"""World sizes ``world_sizes_accepted`` tries (1 to this)."""


def world_sizes_accepted(
    effective: EffectiveDsConfig, limit: int = WORLD_SIZE_SCAN
) -> BatchWorldSizes:
    """Where DeepSpeed's batch logic (``derive_batch`` then ``assert_batch``) passes, trying
    every world size from 1 to ``limit``: a full triple holds at the one world size
    ``train_batch_size / (micro * accumulation)``, a partial one where the floor divisions are
    exact, a micro batch without ``train_batch_size`` everywhere."""
    given = effective.batch
    train, micro, gas = (
        _value(given.train_batch_size),
        _value(given.micro_batch_per_gpu),
        _value(given.gradient_accumulation_steps),
    )
    written = ", ".join(
        f"{label} {value}"
        for label, value in (("train_batch_size", train), ("micro", micro), ("accumulation", gas))
        if value is not None
    )
    if any(v is not None and not _is_int(v) for v in (train, micro, gas)):
        return BatchWorldSizes((), 0, written)  # not numbers: validation says what fails
    sizes = []
    for ws in range(1, limit + 1):
        try:
            assert_batch(derive_batch(train, micro, gas, ws)[0], ws)
        except (AssertionError, ZeroDivisionError):
            continue
        sizes.append(ws)
    return BatchWorldSizes(tuple(sizes), limit, written)


def batch_hazards(check: BatchCheck) -> list[ConfigHazard]:
    """Batch settings DeepSpeed accepts but that change with the GPU count.

    ``derived_micro_batch``: ``train_micro_batch_size_per_gpu`` is not written, so DeepSpeed
    derives it as ``train_batch_size // world_size // gradient_accumulation_steps``: on fewer GPUs
    than the config was written for, each GPU gets a larger micro batch (and activation memory).
    """
    given = check.given
    if check.derived is None or given.micro_batch_per_gpu.value is not None:
        return []
    micro = check.derived.micro_batch_per_gpu
    ws = check.world_size.value
    source = given.train_batch_size.source
    return [
        ConfigHazard(
            "derived_micro_batch",
            f"train_micro_batch_size_per_gpu is not set: DeepSpeed derives {micro} per GPU at {ws} "
            f"GPUs ({'; '.join(check.derivations)}); the micro batch, and activation memory, grow "
            "as the GPU count shrinks",
            ConfigSeverity.MEDIUM if micro > 1 else ConfigSeverity.INFO,
            (TRAIN, MICRO, GAS),
            (source,) if source is not None else (),
        )
    ]


def with_derived_batch(
    effective: EffectiveDsConfig, world_size: WorldSizeFact
) -> EffectiveDsConfig:
    """``effective`` with the batch triple DeepSpeed derives at ``world_size`` (values it
    derived get ``Origin.DERIVED``).  Unchanged when DeepSpeed would raise."""
    check = check_batch(effective, world_size)
    if check.derived is None:
        return effective
    derived = check.derived
    given = effective.batch

    def pick(item: ConfigValue[Any], value: Any, note: str) -> ConfigValue[Any]:
        if item.value == value and item.origin is not Origin.DEFAULT:
            return item
        return ConfigValue(value, item.key_path, Origin.DERIVED, None, note)

    steps = "; ".join(check.derivations)
    batch = BatchSettings(
        train_batch_size=pick(given.train_batch_size, derived.train_batch_size, steps),
        micro_batch_per_gpu=pick(given.micro_batch_per_gpu, derived.micro_batch_per_gpu, steps),
        gradient_accumulation_steps=pick(
            given.gradient_accumulation_steps, derived.gradient_accumulation_steps, steps
        ),
    )
    return replace(effective, batch=batch)
