"""Byte sizes as the tools print them, and back.

torch's allocator prints with ``format_size`` (``512 bytes``, ``2.00 MiB``, ``139.80 GiB``);
DeepSpeed prints GiB labelled ``GB``; ``memory_summary`` uses ``MiB``/``KiB`` with integer
counts, older builds ``MB``/``KB``.  Every unit here is binary (1 KiB = 1 KB = 1024 bytes),
because that is what all of these tools mean, whatever the label.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException, InvalidOperation

_UNIT_FACTORS: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
    "p": 1024**5,
    "pb": 1024**5,
    "pib": 1024**5,
}

_SIZE_RE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, *, at_most: int | None = None) -> int:
    """Parse ``"1.50 GiB"``, ``"512 bytes"``, ``"80GiB"``, ``"5e8"`` into bytes (binary units).

    The result is the printed value times the unit, rounded to the nearest byte; a value
    printed with two decimals is only that precise (``1.29 GiB`` is +-5 MiB).

    Raises ValueError for anything else, and for a size over ``at_most`` bytes when it is given
    (checked before the integer is built: ``1e999999999`` would take minutes to build).
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number_text, unit = match.group(1).replace(",", "").replace("_", ""), match.group(2).lower()
    factor = _UNIT_FACTORS.get(unit)
    if factor is None:
        raise ValueError(f"unknown size unit {match.group(2)!r} in {text!r}")
    try:
        value = Decimal(number_text) * factor
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"not a size: {text!r}") from exc
    except DecimalException as exc:  # Overflow: an exponent past the context's (1e999999999)
        raise ValueError(f"{text.strip()!r} is larger than any memory") from exc
    if at_most is not None and value > at_most:
        raise ValueError(f"{text.strip()!r} is larger than any memory (over {at_most:,} bytes)")
    return int(value.to_integral_value())


def format_size(num_bytes: float) -> str:
    """Human-readable binary size: ``"1.50 GiB"``, ``"20.00 MiB"``, ``"512 B"``."""
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def printed_size_error(printed: int) -> int:
    """The most a size torch printed with ``format_size`` (two decimals of KiB, MiB or GiB;
    exact bytes up to 1024) can differ from the true size, ``printed`` being the value read
    back in bytes: half the last digit of its unit.  A value on a unit's boundary (exactly
    1 GiB: ``1024.00 MiB`` or ``1.00 GiB``) gets the larger unit's error."""
    for unit in (1024**3, 1024**2, 1024):
        if printed >= unit:
            return -(-unit // 200)  # 0.005 of the unit, rounded up
    return 0


_COUNT_RE = re.compile(
    r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*$"
)
_COUNT_FACTORS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
MAX_COUNT = 10**15
"""The largest count :func:`parse_count` takes: a thousand times the largest models' parameter
counts, and still exact in a float."""


def parse_count(text: str) -> int:
    """``7e9``, ``7B``, ``350M``, ``1,300,000,000`` -> a count (decimal suffixes, as parameter
    counts are written).  Raises ValueError for anything else, a value below 1, or one above
    :data:`MAX_COUNT` (``1e400`` reads as an infinite float: no count)."""
    match = _COUNT_RE.match(text)
    if match is None:
        raise ValueError(f"not a count: {text!r} (use e.g. 7e9, 7B, 350M)")
    number = float(match.group(1).replace(",", "").replace("_", ""))
    value = number * _COUNT_FACTORS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text!r} is less than 1")
    if not value <= MAX_COUNT:  # also inf
        raise ValueError(f"{text.strip()!r} is more than {MAX_COUNT:.0e}, no count of parameters")
    return int(round(value))
