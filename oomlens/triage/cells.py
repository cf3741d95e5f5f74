"""One table cell as its column's type, whatever a table read back holds.

A table given to ``oomlens triage merge`` may be made by hand or by an attacker: a JSON-lines
row can put an object, a list, a 5,000-digit number or ``1e400`` in any column.  ``integer``,
``decimal`` and ``text`` turn every such value into the column's type or raise ``ValueError``
naming the column and row, which the reader reports as one line about the file:

- a text cell holding an object or a list is that value as JSON (``figures`` is a JSON object
  by definition; elsewhere it is the value flattened to text); in a table read back, on one
  line without control characters as oomlens writes it (``one_line``), but in the exact columns;
- a number past int64 (or infinite) is a missing integer, as in tables oomlens writes (no byte
  count or rank is that large); a number written as text is read; anything else (an object, a
  list, a word, a fraction in an integer column) is refused.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from typing import Any

import pandas

from oomlens.untrusted import one_line

_INTEGER = re.compile(r"[+-]?\d+")
_INT64_DIGITS = 19
"""Decimal digits of the largest int64 (9,223,372,036,854,775,807): a longer integer is past it,
told without converting it (``int()`` refuses texts of more than 4,300 digits)."""


def _missing(value: Any) -> bool:
    return value is None or value is pandas.NA or (isinstance(value, float) and math.isnan(value))


def _where(column: str, row: int) -> str:
    return f"column {column!r}, row {row + 1}"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return f"the text {one_line(value[:40])!r}"
    return f"a {type(value).__name__}"


def integer(value: Any, column: str, row: int) -> int | None:
    """``value`` as an Int64 cell (None: missing, or past int64)."""
    if _missing(value):
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise ValueError(f"{_where(column, row)}: {_kind(value)}, not an integer")
    if isinstance(value, str):
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            raise ValueError(f"{_where(column, row)}: {_kind(value)}, not an integer")
        if len(text.lstrip("+-")) > _INT64_DIGITS:
            return None
        number = int(text)
    elif isinstance(value, numbers.Integral):
        number = int(value)
    else:
        real = float(value)
        if math.isinf(real):
            return None
        if not real.is_integer():
            raise ValueError(f"{_where(column, row)}: {real!r}, not an integer")
        number = int(real)
    return number if -(2**63) <= number < 2**63 else None


def decimal(value: Any, column: str, row: int) -> float | None:
    """``value`` as a Float64 cell (None: missing)."""
    if _missing(value):
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise ValueError(f"{_where(column, row)}: {_kind(value)}, not a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{_where(column, row)}: {_kind(value)}, not a number") from None


def text(value: Any, *, one_line_only: bool = False) -> str | None:
    """``value`` as a string cell (None: missing): an object or a list as JSON; with
    ``one_line_only``, on one line without control characters (``one_line``)."""
    if _missing(value):
        return None
    if isinstance(value, dict | list | tuple):
        value = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    written = str(value)
    return one_line(written) if one_line_only else written
