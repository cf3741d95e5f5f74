"""torchelastic error files (``error.json``): the failing process' exception, written by
``@record`` or torchrun's ``--log-dir`` (``oomlens.ingest.elastic``)."""

from __future__ import annotations

from typing import ClassVar

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample


class ElasticErrorKind(InputKind):
    id: ClassVar[str] = "elastic_error"
    label: ClassVar[str] = "a torchelastic error file"
    slot: ClassVar[str] = "error_files"
    precedence: ClassVar[int] = 20
    order: ClassVar[int] = 20
    reader: ClassVar[str] = "oomlens.ingest.elastic"
    names: ClassVar[tuple[str, ...]] = ("error*.json",)
    from_workdir: ClassVar[bool] = True
    json_document: ClassVar[bool] = True

    def recognise(self, sample: Sample) -> str | None:
        data = sample.json_object
        if data is not None:
            message = data.get("message")
            if isinstance(message, str) or (
                isinstance(message, dict) and ("extraInfo" in message or "message" in message)
            ):
                return "JSON with a torchelastic 'message'"
            return None
        if sample.json_like and ('"extraInfo"' in sample.text or '"py_callstack"' in sample.text):
            return "JSON-like with torchelastic 'extraInfo'"
        return None

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.elastic import read_error_file

        where = found.location
        facts = read_error_file(found.path, rank=where.rank, local_rank=where.local_rank)
        return Reading((facts,), "torchelastic error file")


KIND = ElasticErrorKind()
