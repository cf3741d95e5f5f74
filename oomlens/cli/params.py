"""Click parameter types shared by the commands: counts (``1.3B``) and sizes (``80GiB``)."""

from __future__ import annotations

from typing import Any

import click

from oomlens.units import parse_count, parse_size


class _CountType(click.ParamType):
    name = "COUNT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_count(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class _SizeType(click.ParamType):
    name = "SIZE"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            size = parse_size(str(value))
        except ValueError as err:
            self.fail(f"{err} (use e.g. 80GiB, 512GB)", param, ctx)
        if size < 0 or (size == 0 and not self.allow_zero):
            self.fail(f"{value!r} is not a positive size", param, ctx)
        return size


COUNT = _CountType()
SIZE = _SizeType()
SIZE_OR_ZERO = _SizeType(allow_zero=True)
