"""What ``oomlens check`` found about one ds_config, as facts renderers and reports read.

``oomlens.analysis.batch`` runs DeepSpeed's batch logic into a ``BatchCheck`` (and the world
sizes a triple holds at into ``BatchWorldSizes``); ``oomlens.analysis.preflight`` gathers the
whole check into a ``Preflight``.  The types live here, below the analysis, so that the report
and the renderers read them without importing how they are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlens.facts.config import (
    BatchSettings,
    ConfigDocument,
    ConfigHazard,
    ConfigSeverity,
    EffectiveDsConfig,
    ValidationProblem,
)
from oomlens.facts.memory_model import CapacityVerdict, ConfigPatch, MemoryBudget
from oomlens.facts.run import WorldSizeFact
from oomlens.units import format_size


@dataclass(frozen=True, slots=True)
class BatchTriple:
    train_batch_size: Any
    micro_batch_per_gpu: Any
    gradient_accumulation_steps: Any

    def describe(self) -> str:
        return (
            f"train_batch_size={self.train_batch_size}, "
            f"train_micro_batch_size_per_gpu={self.micro_batch_per_gpu}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps}"
        )


@dataclass(frozen=True, slots=True)
class BatchCorrection:
    """A triple DeepSpeed accepts at this world size, as a patch.

    ``keeps`` names what it holds fixed; ``changes_effective_batch`` is True when the global
    batch (samples per optimizer step) differs from ``train_batch_size`` as configured;
    ``micro_batch_change`` is new micro minus the micro in force (activation memory follows it).
    """

    triple: BatchTriple
    keeps: str
    changes_effective_batch: bool
    micro_batch_change: int
    patch: ConfigPatch


@dataclass(frozen=True, slots=True)
class BatchCheck:
    """The outcome of DeepSpeed's batch logic for one config and world size.

    ``derived`` is the triple DeepSpeed ends with (None when it raises); ``derivations`` spell
    out the floor divisions it made; ``error`` is DeepSpeed's exception text, verbatim
    (``AssertionError: Check batch related parameters. ...``), with ``error_code`` one of
    ``batch_mismatch``, ``batch_nonpositive``, ``batch_missing``, ``batch_type_error``,
    ``batch_zero_division``.  ``floor_loss`` is True when a derived value was rounded down.
    """

    given: BatchSettings
    world_size: WorldSizeFact
    derived: BatchTriple | None
    derivations: tuple[str, ...]
    error: str | None
    error_code: str | None
    error_key: str | None
    floor_loss: bool
    corrections: tuple[BatchCorrection, ...]

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class BatchWorldSizes:
    """The world sizes (1 to ``limit``) at which DeepSpeed accepts a batch triple."""

    sizes: tuple[int, ...]
    limit: int
    triple: str
    """The triple as written (``train_batch_size 32, micro 4, accumulation 8``)."""

    @property
    def every(self) -> bool:
        return len(self.sizes) == self.limit

    def describe(self) -> str:
        """``holds only at 1 GPU``, ``holds at 1, 2 or 4 GPUs``, ``holds at any GPU count``."""
        if self.every:
            return "holds at any GPU count (the missing value follows it)"
        if not self.sizes:
            return f"holds at no GPU count up to {self.limit}"
        shown = [str(n) for n in self.sizes[:12]]
        more = (
            f" (and {len(self.sizes) - 12} more up to {self.limit})" if len(self.sizes) > 12 else ""
        )
        unit = "GPU" if self.sizes == (1,) else "GPUs"
        if len(shown) == 1:
            return f"holds only at {shown[0]} {unit}"
        return f"holds only at {', '.join(shown[:-1])} or {shown[-1]} {unit}{more}"


@dataclass(frozen=True, slots=True)
class Preflight:
    """Everything a pre-flight check of one ds_config found."""

    document: ConfigDocument
    effective: EffectiveDsConfig
    validator: str
    problems: tuple[ValidationProblem, ...]
    batch: BatchCheck | None
    budget: MemoryBudget | None
    verdicts: tuple[CapacityVerdict, ...]
    hazards: tuple[ConfigHazard, ...]
    patches: tuple[ConfigPatch, ...]
    notes: tuple[str, ...]
    precision_pending: bool = False
    """fp16/bf16 are "auto" and no --precision says what the integration will set."""
    world_sizes: BatchWorldSizes | None = None
    """Without --gpus: the GPU counts at which the batch triple holds."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def fits(self) -> bool:
        return all(v.fits for v in self.verdicts)

    @property
    def failed(self) -> bool:
        """Invalid, a batch DeepSpeed would refuse, or a budget that cannot fit."""
        return (
            not self.valid
            or (self.batch is not None and not self.batch.ok)
            or any(not v.fits for v in self.verdicts)
        )

    def verdict(self) -> str:
        """``OK: valid and fits``, or every reason it is not."""
        reasons = []
        if not self.valid:
            reasons.append(f"INVALID ({sum(p.count for p in self.problems):,} problem(s))")
        if (
            self.batch is not None
            and not self.batch.ok
            and not any(p.code.startswith("batch_") for p in self.problems)
        ):
            reasons.append("INVALID (batch)")
        reasons += [
            f"CANNOT FIT ({verdict.kind} short by {format_size(verdict.overflow_bytes)})"
            for verdict in self.verdicts
            if not verdict.fits
        ]
        if reasons:
            return "; ".join(reasons)
        serious = [
            h
            for h in self.hazards
            if h.severity in (ConfigSeverity.MEDIUM, ConfigSeverity.HIGH, ConfigSeverity.ERROR)
        ]
        # The count is of the hazards listed (every severity), so a reader finds as many as
        # it says; how many of them are serious is said beside it.
        warned = ""
        if serious:
            warned = f", with {len(self.hazards)} hazard(s) above"
            if len(serious) < len(self.hazards):
                warned += f" ({len(serious)} medium or higher)"
        qualifiers = []
        if self.world_sizes is not None and not self.world_sizes.every:
            qualifiers.append(f"batch {self.world_sizes.describe()}")
        if self.budget is None and not self.verdicts:
            qualifiers.append("no memory check")
        said = f" ({'; '.join(qualifiers)})" if qualifiers else ""
        if self.verdicts:
            return "OK: valid and fits" + said + warned
        return "OK: valid" + said + warned
