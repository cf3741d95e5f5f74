"""The files of an ``oomlens capture`` directory (``python -m oomlens.capture``): each process'
``events`` and ``series`` JSON-lines files, recognised by their header line
(``oomlens.ingest.capture``).  Each file is read on its own; the run's facts join the two
files of one process (``oomlens.facts.capture.join_captures``).  The snapshot and kernel log a
capture writes beside them are ordinary snapshot and kernel-log inputs."""

from __future__ import annotations

from typing import ClassVar

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample

HEADER_KEY = "oomlens_capture"
"""The key of a capture file's header line (``oomlens.capture.writer``)."""
_HEAD_PREFIX = b'{"' + HEADER_KEY.encode() + b'":'


def is_capture_head(head: bytes) -> bool:
    """The first bytes of a file are a capture file's header line."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(_HEAD_PREFIX)


class CaptureKind(InputKind):
    id: ClassVar[str] = "capture"
    label: ClassVar[str] = "an oomlens capture file"
    slot: ClassVar[str] = "captures"
    precedence: ClassVar[int] = 15
    """Before the other JSON kinds: a capture file's first line is a JSON object (a file with
    nothing after its header is one)."""
    order: ClassVar[int] = 35
    reader: ClassVar[str] = "oomlens.ingest.capture"
    names: ClassVar[tuple[str, ...]] = ("*.events.jsonl", "*.series.jsonl")
    json_document: ClassVar[bool] = True

    def recognise(self, sample: Sample) -> str | None:
        if not is_capture_head(sample.head):
            return None
        return "an oomlens capture file (its header line)"

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.capture import describe, read_capture_file

        part = read_capture_file(found.path)
        detail, rank = describe(part)
        return Reading((part,), detail, notes=part.problems, rank=rank)


KIND = CaptureKind()
