"""Training logs: a launcher's combined stdout/stderr, or one file per rank, plain or
compressed, read in one streaming pass with bounded memory (``oomlens.ingest.log``)."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import regex

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample
from oomlens.ingest.layout import Location, text_log_name

_MARKERS = regex.compile(
    r"Traceback \(most recent call last\)|\[(?:rank|default)\d{1,6}\]:|OutOfMemoryError|out of me"
    r"mory|"
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\]|"
    r"(?m:^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6,9} )|NCCL (?:INFO|WARN)|torch\.distributed|"
    r"CUDA error|\bstep=\d|'loss': |\b(?:epoch|loss|step|iter)\b\s{0,2}[:=]\s{0,2}\d|"
    r"\b(?:step|iter|epoch|batch) \d{1,9}/\d{1,9}\b|"
    r"\d{1,9}/\d{1,9} \[\d{1,4}:\d\d|Setting ds_accelerator|(?m:^Killed$)"
)
"""Strong signs of a training log; plain prose that merely mentions torch is not one."""


class TrainingLogKind(InputKind):
    id: ClassVar[str] = "training_log"
    label: ClassVar[str] = "a training log"
    slot: ClassVar[str] = "logs"
    precedence: ClassVar[int] = 90
    order: ClassVar[int] = 10
    reader: ClassVar[str] = "oomlens.ingest.log"

    def recognise(self, sample: Sample) -> str | None:
        marker = _MARKERS.search(sample.text)
        if marker is None:
            return None
        return f"text with a training-log marker ({marker.group(0)!r})"

    def accepts_plain_text(self, *, named_by_user: bool, location: Location, name: str) -> str:
        if named_by_user:
            return "text named as an input"
        if location.per_rank:
            # A per-rank file of a launcher's layout is that rank's output.
            return "a per-rank log of the launcher's layout"
        if text_log_name(name):
            # A quiet healthy run prints nothing a marker would catch.
            return "a text log by its name, no markers"
        return ""

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.context_lines import read_context
        from oomlens.ingest.log import read_log

        where = found.location
        progress = options.progress
        log = read_log(
            found.path,
            rank=where.rank if where.rank is not None else where.local_rank,
            jobs=options.log_jobs,
            progress=(lambda done, total: progress(found.path, done, total)) if progress else None,
        )
        log = replace(log, context=read_context(found.path, display=log.path))
        return Reading((log,), f"{log.lines} lines", notes=log.notes, rank=log.layout_rank)


KIND = TrainingLogKind()
