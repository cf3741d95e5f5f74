"""A config's findings of one kind are listed up to a cap; the rest are said in one finding
that counts them.

A written ds_config has a few unknown keys; a generated or hostile one of 4 MB holds hundreds
of thousands, each one a problem (DeepSpeed's models forbid extra keys) or a hazard (an unknown
top-level key), and every report repeated each one: the reports grew to hundreds of MB.  Here
each code (``extra_forbidden``, ``unknown_top_level_key``...) keeps its first ``MAX_LISTED``
findings in the order found, and one more finding stands for the rest: their count, the first
few of their keys, the source of the first.  ``ValidationProblem.count`` says how many problems
one stands for, so that a headline counts them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from oomlens.facts.config import ConfigHazard, ValidationProblem

MAX_LISTED = 50
"""Findings of one code listed one by one: more than a written config has of any."""
NAMED_IN_SUMMARY = 3
"""Keys of the findings left out that their summary names."""

_F = TypeVar("_F", ValidationProblem, ConfigHazard)


def capped_problems(problems: Sequence[ValidationProblem]) -> tuple[ValidationProblem, ...]:
    """``problems`` with at most ``MAX_LISTED`` of each code, the rest of that code in one."""
    return _capped(problems, _problem_summary)


def capped_hazards(hazards: Sequence[ConfigHazard]) -> tuple[ConfigHazard, ...]:
    """``hazards`` with at most ``MAX_LISTED`` of each code, the rest of that code in one."""
    return _capped(hazards, _hazard_summary)


def _capped(findings: Sequence[_F], summarise: Callable[[list[_F]], _F]) -> tuple[_F, ...]:
    listed: dict[str, int] = {}
    left_out: dict[str, list[_F]] = {}
    out: list[_F] = []
    for finding in findings:
        seen = listed.get(finding.code, 0)
        if seen < MAX_LISTED:
            listed[finding.code] = seen + 1
            out.append(finding)
        else:
            left_out.setdefault(finding.code, []).append(finding)
    out += [summarise(rest) for rest in left_out.values()]
    return tuple(out)


def _named(keys: Sequence[str], count: int) -> str:
    shown = ", ".join(repr(key) for key in keys[:NAMED_IN_SUMMARY])
    more = count - min(count, NAMED_IN_SUMMARY)
    return shown + (f" and {more:,} more" if more else "")


def _common_parent(keys: Sequence[str]) -> str:
    """The dotted path every key is under ("" for none): where the summary points."""
    parts = [key.split(".")[:-1] for key in keys]
    common = parts[0]
    for other in parts[1:]:
        length = 0
        for a, b in zip(common, other, strict=False):
            if a != b:
                break
            length += 1
        common = common[:length]
        if not common:
            break
    return ".".join(common)


def _problem_summary(rest: list[ValidationProblem]) -> ValidationProblem:
    first = rest[0]
    count = sum(problem.count for problem in rest)
    keys = [problem.key_path for problem in rest]
    return dataclasses.replace(
        first,
        key_path=_common_parent(keys),
        message=f"{count:,} more like the {MAX_LISTED} above ({first.code}), at "
        f"{_named(keys, len(rest))}",
        count=count,
    )


def _hazard_summary(rest: list[ConfigHazard]) -> ConfigHazard:
    first = rest[0]
    keys = [key for hazard in rest[:NAMED_IN_SUMMARY] for key in hazard.key_paths]
    return dataclasses.replace(
        first,
        message=f"{len(rest):,} more like the {MAX_LISTED} above ({first.code}), at "
        f"{_named(keys, len(rest))}",
        key_paths=tuple(keys[:NAMED_IN_SUMMARY]),
        sources=first.sources[:1],
        bytes_at_stake=None,
    )
