"""The text of an OOM message as the parsers read it: squeezed (whitespace out, with a map
back to the original indices), clipped to ``MAX_MESSAGE_CHARS``, the exception class printed
just before it, the start of the message on its line.

Pure functions of the text, linear in its length; used by ``torch_oom`` (the caching
allocator's messages) and ``oom_libraries`` (other libraries' and runtimes').
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import regex

from oomlens.lazyregex import lazy_regex

MAX_MESSAGE_CHARS = 4000

# The caching allocator's message is read from a *squeezed* copy of the text: spaces, tabs,
# line ends and non-breaking spaces removed.  A message wrapped by a terminal or a paste at any
# column (inside a word, a number or a unit) and one whose spaces became line ends read the
# same as the message printed on one line.  Units are then told apart by their spelling alone.
_SQUEEZED_OUT = frozenset(" \t\n\r\u00a0\u3000\u2007\u202f")
_SQUEEZE_TABLE = dict.fromkeys(map(ord, _SQUEEZED_OUT))
_KEPT_RUN = lazy_regex("[^" + regex.escape("".join(sorted(_SQUEEZED_OUT))) + "]+")


class Kept:
    """For every character of a squeezed text, its index in the text it was squeezed from;
    worked out on demand from the runs of kept characters, only as far as the indices looked
    up (most callers look up one or two near the start, or none when their pattern is absent).
    """

    __slots__ = ("_covered", "_raw", "_runs", "_squeezed")

    def __init__(self, text: str) -> None:
        self._runs: Iterator[regex.Match[str]] | None = _KEPT_RUN.finditer(text)
        self._squeezed: list[int] = []  # where each run starts in the squeezed text
        self._raw: list[int] = []  # ... and in the text
        self._covered = 0  # squeezed characters the runs read so far hold

    def __getitem__(self, index: int) -> int:
        if index < 0:
            raise IndexError(index)
        while index >= self._covered and self._runs is not None:
            run = next(self._runs, None)
            if run is None:
                self._runs = None
                break
            self._squeezed.append(self._covered)
            self._raw.append(run.start())
            self._covered += run.end() - run.start()
        if index >= self._covered:
            raise IndexError(index)
        at = bisect.bisect_right(self._squeezed, index) - 1
        return self._raw[at] + index - self._squeezed[at]


def squeeze(text: str) -> tuple[str, Kept]:
    """``text`` without spaces, tabs, line ends and non-breaking spaces, and for every kept
    character its index in ``text``.  Linear and in C: a log's reader calls it on every line
    of a message being collected."""
    return text.translate(_SQUEEZE_TABLE), Kept(text)


def squeezed_text(text: str) -> str:
    """``squeeze(text)`` without the index map."""
    return text.translate(_SQUEEZE_TABLE)


_EXCEPTION_BEFORE = lazy_regex(
    r"(?P<cls>[A-Za-z_][\w.:]{0,120}?(?:Error|Exception))\s{0,4}:\s{0,4}['\"]?\s{0,2}\Z"
)


def exception_class_before(text: str, start: int) -> str | None:
    """The exception class printed just before ``start`` (``torch.OutOfMemoryError: ``, within
    160 characters, lines a wrap cut it into joined: see ``wrapped_start``), or None."""
    begin = max(0, start - 160)
    before = text[begin:start]
    if "\n" not in before:
        match = _EXCEPTION_BEFORE.search(before)
        return match.group("cls") if match else None
    match = _EXCEPTION_BEFORE.search(before.replace("\n", ""))
    if match is None:
        return None
    first = at = match.start("cls")  # its index in ``before``: past the line ends before it
    for count, newline in enumerate(n for n, ch in enumerate(before) if ch == "\n"):
        if newline - count <= at:
            first += 1
    first += begin
    if "\n" in text[first:start]:
        begin = wrapped_start(text, first, start)
        match = _EXCEPTION_BEFORE.search(text[begin:start].replace("\n", ""))
    return match.group("cls") if match else None


_NAME_MAY_FOLLOW = frozenset(" \t\r\n]:|>")
WRAP_COLUMNS = 512
"""The widest a terminal or a paste box wraps at (a maximised terminal on a 4K screen holds
about 400 columns).  A longer line that is as long as the line after it may be one piece of
a wide wrap; a longer one before a shorter line is a line the program wrote (or one the
reader cut at its line limit)."""


def wrapped_start(text: str, begin: int, end: int) -> int:
    """Where a name that runs from ``begin`` to ``end`` of ``text`` across line ends really
    starts.  A terminal or a paste box wraps a line at its width: every piece but the last is
    exactly that wide, so a line end is a wrap's only when the line before it is as long as
    the line after it, or longer (the last piece) and no wider than a wrap can be
    (``WRAP_COLUMNS``).  Any other line end is where the program ended a line of its own
    (``print("hello")`` before a raised error), and the name starts after it.  A wrapped name
    also starts where a name can: at its line's start, after a space or a launcher's or
    logger's prefix (``]``, ``:``, ``|``, ``>``); one that would start inside a word or after
    a quote (``'max_batch_siz`` ending a line the reader cut) is another line's text, and the
    name starts on the next line at the earliest."""
    floor = begin
    if begin > 0 and text[begin - 1] not in _NAME_MAY_FOLLOW:
        floor = text.find("\n", begin, end) + 1
    at = text.rfind("\n", floor, end)
    while at >= floor:
        line_start = text.rfind("\n", 0, at) + 1
        next_end = text.find("\n", at + 1)
        next_end = len(text) if next_end < 0 else next_end
        before = len(text[line_start:at].rstrip("\r"))
        after = len(text[at + 1 : next_end].rstrip("\r"))
        if before != after and not after < before <= WRAP_COLUMNS:
            return at + 1
        at = text.rfind("\n", floor, at)
    return floor


def clip(text: str, start: int) -> str:
    """The message's text from ``start``: at most ``MAX_MESSAGE_CHARS``, trailing quotes,
    spaces and line ends dropped."""
    return text[start : start + MAX_MESSAGE_CHARS].rstrip("'\" \n")


def message_line_start(text: str, pos: int) -> int:
    """Start of the message that holds ``pos``: after ``Error: `` on its line, else the line."""
    line_start = text.rfind("\n", 0, pos) + 1
    match = _EXCEPTION_BEFORE.search(text, line_start, pos)
    return match.end() if match else line_start
