"""Text from the inputs is untrusted: what every output strips from it, and how a spreadsheet
is kept from reading it as a formula.

A log line can carry terminal escapes (ESC, BEL, the C1 CSI ``\\x9b``), bidirectional overrides
that make a path read backwards (U+202E), or a cell that begins with ``=`` and becomes a live
formula when the CSV is opened in a spreadsheet (``=HYPERLINK(...)``).
"""

from __future__ import annotations

import re

CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and line feed, DEL, C1 controls, bidi embeddings/overrides/isolates."""

_LINE_BREAKS = re.compile(r"[\t\n]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
FORMULA_GUARD = "'"


def strip_controls(text: str) -> str:
    """``text`` without :data:`CONTROL_CHARACTERS` (tab and line feed kept)."""
    return CONTROL_CHARACTERS.sub("", text)


def one_line(text: str) -> str:
    """``text`` without control characters, tabs and line feeds made spaces: a table cell."""
    return _LINE_BREAKS.sub(" ", strip_controls(text))


def neutralize_formula(cell: str) -> str:
    """A spreadsheet cell that cannot start a formula (OWASP's CSV-injection advice): a cell
    beginning with ``= + - @``, tab or carriage return gets a leading apostrophe."""
    return FORMULA_GUARD + cell if cell.startswith(_FORMULA_START) else cell


def restore_formula(cell: str) -> str:
    """The inverse of :func:`neutralize_formula`, for reading such a CSV back."""
    if cell.startswith(FORMULA_GUARD) and cell[1:].startswith(_FORMULA_START):
        return cell[1:]
    return cell
