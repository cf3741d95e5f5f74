"""Display-ready, bounded pieces of the report's view: untrusted text cleaned and capped, lists
capped with a count of what was left out, sizes and shares in words.  Shared by the view
(``oomlens.render.view``) and its charts (``oomlens.render.charts``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from oomlens.facts import SourceRef
from oomlens.units import format_size
from oomlens.untrusted import strip_controls

T = TypeVar("T")
S = TypeVar("S")

MAX_TEXT = 2000
"""Characters of one untrusted string (a log line, a config value, a frame)."""
MAX_SHORT_TEXT = 300


@dataclass(frozen=True, slots=True)
class Capped(Generic[T]):
    """At most a bound of items, and how many there were."""

    items: tuple[T, ...]
    total: int

    @property
    def more(self) -> int:
        return self.total - len(self.items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


def cap(source: Sequence[S], limit: int, make: Callable[[S], T]) -> Capped[T]:
    """The first ``limit`` items of ``source`` made into views (only those are built)."""
    return Capped(tuple(make(item) for item in source[:limit]), len(source))


def text(value: object, limit: int = MAX_TEXT) -> str:
    """Untrusted text for display: control and bidi characters removed, capped, one line
    breaks kept (templates show multi-line text in ``<pre>``)."""
    raw = strip_controls(str(value)).replace("\r", "")
    if len(raw) <= limit:
        return raw
    return f"{raw[:limit]}… ({len(raw) - limit:,} more characters not shown)"


def size(value: int | float | None) -> str:
    return "" if value is None else format_size(value)


def where(ref: SourceRef | None) -> str:
    return text(ref.describe(), MAX_SHORT_TEXT) if ref is not None else ""


def pct(value: float) -> str:
    return f"{value:.0%}"


@dataclass(frozen=True, slots=True)
class Fact:
    label: str
    value: str


def plain(value: Any) -> Any:
    """Mappings and sequences as plain dicts and lists (for showing as JSON)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
