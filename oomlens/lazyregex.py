"""Patterns compiled at their first use rather than at import.

The log reader's modules hold some 160 patterns, one per shape of line it knows; compiling
them all took about 0.11-0.13 s of every process that reads a log (of a 0.35 s import), while
a log uses a handful: a dense 64-rank log read in bulk uses almost none.  ``lazy_regex``
gives an object that behaves as the compiled pattern (its methods and attributes), compiled
by ``regex`` the first time one of them is asked for.
"""

from __future__ import annotations

from typing import cast

import regex


class _LazyPattern:
    """Stands for ``regex.compile(pattern, flags)``: an attribute asked for is the compiled
    pattern's, kept on this object (a bound method looked up once), so later calls cost what
    the compiled pattern's own do.  Two threads asking at once compile twice, harmlessly."""

    def __init__(self, pattern: str, flags: int) -> None:
        self._source = (pattern, flags)
        self._compiled: regex.Pattern[str] | None = None

    def __getattr__(self, name: str) -> object:
        # only for what this object does not hold yet
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = regex.compile(*self._source)
        value = getattr(compiled, name)
        self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return f"lazy_regex({self._source[0]!r}, {self._source[1]})"


def lazy_regex(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """``regex.compile(pattern, flags)``, compiled when first used (see the module
    docstring); an invalid pattern raises then, so each is compiled by the tests."""
    return cast("regex.Pattern[str]", _LazyPattern(pattern, flags))
