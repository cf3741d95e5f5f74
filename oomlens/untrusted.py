"""Text from the inputs is untrusted: what every output strips from it, how a spreadsheet
is kept from reading it as a formula, and how a name that must stay exact (a run's directory)
is written where control characters cannot go.

A log line can carry terminal escapes (ESC, BEL, the C1 CSI ``\\x9b``), bidirectional overrides
that make a path read backwards (U+202E), or a cell that begins with ``=`` and becomes a live
formula when the CSV is opened in a spreadsheet (``=HYPERLINK(...)``).
"""

from __future__ import annotations

import re

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Every character of Unicode's Bidi_Control property (PropList.txt), as a regex class body:
the Arabic letter mark, the left-to-right and right-to-left marks, and the embeddings,
overrides and isolates.  A mark alone reorders the text around it, as an override does."""
CONTROL_CHARACTERS = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}]")
"""C0 controls but tab and line feed, DEL, C1 controls, every bidi control."""

_LINE_BREAKS = re.compile(r"[\t\n]")
_ESCAPED = re.compile(rf"[\\\x00-\x1f\x7f-\x9f{BIDI_CONTROLS}\ud800-\udfff]")
"""What :func:`escape_controls` writes as an escape: the backslash itself, every C0 control
(tab, line feed and carriage return included), DEL, C1, bidi controls, and lone surrogates
(the bytes of a file name that are not UTF-8, as ``os.fsdecode`` gives them)."""
_ESCAPE_SEQUENCE = re.compile(r"\\(?:([\\tnr])|x([0-9a-f]{2})|u([0-9a-f]{4}))")
_SHORT_ESCAPES = {"\\": "\\", "\t": "t", "\n": "n", "\r": "r"}
_SHORT_UNESCAPES = {short: character for character, short in _SHORT_ESCAPES.items()}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
FORMULA_GUARD = "'"


_SURROGATES = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = range(0xDC80, 0xDD00)
"""What ``os.fsdecode`` (``surrogateescape``) makes of the bytes 0x80..0xff of a file name that
are not UTF-8: the byte ``b`` as U+DC00 + ``b``."""


def without_surrogates(text: str) -> str:
    r"""``text`` that UTF-8 can encode: every surrogate code point in it (a ``str`` may hold
    them alone, which no UTF-8 output can) written as an escape: ``\xff`` for the byte 0xff of
    a file name that is not UTF-8 (``os.fsdecode``'s U+DCFF), ``\ud800`` for any other (a
    JSON string's ``"\ud800"``).  Text without one is returned as it is.

    Every rendered output goes through it (``oomlens.render.registry.render``), so that no
    report, table or summary fails to be written or is written as bytes that are not UTF-8."""
    if _SURROGATES.search(text) is None:
        return text
    return _SURROGATES.sub(_surrogate_escape, text)


def _surrogate_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if code in _SURROGATE_ESCAPE else f"\\u{code:04x}"


def strip_controls(text: str) -> str:
    """``text`` without :data:`CONTROL_CHARACTERS` (tab and line feed kept)."""
    return CONTROL_CHARACTERS.sub("", text)


def one_line(text: str) -> str:
    """``text`` without control characters, tabs and line feeds made spaces, surrogates
    escaped (``without_surrogates``): a table cell, a message's line."""
    return without_surrogates(_LINE_BREAKS.sub(" ", strip_controls(text)))


def escape_controls(text: str) -> str:
    r"""``text`` with every character of ``_ESCAPED`` written as a backslash escape (``\\``,
    ``\t``, ``\n``, ``\r``, ``\x1b``, ``\u202e``, ``\udcff``): one line of plain text that
    :func:`unescape_controls` turns back into ``text`` exactly."""
    return _ESCAPED.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    short = _SHORT_ESCAPES.get(character)
    if short is not None:
        return "\\" + short
    code = ord(character)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def unescape_controls(text: str) -> str:
    """The inverse of :func:`escape_controls` (a backslash not starting one of its escapes is
    kept as it is)."""
    return _ESCAPE_SEQUENCE.sub(_unescape, text)


def _unescape(match: re.Match[str]) -> str:
    short, byte, code = match.groups()
    if short is not None:
        return _SHORT_UNESCAPES[short]
    return chr(int(byte or code, 16))


def shown(text: str) -> str:
    r"""``text`` for a terminal or a page, on one line: backslashes doubled and every character
    that is not printable (controls, line breaks, bidi controls, undecodable bytes) as its
    escape, so that names differing only there look different (``a\tb``, ``a\nb``, ``a\\nb``).
    For display only: the result is not meant to be read back."""
    return "".join(_shown(character) for character in text)


def _shown(character: str) -> str:
    short = _SHORT_ESCAPES.get(character)
    if short is not None:
        return "\\" + short
    return character if character.isprintable() else ascii(character)[1:-1]


def neutralize_formula(cell: str) -> str:
    """A spreadsheet cell that cannot start a formula (OWASP's CSV-injection advice): a cell
    beginning with ``= + - @``, tab or carriage return gets a leading apostrophe, and so does one
    beginning with an apostrophe, so that :func:`restore_formula` can tell the two apart."""
    return FORMULA_GUARD + cell if cell.startswith((*_FORMULA_START, FORMULA_GUARD)) else cell


def restore_formula(cell: str) -> str:
    """The inverse of :func:`neutralize_formula`, for reading such a CSV back."""
    if cell.startswith(FORMULA_GUARD) and cell[1:].startswith((*_FORMULA_START, FORMULA_GUARD)):
        return cell[1:]
    return cell
