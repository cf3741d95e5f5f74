"""The shapes a traceback's lines take in what people paste: Python's own, ``rich``'s boxes,
IPython's and Jupyter's, and their headers.

``line_shape(text)`` tells what one line (launcher prefixes already stripped) is to a traceback
being read: a header, a frame (with the ``Frame`` it names), a line inside a traceback (source,
carets, a box's inside, an elision), the end of a ``rich`` box, or nothing of a traceback.  The
assembler (``oomlens.ingest.log.traceback``) decides what to do with it; a paste that starts
inside a traceback starts at the first frame-like line.

The forms (each from real pastes of the field corpus):

* Python: ``Traceback (most recent call last):`` then ``  File "<path>", line N, in <func>``
  (indented 2, or not at all when a paste lost its indentation), source and caret lines
  indented;
* ``rich`` (``rich.traceback``, the ``accelerate``/``transformers`` CLIs):
  ``╭──── Traceback (most recent call last) ────╮``, frames ``│ <path>:N in <func>   │`` (or
  ``│ in <func>:N │`` when the file is not on disk), a long path wrapped onto the next box line,
  source lines ``│ ❱ 280 │ code │``, ``... N frames hidden ...``, and ``╰───╯`` before the
  exception line;
* IPython/Jupyter: ``<Class>   Traceback (most recent call last)`` (the class first, no colon),
  frames ``File ~/x.py:12, in f(a, b)`` and ``Cell In[5], line 3`` (IPython 8),
  ``Input In [5], in <cell line: 3>()`` (8.0-8.4), ``<path> in f(a, b)`` and
  ``<ipython-input-5-..> in <module>()`` (before 8), Colab's links
  ``[<path>](https://localhost:8080/#) in f()``, source lines ``----> 3 code`` and
  ``   1497 code``, Colab's ``N frames`` collapse and ``[... skipping hidden 1 frame]``.

All patterns are anchored and bounded: time is linear in the line's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from oomlens.facts.log import Frame
from oomlens.lazyregex import lazy_regex

HEADER_TEXT = "Traceback (most recent call last)"


class Shape(Enum):
    HEADER = "header"
    FRAME = "frame"
    INSIDE = "inside"
    """Source, carets, a box's inside, an elision: inside a traceback, says nothing more."""
    BOX_END = "box_end"
    PATH_START = "path_start"
    """A ``rich`` box line holding only the start of a frame's path (wrapped)."""
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class LineShape:
    shape: Shape
    style: str = "python"
    """``python``, ``rich`` or ``ipython``."""
    frame: Frame | None = None
    header_class: str | None = None
    """IPython's header names the exception class before ``Traceback``."""
    text: str = ""
    """For ``PATH_START``: the box line's content, to prepend to the next one."""


_PY_FRAME = lazy_regex(
    r'\s{0,12}File "(?P<file>[^"\n]{1,1000})", line (?P<line>\d{1,9}), in (?P<func>\S{1,300})'
)
_RICH_HEADER = lazy_regex(r"╭[─━]{0,300} ?Traceback \(most recent call last\) ?[─━]{0,300}╮?")
_IPY_HEADER = lazy_regex(
    r"(?P<cls>[A-Za-z_][\w.]{0,200}?)\s{1,120}Traceback \(most recent call last\)\s{0,4}\Z"
)
_RICH_FRAME = lazy_regex(
    r"(?P<file>[^\s│][^│\n]{0,1000}?):(?P<line>\d{1,9}) in (?P<func>[^\s│]{1,300})\s{0,400}\Z"
)
_RICH_FRAME_NO_FILE = lazy_regex(r"in (?P<func>[^\s│:]{1,300}):(?P<line>\d{1,9})\s{0,400}\Z")
_RICH_PATH_START = lazy_regex(r"(?:/|~|[A-Za-z]:\\|\.\.?/)[^\s│]{1,1000}\Z")
_IPY_FRAME = lazy_regex(
    r"File (?P<file>(?:~|/|[A-Za-z]:\\|\.\.?/|<)[^\n]{0,1000}?):(?P<line>\d{1,9}), in "
    r"(?P<func>[^\s(]{1,300})"
)
_IPY_CELL = lazy_regex(
    r"(?:Cell In ?\[(?P<cell>\d{1,7})\], line (?P<line>\d{1,9})|"
    r"Input In \[(?P<cell2>\d{1,7})\], in (?P<func2><cell line: \d{1,9}>|[\w.]{1,300})\()"
)
_IPY_OLD_FRAME = lazy_regex(
    r"(?P<file>(?:/|~|[A-Za-z]:\\|<ipython-input-)[^\n]{0,1000}?) in (?P<func>[\w<>.]{1,300}?)"
    r"(?:\(|\Z)"
)
_COLAB_FRAME = lazy_regex(
    r"\[(?P<file>[^\]\n]{1,1000})\]\([^)\n]{0,300}\) in (?P<func>[\w<>.: ]{1,300}?)(?:\(|\Z)"
)
_IPY_OLD_START = lazy_regex(r"(?:/|~|<ipython-input-)[^\s]{0,1000}\Z")
_IPY_SOURCE = lazy_regex(r"(?:-{1,12}> ?|->|\s{1,12})\s{0,12}\d{1,7}(?:\s|\Z)")
_ELISION = lazy_regex(
    r"\s{0,40}(?:\.\.\. \d{1,7} frames? hidden \.\.\.|\[\.\.\. skipping [^\]]{0,80}\]|"
    r"\d{1,5} frames?|\.{3,20}|\[\.\.\.\])\s{0,40}\Z"
)


def line_shape(text: str) -> LineShape:
    """What ``text`` is to a traceback; see the module docstring."""
    first = text[:1]
    if first in ("│", "┃") or (first == "|" and text.rstrip().endswith("|") and "│" in text):
        return _box_line(text)
    if first in ("╭", "╰", "└", "┗"):
        if HEADER_TEXT in text and _RICH_HEADER.match(text):
            return LineShape(Shape.HEADER, "rich")
        if first in ("╰", "└", "┗"):
            return LineShape(Shape.BOX_END, "rich")
        return LineShape(Shape.OTHER)
    if HEADER_TEXT in text:
        stripped = text.strip()
        if stripped.endswith(HEADER_TEXT + ":"):
            return LineShape(Shape.HEADER)
        ipython = _IPY_HEADER.match(stripped)
        if ipython is not None:
            return LineShape(Shape.HEADER, "ipython", header_class=ipython.group("cls"))
        if _RICH_HEADER.search(text):
            return LineShape(Shape.HEADER, "rich")
        return LineShape(Shape.OTHER)
    match = _PY_FRAME.match(text)
    if match is not None:
        return LineShape(
            Shape.FRAME,
            frame=Frame(match.group("file"), int(match.group("line")), match.group("func")),
        )
    if first == "F":
        match = _IPY_FRAME.match(text)
        if match is not None:
            return LineShape(
                Shape.FRAME,
                "ipython",
                Frame(match.group("file"), int(match.group("line")), match.group("func")),
            )
    elif first in ("C", "I"):
        match = _IPY_CELL.match(text)
        if match is not None:
            cell = match.group("cell") or match.group("cell2")
            line = int(match.group("line")) if match.group("line") else 0
            return LineShape(
                Shape.FRAME,
                "ipython",
                Frame(f"<cell {cell}>", line, match.group("func2") or "<cell>"),
            )
    elif first in ("/", "~", "<") or (first.isalpha() and text[1:3] == ":\\"):
        match = _IPY_OLD_FRAME.match(text)
        if match is not None and not text.startswith("<frozen"):
            return LineShape(
                Shape.FRAME, "ipython", Frame(match.group("file"), 0, match.group("func"))
            )
    elif first == "-" and _IPY_SOURCE.match(text):
        return LineShape(Shape.INSIDE, "ipython")
    elif first == "[":
        match = _COLAB_FRAME.match(text)
        if match is not None:
            # Colab renders IPython's frames as links: "[<path>](https://localhost:8080/#) in f()"
            return LineShape(
                Shape.FRAME, "ipython", Frame(match.group("file"), 0, match.group("func"))
            )
    return LineShape(Shape.OTHER)


def box_body(text: str) -> str:
    """A ``rich`` box line's content, its borders removed."""
    body = text[1:].rstrip()
    if body.endswith(("│", "┃")):
        body = body[:-1]
    return body.strip()


def _box_line(text: str) -> LineShape:
    return box_content_shape(box_body(text))


def box_content_shape(body: str) -> LineShape:
    """The shape of a ``rich`` box line's content (borders removed): a frame, the start of a
    wrapped path, or the box's inside."""
    frame = _RICH_FRAME.match(body)
    if frame is not None and not body.startswith(("❱", "│")) and not body[:1].isdigit():
        return LineShape(
            Shape.FRAME,
            "rich",
            Frame(frame.group("file"), int(frame.group("line")), frame.group("func")),
        )
    frame = _RICH_FRAME_NO_FILE.match(body)
    if frame is not None:
        return LineShape(
            Shape.FRAME, "rich", Frame("<unknown>", int(frame.group("line")), frame.group("func"))
        )
    if _RICH_PATH_START.match(body):
        return LineShape(Shape.PATH_START, "rich", text=body)
    return LineShape(Shape.INSIDE, "rich")


def is_source_line(text: str, style: str) -> bool:
    """A line inside a traceback that is not a frame: source, carets, an elision, a blank."""
    if not text.strip() or text[:1] in " \t":
        return True
    if _ELISION.match(text):
        return True
    if style == "ipython":
        # a frame line cut by the end of a paste (``File /usr/local/lib/python3.10/dist-p``)
        return (
            _IPY_SOURCE.match(text) is not None
            or text.startswith(("---------", "File "))
            or _IPY_OLD_START.match(text) is not None
        )
    return False
