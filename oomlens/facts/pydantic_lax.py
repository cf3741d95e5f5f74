"""pydantic v2's lax-mode coercion of scalars, restated: what a model field of type ``int``,
``bool``, ``float`` or ``str`` accepts and what it makes of it (``"1_000"`` -> 1000,
``"yes"`` -> True, ``2.0`` -> 2, ``2.5`` -> an error), as pydantic-core 2 does it.

Each ``lax_*`` returns the coerced value or raises ``CoercionError`` with pydantic's error type
and message (``int_from_float``: "Input should be a valid integer, got a number with a
fractional part").  ``ds_schema`` applies them to DeepSpeed's config models.
"""

from __future__ import annotations

import math
import re


class CoercionError(Exception):
    """A value the field's type refuses: pydantic's error type (``code``) and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_INT_STRING = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_PY_WHITESPACE = " \t\n\r\x0b\x0c"

_MAX_INT_DIGITS = 4300
"""Python's (and pydantic-core's) limit on the digits of an integer read from text."""


def lax_int(value: object) -> int:
    """pydantic v2 lax ``int`` (what DeepSpeed's integer fields accept)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CoercionError("finite_number", "Input should be a finite number")
        if not value.is_integer():
            raise CoercionError(
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
            )
        if abs(value) >= 2**63:
            raise CoercionError(
                "int_parsing_size",
                "Unable to parse input string as an integer, exceeded maximum size",
            )
        return int(value)
    if isinstance(value, str):
        text = value.strip(_PY_WHITESPACE)
        if not _INT_STRING.fullmatch(text):
            raise CoercionError(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        digits = text.split(".")[0].replace("_", "")
        if len(digits.lstrip("+-")) > _MAX_INT_DIGITS:
            raise CoercionError(
                "int_parsing_size",
                "Unable to parse input string as an integer, exceeded maximum size",
            )
        return int(digits)
    raise CoercionError("int_type", "Input should be a valid integer")


_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})

_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(value: object) -> bool:
    """pydantic v2 lax ``bool``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
        raise CoercionError(
            "bool_parsing", "Input should be a valid boolean, unable to interpret input"
        )
    if isinstance(value, float):
        if value in (0.0, 1.0):
            return bool(value)
        raise CoercionError("bool_type", "Input should be a valid boolean")
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE_STRINGS:
            return True
        if lowered in _FALSE_STRINGS:
            return False
        raise CoercionError(
            "bool_parsing", "Input should be a valid boolean, unable to interpret input"
        )
    raise CoercionError("bool_type", "Input should be a valid boolean")


def lax_float(value: object) -> float:
    """pydantic v2 lax ``float``."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip(_PY_WHITESPACE))
        except ValueError:
            raise CoercionError(
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            ) from None
    raise CoercionError("float_type", "Input should be a valid number")


def lax_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise CoercionError("string_type", "Input should be a valid string")
