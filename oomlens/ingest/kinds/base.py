"""What an input kind is: how it is recognised, what its files are usually called, how it is
read, and where its facts go.

Every kind is one module of this package defining ``KIND``, an instance of an ``InputKind``
subclass; the registry (``oomlens.ingest.kinds``) finds them.  Content decides: ``recognise``
looks at a ``Sample`` of the file (its first 64 KiB, decompressed) and never trusts the name;
``names`` are only hints for the tools that pick files by name (the SLURM epilog, ``triage``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from oomlens.ingest._jsonpos import NestingError, loads_bounded
from oomlens.ingest.layout import Location
from oomlens.ingest.textstream import HEAD_BYTES, Compression

if TYPE_CHECKING:
    from oomlens.ingest.snapshot import SnapshotLimits

MAX_JSON_SNIFF_BYTES = 8 * 1024 * 1024
"""A JSON document larger than this is not parsed to tell its kind (its text is searched)."""


class Sample:
    """The part of a file a content check sees."""

    def __init__(self, path: str, size: int, head: bytes, compression: Compression) -> None:
        self.path = path
        """The file as shown in messages."""
        self.size = size
        """Bytes on disk."""
        self.head = head
        """The first ``HEAD_BYTES`` of the content, decompressed."""
        self.compression = compression

    @property
    def whole(self) -> bool:
        """``head`` holds the whole (decompressed) content."""
        if self.compression is Compression.NONE:
            return len(self.head) >= self.size
        return len(self.head) < HEAD_BYTES

    @cached_property
    def text(self) -> str:
        return self.head.decode("utf-8", "replace")

    @cached_property
    def json_like(self) -> bool:
        """The text starts like a JSON object."""
        return self.text.lstrip("\ufeff \t\r\n").startswith("{")

    @cached_property
    def _decoded(self) -> tuple[object, str | None]:
        if not self.json_like or not self.whole or self.size > MAX_JSON_SNIFF_BYTES:
            return None, None
        try:
            return loads_bounded(self.text.lstrip("\ufeff \t\r\n")), None
        except NestingError as exc:
            return None, f"JSON {exc}"
        except ValueError:
            return None, None

    @property
    def json_object(self) -> dict[str, object] | None:
        """The decoded JSON object, when the whole file is one (and small)."""
        value = self._decoded[0]
        return value if isinstance(value, dict) else None

    @property
    def json_problem(self) -> str | None:
        """Why a whole, small file that starts like JSON cannot be taken as JSON at all
        (nested too deep), else None.  Bad syntax is no problem here: the kinds look at the
        text instead."""
        return self._decoded[1]

    @cached_property
    def lines(self) -> list[str]:
        """Up to 400 non-blank lines (without one the head may have cut)."""
        lines = [line for line in self.text.splitlines()[:400] if line.strip()]
        if not self.whole and lines:
            lines = lines[:-1]
        return lines


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Bounds a caller puts on reading."""

    snapshot_limits: SnapshotLimits | None = None
    max_snapshot_bytes: int | None = None
    """Snapshots larger than this are not loaded (recorded as skipped): for time-boxed callers."""
    log_jobs: int = 1
    """Processes that scan a large training log (``oomlens.ingest.log.read_log``'s ``jobs``;
    0: one per core)."""
    progress: Callable[[str, int, int], None] | None = None
    """Told ``(file, bytes read, bytes in all)`` as a large log is read (0: size unknown)."""


@dataclass(frozen=True, slots=True)
class FoundInput:
    """A file to read, with the kind it was recognised as and what its location says."""

    path: str
    kind: InputKind
    reason: str
    """Why it is that kind (shown as the detail of some inputs, e.g. a config)."""
    location: Location = Location()


@dataclass(frozen=True, slots=True)
class Reading:
    """What reading one file gave: its facts (for the kind's slot) and how to list it."""

    facts: tuple[object, ...]
    detail: str
    notes: tuple[str, ...] = ()
    rank: int | None = None
    problem: str | None = None
    """Set when the file was left out on purpose (a caller's limit): listed with this line."""


class InputKind(ABC):
    """One kind of input.  Subclasses set the class attributes and implement the two methods."""

    id: ClassVar[str]
    """The kind's name in reports (``inputs[].kind``)."""
    label: ClassVar[str]
    """In words, with its article: ``a training log``."""
    slot: ClassVar[str]
    """The ``InputFacts`` field its facts go to (a kind with a new slot still works: its facts
    land in ``InputFacts.other`` under that name)."""
    precedence: ClassVar[int]
    """Content checks run in this order (lowest first); the first kind that recognises a file
    takes it."""
    order: ClassVar[int]
    """Inputs are read and listed kind by kind in this order (lowest first)."""
    reader: ClassVar[str]
    """The module ``read`` uses, imported when first used (``preload_readers`` imports it now)."""
    names: ClassVar[tuple[str, ...]] = ()
    """Shell patterns of the names its files usually have: hints, never trusted."""
    from_workdir: ClassVar[bool] = False
    """Jobs leave it in their work directory (the epilog picks it up there by ``names``)."""
    binary: ClassVar[bool] = False
    """Recognised before the text check (its files are not text)."""
    json_document: ClassVar[bool] = False
    """Its files are JSON objects: a JSON object that no such kind claims is no input."""
    one_per_run: ClassVar[str] = ""
    """When set, only the first file of this kind is read; the others are listed as ignored
    with this hint."""

    @abstractmethod
    def recognise(self, sample: Sample) -> str | None:
        """Why ``sample`` is of this kind, or None when it is not."""

    def accepts_plain_text(self, *, named_by_user: bool, location: Location, name: str) -> str:
        """Why a text file with no kind's marker is of this kind, or '' (only one kind, the
        training log, takes such files)."""
        return ""

    @abstractmethod
    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        """Read one file.  Raises ``InputError`` (one line: file, problem, what to do)."""

    def __repr__(self) -> str:
        return f"<input kind {self.id}>"
