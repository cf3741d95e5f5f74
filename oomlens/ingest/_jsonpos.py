"""A small JSON reader that remembers where each key is, for ds_config files and dumps.

DeepSpeed 0.19.8 reads a config file with ``hjson.load(..., object_pairs_hook=
dict_raise_error_on_duplicate_keys)``.  This reader accepts the part of Hjson that real
configs use, and gives the values hjson would give:

* strict JSON, plus ``#``, ``//`` and ``/* */`` comments and trailing commas;
* numbers with a fraction or an exponent become ``float``, then ``int`` when integral and
  below 1e10 in magnitude (hjson's rule: ``5e8`` is the int 500000000, ``1e14`` stays a float,
  ``15099494.4`` stays a float that DeepSpeed's integer fields then reject);
* duplicate keys in any object are an error, as in DeepSpeed.

What it does not accept (quoteless keys and strings, ``'single'`` quotes, missing commas
between lines, multi-line strings) is left to the real ``hjson`` module by the caller.

``dump_syntax=True`` also accepts the bare ``inf``, ``-inf`` and ``nan`` that DeepSpeed's
``ScientificNotationEncoder`` writes into its startup ``json = {...}`` dump.

Input size and nesting depth are bounded by the caller's limits; errors are
``JsonSyntaxError`` with a 1-based line and column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

MAX_DEPTH = 64


class JsonSyntaxError(ValueError):
    """Bad input: ``message`` says what is wrong at 1-based ``line``/``column``."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


class DuplicateKeyError(JsonSyntaxError):
    """A key appears twice in one object (DeepSpeed: ``Duplicate keys in DeepSpeed config``)."""

    def __init__(self, key_path: str, line: int, column: int, first_line: int) -> None:
        super().__init__(
            f"duplicate key {key_path!r} (first at line {first_line}); DeepSpeed rejects "
            "duplicate keys",
            line,
            column,
        )
        self.key_path = key_path


class NestingError(ValueError):
    """A JSON document nested deeper than the reader allows."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested deeper than {max_depth} levels, which no such file is")
        self.max_depth = max_depth


def loads_bounded(text: str, max_depth: int = MAX_DEPTH) -> object:
    """``json.loads(text)`` for untrusted text: raises ``ValueError`` for bad JSON and
    ``NestingError`` (a ``ValueError``) for a document nested deeper than ``max_depth``, where
    ``json.loads`` alone raises ``RecursionError`` past about a thousand levels and the levels
    below that would still reach code that walks the value recursively."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestingError(max_depth) from None
    if text.count("[") + text.count("{") > max_depth and _deeper_than(value, max_depth):
        raise NestingError(max_depth)
    return value


def _deeper_than(value: object, max_depth: int) -> bool:
    stack: list[tuple[object, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return True
        children = item.values() if isinstance(item, dict) else item
        assert isinstance(children, Iterable)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


@dataclass(frozen=True, slots=True)
class ParsedJson:
    """The decoded value and, for every object key, its dotted path -> 1-based line."""

    value: object
    key_lines: dict[str, int]


_WHITESPACE = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER_START = "-0123456789"


class _Reader:
    def __init__(self, text: str, dump_syntax: bool) -> None:
        self.text = text
        self.pos = 0
        self.dump_syntax = dump_syntax
        self.key_lines: dict[str, int] = {}
        # Line starts, for turning an offset into line/column without rescanning.
        self._line_starts = [0]
        start = text.find("\n")
        while start != -1:
            self._line_starts.append(start + 1)
            start = text.find("\n", start + 1)

    # -- positions -------------------------------------------------------------------------
    def line_col(self, offset: int) -> tuple[int, int]:
        lo, hi = 0, len(self._line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self._line_starts[lo] + 1

    def fail(self, message: str, offset: int | None = None) -> JsonSyntaxError:
        line, col = self.line_col(self.pos if offset is None else offset)
        return JsonSyntaxError(message, line, col)

    def found(self) -> str:
        if self.pos >= len(self.text):
            return "end of file"
        char = self.text[self.pos]
        return repr(char) if char.isprintable() else f"character U+{ord(char):04X}"

    # -- lexing ----------------------------------------------------------------------------
    def skip_blank(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            char = text[self.pos]
            if char in _WHITESPACE or char == "\ufeff":
                self.pos += 1
            elif char == "#" or text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end == -1 else end
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end == -1:
                    raise self.fail("unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def parse_document(self) -> object:
        self.skip_blank()
        if self.pos >= len(self.text):
            return {}  # hjson reads an empty file as an empty object
        value = self.parse_value("", 0)
        self.skip_blank()
        if self.pos < len(self.text):
            raise self.fail(f"unexpected {self.found()} after the end of the top-level value")
        return value

    def parse_value(self, path: str, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH} levels")
        self.skip_blank()
        if self.pos >= len(self.text):
            raise self.fail("expected a value, found end of file")
        char = self.text[self.pos]
        if char == "{":
            return self.parse_object(path, depth)
        if char == "[":
            return self.parse_array(path, depth)
        if char == '"':
            return self.parse_string()
        if char in _NUMBER_START:
            if self.dump_syntax and self.text.startswith("-inf", self.pos):
                self.pos += 4
                return -math.inf
            return self.parse_number()
        literals: tuple[tuple[str, object], ...] = (
            ("true", True),
            ("false", False),
            ("null", None),
        )
        if self.dump_syntax:
            literals += (("inf", math.inf), ("nan", math.nan))
        for word, literal in literals:
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return literal
        raise self.fail(f"expected a value, found {self.found()}")

    def parse_object(self, path: str, depth: int) -> dict[str, object]:
        self.pos += 1  # '{'
        result: dict[str, object] = {}
        first_lines: dict[str, int] = {}
        while True:
            self.skip_blank()
            if self.pos < len(self.text) and self.text[self.pos] == "}":
                self.pos += 1
                return result
            if self.pos >= len(self.text) or self.text[self.pos] != '"':
                raise self.fail(f"expected a quoted key or '}}', found {self.found()}")
            key_offset = self.pos
            key = self.parse_string()
            key_path = f"{path}.{key}" if path else key
            line, col = self.line_col(key_offset)
            if key in result:
                raise DuplicateKeyError(key_path, line, col, first_lines[key])
            first_lines[key] = line
            self.key_lines[key_path] = line
            self.skip_blank()
            if self.pos >= len(self.text) or self.text[self.pos] != ":":
                raise self.fail(f"expected ':' after key {key!r}, found {self.found()}")
            self.pos += 1
            result[key] = self.parse_value(key_path, depth + 1)
            self.skip_blank()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
                continue
            if self.pos < len(self.text) and self.text[self.pos] == "}":
                self.pos += 1
                return result
            raise self.fail(
                f"expected ',' or '}}' after the value of {key!r}, found {self.found()}"
            )

    def parse_array(self, path: str, depth: int) -> list[object]:
        self.pos += 1  # '['
        result: list[object] = []
        while True:
            self.skip_blank()
            if self.pos < len(self.text) and self.text[self.pos] == "]":
                self.pos += 1
                return result
            result.append(self.parse_value(f"{path}[{len(result)}]", depth + 1))
            self.skip_blank()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
                continue
            if self.pos < len(self.text) and self.text[self.pos] == "]":
                self.pos += 1
                return result
            raise self.fail(f"expected ',' or ']' in a list, found {self.found()}")

    def parse_string(self) -> str:
        start = self.pos
        self.pos += 1  # opening quote
        text, n = self.text, len(self.text)
        pieces: list[str] = []
        run_start = self.pos
        while True:
            if self.pos >= n:
                raise self.fail("unterminated string", start)
            char = text[self.pos]
            if char == '"':
                pieces.append(text[run_start : self.pos])
                self.pos += 1
                return "".join(pieces)
            if char == "\\":
                pieces.append(text[run_start : self.pos])
                if self.pos + 1 >= n:
                    raise self.fail("unterminated string", start)
                esc = text[self.pos + 1]
                if esc == "u":
                    digits = text[self.pos + 2 : self.pos + 6]
                    if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                        raise self.fail("invalid \\u escape in string")
                    code = int(digits, 16)
                    self.pos += 6
                    low = text[self.pos + 2 : self.pos + 6]
                    if (
                        0xD800 <= code <= 0xDBFF
                        and text.startswith("\\u", self.pos)
                        and len(low) == 4
                        and all(c in "0123456789abcdefABCDEF" for c in low)
                        and 0xDC00 <= int(low, 16) <= 0xDFFF
                    ):
                        # A UTF-16 surrogate pair is one character, as in json and hjson.
                        code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
                        self.pos += 6
                    pieces.append(chr(code))
                elif esc in _ESCAPES:
                    pieces.append(_ESCAPES[esc])
                    self.pos += 2
                else:
                    raise self.fail(f"invalid escape \\{esc} in string")
                run_start = self.pos
                continue
            if char == "\n" or ord(char) < 0x20:
                raise self.fail("control character or line break inside a string")
            self.pos += 1

    def parse_number(self) -> int | float:
        text, start = self.text, self.pos
        pos = start
        if pos < len(text) and text[pos] == "-":
            pos += 1
        if pos < len(text) and text[pos] == "0":
            pos += 1
        elif pos < len(text) and text[pos].isdigit() and text[pos].isascii():
            while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
                pos += 1
        else:
            self.pos = pos
            raise self.fail(f"malformed number, found {self.found()}")
        int_end = pos
        has_frac = has_exp = False
        if pos < len(text) and text[pos] == ".":
            pos += 1
            digits_start = pos
            while pos < len(text) and text[pos] in "0123456789":
                pos += 1
            if pos == digits_start:
                self.pos = pos
                raise self.fail("malformed number: digits expected after '.'")
            has_frac = True
        if pos < len(text) and text[pos] in "eE":
            pos += 1
            if pos < len(text) and text[pos] in "+-":
                pos += 1
            digits_start = pos
            while pos < len(text) and text[pos] in "0123456789":
                pos += 1
            if pos == digits_start:
                self.pos = pos
                raise self.fail("malformed number: digits expected in the exponent")
            has_exp = True
        if pos < len(text) and (text[pos].isalnum() or text[pos] in "._"):
            self.pos = pos
            raise self.fail(f"malformed number, found {self.found()}")
        self.pos = pos
        literal = text[start:pos]
        if not (has_frac or has_exp):
            if int_end - start > 4300:
                raise self.fail("number too long", start)
            return int(literal)
        value = float(literal)
        if math.isinf(value):
            raise self.fail(f"number {literal} is out of range (hjson cannot read it)", start)
        if value == int(value) and abs(value) < 1e10:
            return int(value)
        return value


def parse_json_with_positions(text: str, *, dump_syntax: bool = False) -> ParsedJson:
    """Decode ``text`` as DeepSpeed would (see the module docstring), recording key lines.

    Raises ``JsonSyntaxError`` (or its ``DuplicateKeyError``) on bad input.
    """
    reader = _Reader(text, dump_syntax)
    value = reader.parse_document()
    return ParsedJson(value=value, key_lines=reader.key_lines)
