"""Patterns compiled at first use: they behave as compiled ones, compile once, and every one
the package holds is a valid pattern (an invalid one would raise only when a log first
needs it)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import pytest
import regex

import oomlens
from oomlens.lazyregex import _LazyPattern, lazy_regex


def test_a_lazy_pattern_matches_as_the_compiled_one() -> None:
    lazy = lazy_regex(r"rank(?P<n>\d+)", regex.IGNORECASE)
    compiled = regex.compile(r"rank(?P<n>\d+)", regex.IGNORECASE)
    text = "[RANK3]: x rank12"
    assert lazy.search(text).group("n") == compiled.search(text).group("n") == "3"  # type: ignore[union-attr]
    assert [m.group(0) for m in lazy.finditer(text)] == ["RANK3", "rank12"]
    assert lazy.sub("r", text) == compiled.sub("r", text)
    assert lazy.pattern == compiled.pattern and lazy.flags == compiled.flags
    assert lazy.groupindex == {"n": 1}


def test_it_compiles_at_first_use_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real = regex.compile

    def counting(pattern: str, flags: int = 0) -> regex.Pattern[str]:
        compiled.append(pattern)
        return real(pattern, flags)

    monkeypatch.setattr(regex, "compile", counting)
    lazy = lazy_regex(r"a+b")
    assert compiled == []
    assert lazy.match("aab") is not None
    assert lazy.fullmatch("ab") is not None and lazy.search("xx") is None
    assert lazy.match("b") is None
    assert compiled == ["a+b"]


def test_an_invalid_pattern_raises_when_first_used() -> None:
    lazy = lazy_regex(r"(unclosed")
    with pytest.raises(regex.error):
        lazy.search("x")


def _lazy_patterns(value: object, depth: int = 0) -> Iterator[_LazyPattern]:
    if isinstance(value, _LazyPattern):
        yield value
    elif depth < 3 and isinstance(value, tuple | list | frozenset | set):
        for item in value:
            yield from _lazy_patterns(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            yield from _lazy_patterns(item, depth + 1)


def test_every_pattern_of_the_package_compiles() -> None:
    found: dict[int, _LazyPattern] = {}
    for module in pkgutil.walk_packages(oomlens.__path__, "oomlens."):
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            for pattern in _lazy_patterns(value):
                found[id(pattern)] = pattern
    assert len(found) >= 150  # the log reader's shapes of line, and whatever comes after
    for pattern in found.values():
        assert isinstance(pattern.pattern, str)  # compiles it: raises if it cannot
        assert pattern._compiled is not None
