"""What the inputs of one run say, slot by slot, before anything is derived from it.

Each input kind (``oomlens.ingest.kinds``) fills one slot; ``oomlens.derive.run`` derives the
run's facts (``RunFacts``) from these.  A kind whose slot has no field here yet still works:
its facts are kept in ``other`` under the slot's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from oomlens.facts.capture import CaptureSeries, RankCapture
from oomlens.facts.config import ConfigDocument
from oomlens.facts.kernel import KernelLogFacts
from oomlens.facts.log import ErrorFileFacts, LogFacts
from oomlens.facts.run import InputReport
from oomlens.facts.snapshot import SnapshotAnalysis


@dataclass(frozen=True, slots=True)
class InputFacts:
    reports: tuple[InputReport, ...]
    """Every input, read or not, in reading order."""
    logs: tuple[LogFacts, ...] = ()
    error_files: tuple[ErrorFileFacts, ...] = ()
    kernel_logs: tuple[KernelLogFacts, ...] = ()
    snapshots: tuple[SnapshotAnalysis, ...] = ()
    configs: tuple[ConfigDocument, ...] = ()
    captures: tuple[RankCapture | CaptureSeries, ...] = ()
    """The files of a capture directory, one part each (``join_captures`` makes processes)."""
    other: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    """Facts of slots without a field of their own, by slot name."""

    @classmethod
    def from_slots(
        cls, reports: Sequence[InputReport], slots: Mapping[str, Sequence[object]]
    ) -> InputFacts:
        """The facts of ``slots`` (slot name -> facts) in their fields, the rest in ``other``."""
        known = {f.name for f in fields(cls)} - {"reports", "other"}
        typed = {name: tuple(slots.get(name, ())) for name in known}
        other = {name: tuple(facts) for name, facts in slots.items() if name not in known}
        return cls(reports=tuple(reports), other=other, **typed)  # type: ignore[arg-type]

    def any_facts(self) -> bool:
        """Whether any input gave anything to analyze."""
        return bool(
            self.logs
            or self.error_files
            or self.kernel_logs
            or self.snapshots
            or self.configs
            or self.captures
            or any(self.other.values())
        )
