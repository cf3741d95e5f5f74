"""Lines of the terminal summary cut to the terminal's width, with a hanging indent.

A line is cut at its spaces only, never inside a word: a ``file:line`` locator, a path, a
number with its unit stay whole, and the spans a renderer names as ``keep`` (a cited source
``(train.log:263 (rank 0))``, the members of a JSON patch) are not cut at their own spaces
either.  The first line keeps the line's own indent; the next ones start at the column
``hang``, under the item's text, so that a wrapped ``+``/``-`` item or ``fix:`` still reads as
one.  A kept span longer than a whole line is cut at its spaces after all; a word longer than
that stays whole on a line of its own (the terminal wraps it): a path may be longer than the
terminal is wide.

Widths are counted in terminal columns: ANSI colour codes count nothing, East Asian wide
characters two, combining marks nothing.  ``width`` 0 leaves every line as it is (a pipe, a
file: what grep and diff read).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""The SGR codes ``click.style`` writes (colour, bold)."""
TAB = 8
_GLUED = re.compile(r"(?:[\d.,]+|[KMGTP]?i?B|bytes|%)[)\],;:.]*(?: |$)")
"""A word that stays on the line of the word before it: a bare number (``rank 0)``, ``GPU
1``), a unit (``24.00 MiB``)."""
MIN_TEXT = 30
"""The columns a continuation line leaves for text however deep its hanging indent."""


def columns(text: str) -> int:
    """The columns ``text`` takes on a terminal (ANSI codes left out)."""
    total = 0
    for char in ANSI.sub("", text):
        if char == "\t":
            total += TAB
        elif unicodedata.combining(char):
            continue
        elif unicodedata.east_asian_width(char) in ("W", "F"):
            total += 2
        else:
            total += 1
    return total


def wrap(line: str, width: int, hang: int | None = None, keep: Sequence[str] = ()) -> list[str]:
    """``line`` as lines of at most ``width`` columns, cut at spaces outside the ``keep``
    spans, in a run of spaces (a table's padding) and before a number's unit or a bare number
    (``24.00 MiB``, ``rank 0)``);
    continuation lines start at column ``hang`` (default: the line's indent plus two), leaving
    at least ``MIN_TEXT`` columns for their text on a narrow terminal.  ``width`` 0, or a line
    that fits: ``[line]`` unchanged."""
    if width <= 0 or columns(line) <= width:
        return [line]
    indent = len(line) - len(line.lstrip(" "))
    if hang is None:
        hang = indent + 2
    hang = max(0, min(hang, width - MIN_TEXT))
    words: list[str] = []
    for word in _words(line, indent, keep):
        if " " in word and hang + columns(word) > width:
            words += _words(word, 0, (), glue=False)  # longer than a line: cut after all
        else:
            words.append(word)
    lines: list[str] = []
    current = line[:indent] + words[0]
    used = columns(current)
    for word in words[1:]:
        size = columns(word)
        if used + 1 + size <= width:
            current += " " + word
            used += 1 + size
        elif word:  # the spaces of a run of several are dropped at a cut
            lines.append(current.rstrip(" "))
            current = " " * hang + word
            used = hang + size
    lines.append(current.rstrip(" "))
    return lines


def _words(line: str, start: int, keep: Sequence[str], glue: bool = True) -> list[str]:
    """``line[start:]`` split at its spaces, but for those inside a ``keep`` span (each looked
    for after the previous one; one not found is ignored), in a run of spaces, and (``glue``)
    before a bare number or a unit."""
    kept: set[int] = set()
    after = start
    for span in keep:
        at = line.find(span, after)
        if at < 0:
            continue
        kept.update(range(at, at + len(span)))
        after = at + len(span)
    words = []
    word_start = start
    for index in range(start, len(line)):
        if (
            line[index] == " "
            and index not in kept
            and line[index - 1] != " "  # a run of spaces is a table's padding: not a cut
            and not line.startswith(" ", index + 1)
            and not (glue and _GLUED.match(line, index + 1))
        ):
            words.append(line[word_start:index])
            word_start = index + 1
    words.append(line[word_start:])
    return words


_JSON_BREAK = re.compile(r"(?<=,) |(?<=:) (?=[{\[])")
"""Where a one-line JSON text may be cut: after a member's comma, and between a key and an
object or array that is its value."""


def json_members(text: str) -> list[str]:
    """The spans of a one-line JSON text not to cut: a key with its scalar value
    (``"stage3_prefetch_bucket_size": 50000000,`` stays whole)."""
    return [part for part in _JSON_BREAK.split(text) if " " in part]


class Wrapped:
    """Lines added one at a time, each wrapped to ``width`` (0: as they are) and then styled."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []

    def add(
        self,
        line: str,
        hang: int | None = None,
        keep: Sequence[str] = (),
        style: Callable[[str], str] | None = None,
    ) -> None:
        for piece in wrap(line, self.width, hang, keep):
            self.lines.append(style(piece) if style is not None else piece)

    def text(self) -> str:
        return "\n".join(self.lines)
