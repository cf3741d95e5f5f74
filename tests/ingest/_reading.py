"""Read a run's inputs the way the session does, without the analysis: the facts by slot."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from oomlens.facts.inputs import InputFacts
from oomlens.ingest.kinds import FoundInput, ReadOptions
from oomlens.ingest.run import read_inputs


def read_run(files: Iterable[FoundInput]) -> InputFacts:
    """Every file read with its kind's reader (snapshots stay raw: nothing is digested)."""
    slots: defaultdict[str, list[object]] = defaultdict(list)
    reports = []
    for read in read_inputs(files, ReadOptions()):
        reports.append(read.report)
        slots[read.kind.slot].extend(read.facts)
    return InputFacts.from_slots(reports, slots)


def problems(inputs: InputFacts) -> list[str]:
    return [r.problem for r in inputs.reports if r.problem]
