"""Lines of the terminal summary cut to the terminal's width, with a hanging indent.

A line is cut at its spaces only, never inside a word: a ``file:line`` locator, a path, a
number with its unit stay whole, and the spans a renderer names as ``keep`` (a cited source
``(train.log:263 (rank 0))``, the members of a JSON patch) are not cut at their own spaces
either.  The first line keeps the line's own indent; the next ones start at the column
``hang``, under the item's text, so that a wrapped ``+``/``-`` item or ``fix:`` still reads as
one.  A kept span longer than a whole line is cut at its spaces after all; a word longer than
that stays whole on a line of its own (the terminal wraps it): a path may be longer than the
terminal is wide.

A shell command quoted in the text (``dmesg -T | grep -i -E 'killed process|oom'``,
``sacct -j JOBID -o JobID,State``: ``command_spans``) is never cut: a user copies it whole, and
a line break inside it (inside its quotes above all) makes another command.  It goes on a line
of its own when it does not fit where it stands, and stays whole however long it is.

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


_OPTION = re.compile(r"--?[A-Za-z][\w.=/,:+-]*")
"""A command-line option: ``-T``, ``-E``, ``--log-dir``, ``--since=today``."""
_OPERATOR = frozenset({"|", "||", "&&", ">", ">>", "<", "2>&1", "|&"})
_PROGRAM = re.compile(r"[A-Za-z0-9_][\w./+-]*")
"""A word that can name a program (``dmesg``, ``python3``, ``./run.sh``)."""


def _tokens(line: str) -> list[tuple[int, int]]:
    """The shell words of ``line`` as ``(start, end)``: split at spaces outside quotes.  A
    quote opens only at a word's start and only when it closes later in the line: the
    apostrophe of prose (``the scheduler's record``) quotes nothing."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char == " ":
            if start is not None:
                spans.append((start, index))
                start = None
        elif start is None:
            start = index
            if char in "'\"" and line.find(char, index + 1) > 0:
                quote = char
    if start is not None:
        spans.append((start, len(line)))
    return spans


def command_spans(line: str) -> list[str]:
    """The shell commands quoted in ``line``: a program's name followed by an option or an
    operator (``dmesg -T``, ``python -m``), and what follows as long as it reads as shell:
    options, operators, quoted words, the word after an option or an operator (its value, the
    next program).  A command whose program is followed by a plain word first (``git log
    -p``) is found from that option on only: from prose, its start cannot be told."""
    tokens = _tokens(line)
    words = [line[a:b] for a, b in tokens]
    shell = [bool(_OPTION.fullmatch(w)) or w in _OPERATOR for w in words]
    found: list[str] = []
    index = 0
    while index < len(tokens) - 1:
        if not (_PROGRAM.fullmatch(words[index]) and shell[index + 1]):
            index += 1
            continue
        end = index + 1
        while end + 1 < len(tokens):
            following = words[end + 1]
            quoted = following[:1] in "'\"" and " " in following
            # the word after an option is its value (``-o JobID``; not after ``--o=v``),
            # after an operator the next program (``| grep``)
            takes_next = shell[end] and "=" not in words[end]
            if shell[end + 1] or quoted or (takes_next and not following.startswith("(")):
                end += 1
            else:
                break
        found.append(line[tokens[index][0] : tokens[end][1]])
        index = end + 1
    return found


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
    commands = command_spans(line)
    words: list[str] = []
    for word in _words(line, indent, [*keep, *commands]):
        whole = any(command in word for command in commands)
        if " " in word and hang + columns(word) > width and not whole:
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
