"""Click parameter types shared by the commands: counts (``1.3B``) and sizes (``80GiB``).

A size or count written without a unit is taken literally (bytes, parameters), so
``--gpu-memory 80`` would be 80 bytes and ``--params 7`` seven parameters: a bare number too
small to be what any such option means is refused, with the unit it was probably meant in.
"""

from __future__ import annotations

import re
import shutil
import sys
from typing import Any

import click

from oomlens.units import parse_count, parse_size

_BARE_NUMBER = re.compile(r"^\s*[0-9][0-9_,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\s*$")

SMALLEST_BARE_SIZE = 2**20
"""A size without a unit below 1 MiB is refused: no GPU, host or process holds so little."""
SMALLEST_BARE_COUNT = 10**4
"""A count without a suffix below ten thousand is refused: no model DeepSpeed trains, nor its
largest layer, is that small (a LoRA adapter of rank 1 on one 100-wide layer has 200)."""


def _is_bare(text: str) -> bool:
    return _BARE_NUMBER.match(text) is not None


class _CountType(click.ParamType):
    name = "COUNT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        try:
            count = parse_count(text)
        except ValueError as err:
            self.fail(str(err), param, ctx)
        except OverflowError:
            self.fail(f"{text!r} is too large a count", param, ctx)
        if _is_bare(text) and count < SMALLEST_BARE_COUNT:
            number = text.strip()
            self.fail(
                f"{number} without a suffix is {number} parameters; did you mean {number}B "
                f"({number} billion) or {number}M? (write 7B, 350M or 7e9)",
                param,
                ctx,
            )
        return count


MAX_SIZE = 2**64
"""The largest size an option takes: what a 64-bit address space holds (16 EiB)."""


class _SizeType(click.ParamType):
    name = "SIZE"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        try:
            size = parse_size(text, at_most=MAX_SIZE)
        except ValueError as err:
            self.fail(f"{err} (use e.g. 80GiB, 512GB)", param, ctx)
        if size < 0 or (size == 0 and not self.allow_zero):
            self.fail(f"{value!r} is not a positive size", param, ctx)
        if size and _is_bare(text) and size < SMALLEST_BARE_SIZE:
            number = text.strip()
            # nvidia-smi prints MiB (81559MiB); GiB is how a card or host is spoken of.
            unit = "GiB" if size < 10_000 else "MiB"
            self.fail(
                f"{number} without a unit is {number} bytes; did you mean {number}{unit}? "
                "(write the unit: 80GiB, 81559MiB; GB is read as GiB)",
                param,
                ctx,
            )
        return size


class _JobsType(click.ParamType):
    """``auto`` (0: one per core) or a number of processes, at least 1."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return 0
        if not str(value).strip().isdigit() or int(value) < 1:
            self.fail(f"{value!r}: give a number of processes (at least 1) or auto", param, ctx)
        return int(value)


SIZE_HELP = "With its unit; GB, MB are read as GiB, MiB (as torch and nvidia-smi mean them)."

WIDTH_HELP = (
    "Wrap the text output at N columns, with a hanging indent (0: one line per item). "
    "Default: the terminal's width (COLUMNS, else 100) when standard output is a terminal, "
    "else 0."
)
FALLBACK_WIDTH = 100


def output_width(asked: int | None) -> int:
    """The columns the text output wraps at: ``--width`` when given; else, when standard
    output is a terminal, its width (``COLUMNS`` first, 100 when it cannot be told); else 0,
    no wrapping: piped or redirected output keeps one line per item for grep and diff."""
    if asked is not None:
        return asked
    if not sys.stdout.isatty():
        return 0
    return shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns


class Progress:
    """Reading progress of large logs on stderr (a terminal's: one line, rewritten at most
    twice a second, cleared at the end of each file)."""

    def __init__(self) -> None:
        self._last = 0.0
        self._shown = ""

    def __call__(self, path: str, done: int, total: int) -> None:
        import time

        now = time.monotonic()
        finished = total > 0 and done >= total
        if not finished and now - self._last < 0.5:
            return
        self._last = now
        name = path if len(path) <= 40 else "..." + path[-37:]
        mib = done / 2**20
        text = (
            f"oomlens: reading {name}: {100 * done // total}% of {total / 2**20:.0f} MiB"
            if total
            else f"oomlens: reading {name}: {mib:.0f} MiB"
        )
        pad = " " * max(0, len(self._shown) - len(text))
        click.echo("\r" + text + pad, nl=False, err=True)
        self._shown = text
        if finished:
            click.echo("\r" + " " * len(text) + "\r", nl=False, err=True)
            self._shown = ""


COUNT = _CountType()
JOBS = _JobsType()
SIZE = _SizeType()
SIZE_OR_ZERO = _SizeType(allow_zero=True)
