"""Read the Python/pydantic reprs that DeepSpeed's config dump prints as values.

DeepSpeed prints ``str(pydantic_model)`` for ``zero_config``, ``float16_config``,
``bfloat16_config``: space-separated ``name=value`` pairs, where a value may be a nested
model repr (``DeepSpeedZeroOffloadParamConfig(device='cpu', nvme_path=None, ...)``), a
``PosixPath('/x')``, a list, a quoted string, ``True``/``False``/``None``, an int or a float.
Pydantic-v1 builds (DeepSpeed <= 0.14) print ints with thousands separators (``500,000,000``)
and ``sys.maxsize``; enum members may print as ``<OffloadDeviceEnum.cpu: 'cpu'>``.

The parser is a bounded recursive descent over one line: no backtracking, depth-limited.
Unknown tokens do not raise: the value is kept as its raw text so that a parser upgrade in
DeepSpeed costs one field, not the whole line.
"""

from __future__ import annotations

import sys

MAX_DEPTH = 16


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1


def _read_identifier(cur: _Cursor) -> str:
    start = cur.pos
    while cur.pos < len(cur.text) and (cur.text[cur.pos].isalnum() or cur.text[cur.pos] in "_."):
        cur.pos += 1
    return cur.text[start : cur.pos]


def _read_quoted(cur: _Cursor) -> str:
    quote = cur.text[cur.pos]
    cur.pos += 1
    out: list[str] = []
    while cur.pos < len(cur.text):
        char = cur.text[cur.pos]
        if char == "\\" and cur.pos + 1 < len(cur.text):
            out.append(cur.text[cur.pos + 1])
            cur.pos += 2
            continue
        if char == quote:
            cur.pos += 1
            return "".join(out)
        out.append(char)
        cur.pos += 1
    return "".join(out)


def _read_number(cur: _Cursor, in_call: bool) -> object:
    start = cur.pos
    text = cur.text
    if cur.peek() and cur.peek() in "+-":
        cur.pos += 1
    while cur.pos < len(text):
        char = text[cur.pos]
        if char.isdigit() or char in ".eE_":
            cur.pos += 1
        elif char in "+-" and text[cur.pos - 1] in "eE":
            cur.pos += 1
        elif (
            char == ","
            and not in_call
            and text[cur.pos + 1 : cur.pos + 4].isdigit()
            and len(text[cur.pos + 1 : cur.pos + 4]) == 3
        ):
            cur.pos += 1  # pydantic-v1 pp_int: 500,000,000
        elif (
            char == ","
            and in_call
            and text[cur.pos + 1 : cur.pos + 4].isdigit()
            and (cur.pos + 4 >= len(text) or not text[cur.pos + 4].isdigit())
            and text[start : cur.pos].lstrip("+-").replace(",", "").isdigit()
            and (cur.pos + 4 >= len(text) or text[cur.pos + 4] in ",)")
        ):
            cur.pos += 1  # inside a nested repr: buffer_size=100,000,000, max_in_cpu=...
        else:
            break
    literal = text[start : cur.pos].replace(",", "")
    try:
        return int(literal)
    except ValueError:
        pass
    try:
        return float(literal)
    except ValueError:
        return literal


def _read_value(cur: _Cursor, depth: int, in_call: bool) -> object:
    if depth > MAX_DEPTH:
        raise ValueError("nesting too deep")
    cur.skip_spaces()
    char = cur.peek()
    if not char:
        return None
    if char in "'\"":
        return _read_quoted(cur)
    if char == "[" or char == "(":
        closing = "]" if char == "[" else ")"
        cur.pos += 1
        items: list[object] = []
        while True:
            cur.skip_spaces()
            if cur.peek() == closing:
                cur.pos += 1
                return items
            if cur.peek() == "":
                return items
            items.append(_read_value(cur, depth + 1, True))
            cur.skip_spaces()
            if cur.peek() == ",":
                cur.pos += 1
    if char == "{":
        cur.pos += 1
        mapping: dict[object, object] = {}
        while True:
            cur.skip_spaces()
            if cur.peek() in ("}", ""):
                cur.pos += 1
                return mapping
            key = _read_value(cur, depth + 1, True)
            cur.skip_spaces()
            if cur.peek() == ":":
                cur.pos += 1
            mapping[str(key)] = _read_value(cur, depth + 1, True)
            cur.skip_spaces()
            if cur.peek() == ",":
                cur.pos += 1
    if char == "<":
        # <OffloadDeviceEnum.cpu: 'cpu'>
        end = cur.text.find(">", cur.pos)
        inner = cur.text[cur.pos + 1 : end if end != -1 else len(cur.text)]
        cur.pos = len(cur.text) if end == -1 else end + 1
        if ": " in inner:
            return _parse_scalar_text(inner.split(": ", 1)[1])
        return inner
    if char.isdigit() or char in "+-":
        return _read_number(cur, in_call)
    name = _read_identifier(cur)
    if not name:
        # Not a value oomlens knows: consume one character so every call makes progress.
        cur.pos += 1
        return char
    if cur.peek() == "(":
        cur.pos += 1
        kwargs: dict[str, object] = {}
        positional: list[object] = []
        while True:
            cur.skip_spaces()
            if cur.peek() in (")", ""):
                cur.pos += 1
                break
            mark = cur.pos
            key = _read_identifier(cur)
            if key and cur.peek() == "=":
                cur.pos += 1
                kwargs[key] = _read_value(cur, depth + 1, True)
            else:
                cur.pos = mark
                positional.append(_read_value(cur, depth + 1, True))
            cur.skip_spaces()
            if cur.peek() == ",":
                cur.pos += 1
        if name.endswith("Path") and len(positional) == 1 and not kwargs:
            return positional[0]
        if kwargs:
            return kwargs
        return positional[0] if len(positional) == 1 else positional
    return _parse_scalar_text(name)


def _parse_scalar_text(text: str) -> object:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    if text == "sys.maxsize":
        return sys.maxsize
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return int(text.replace(",", ""))
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_scalar(text: str) -> object:
    """One dump value that is not a model repr: ``8``, ``1.0``, ``True``, ``None``, ``inf``,
    ``torch.bfloat16``, ``5,000,000``.  Unrecognised text comes back as the string."""
    return _parse_scalar_text(text)


def parse_model_repr(text: str) -> dict[str, object]:
    """``stage=3 overlap_comm=True offload_param=DeepSpeedZeroOffloadParamConfig(...)`` ->
    ``{"stage": 3, "overlap_comm": True, "offload_param": {"device": "cpu", ...}}``.

    A field whose value cannot be read is kept as its raw text; the line is never rejected.
    """
    cur = _Cursor(text.strip())
    fields: dict[str, object] = {}
    while cur.pos < len(cur.text):
        cur.skip_spaces()
        name = _read_identifier(cur)
        if not name or cur.peek() != "=":
            # Not a name=value pair: skip to the next space and go on.
            nxt = cur.text.find(" ", cur.pos + 1)
            cur.pos = len(cur.text) if nxt == -1 else nxt
            continue
        cur.pos += 1
        start = cur.pos
        try:
            fields[name] = _read_value(cur, 0, False)
        except (ValueError, IndexError):
            nxt = cur.text.find(" ", start)
            cur.pos = len(cur.text) if nxt == -1 else nxt
            fields[name] = cur.text[start : cur.pos]
    return fields
