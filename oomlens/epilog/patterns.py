"""Expand sbatch's ``--output`` / ``--error`` patterns the way slurmstepd does, and find the file.

The Epilog gets the raw pattern (``/scratch/%x-%j.%N.err``).  The expansion rules below were
checked against the files Slurm 22.05 really created (``-o 'o-%J-%s-%t-%n-%N-%u-%x-%5j-%A-%a'``
gave ``o-1-batch-0-0-vm-root-pat1-00001-1-4294967294``):

* ``%j``/``%J`` job id; ``%A`` the array's job id (the job id outside arrays); ``%a`` the array
  task id (4294967294 outside arrays); ``%s`` ``batch``; ``%t``/``%n`` 0; ``%N`` the short
  host name of the node that ran the batch script (not ``SLURMD_NODENAME``); ``%u`` user;
  ``%x`` job name; ``%%`` a percent sign.
* A number after ``%`` zero-pads numbers (at most 10 digits); another letter stays as typed.
* A pattern with a backslash is not expanded at all (``\\`` is one backslash, a single one
  is dropped); a relative pattern is relative to the job's work directory.

What the Epilog's environment cannot tell (the job name and array ids in the slurmd Epilog,
the host name in the slurmctld one) becomes a wildcard; :func:`find_output_file` then looks for
the files that match, in a bounded scan.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

NOT_AN_ARRAY_TASK = "4294967294"
"""What ``%a`` expands to for a job that is not an array task (Slurm's NO_VAL)."""
_MAX_PAD_WIDTH = 10
_ASCII_DIGITS = frozenset("0123456789")
"""Slurm reads a width with C's isdigit (ASCII); str.isdigit also takes other scripts' digits."""


class _Wildcard:
    """A part of an expanded pattern that the Epilog cannot know."""

    def __repr__(self) -> str:
        return "<wildcard>"


WILDCARD = _Wildcard()
Segment = str | _Wildcard


@dataclass(frozen=True, slots=True)
class PatternValues:
    """What the specifiers expand to; None means unknown here (a wildcard)."""

    job_id: str
    user: str | None = None
    job_name: str | None = None
    hostname: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    is_array_task: bool | None = False
    """True or False when known; None when the Epilog cannot tell (the slurmd Epilog)."""


@dataclass(frozen=True, slots=True)
class Expansion:
    """One way a pattern expands: literal text and wildcards, absolute path."""

    segments: tuple[Segment, ...]

    @property
    def literal(self) -> str | None:
        """The path, when nothing in it is unknown."""
        if any(isinstance(segment, _Wildcard) for segment in self.segments):
            return None
        return "".join(segment for segment in self.segments if isinstance(segment, str))

    @property
    def glob_pattern(self) -> str:
        """The path as an ``fnmatch`` pattern: literal text escaped, unknown parts ``*``."""
        return "".join(
            "*" if isinstance(segment, _Wildcard) else glob.escape(segment)
            for segment in self.segments
        )


def expand_output_pattern(
    pattern: str, values: PatternValues, work_dir: str | None
) -> list[Expansion]:
    """The ways ``pattern`` may have expanded for this job, most likely first.

    Returns an empty list when the pattern names no file for the batch script (a bare task
    number other than 0 means ``/dev/null`` to Slurm) or when it is relative and the work
    directory is unknown.  When the Epilog cannot tell whether the job is an array task, the
    non-array expansion comes first and the one with wildcard array ids second.
    """
    if pattern.isascii() and pattern.isdigit():
        if int(pattern) != 0:
            return []
    prefix: list[Segment] = []
    if not pattern.startswith("/"):
        if not work_dir:
            return []
        prefix.append(work_dir if work_dir.endswith("/") else work_dir + "/")
    if "\\" in pattern:
        return [Expansion((*prefix, _remove_escapes(pattern)))]
    if values.is_array_task is None:
        as_single = PatternValues(
            job_id=values.job_id,
            user=values.user,
            job_name=values.job_name,
            hostname=values.hostname,
            array_job_id=values.job_id,
            array_task_id=NOT_AN_ARRAY_TASK,
            is_array_task=False,
        )
        first = Expansion((*prefix, *_expand(pattern, as_single)))
        second = Expansion((*prefix, *_expand(pattern, values)))
        return [first] if first == second else [first, second]
    return [Expansion((*prefix, *_expand(pattern, values)))]


def default_output_pattern(values: PatternValues) -> list[str]:
    """sbatch's output file when ``-o`` was not given: ``slurm-%j.out``, ``slurm-%A_%a.out``."""
    if values.is_array_task is True:
        return ["slurm-%A_%a.out"]
    if values.is_array_task is False:
        return ["slurm-%j.out"]
    return ["slurm-%j.out", "slurm-%A_%a.out"]


def _remove_escapes(pattern: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            if index + 1 < len(pattern) and pattern[index + 1] == "\\":
                out.append("\\")
                index += 2
            else:
                index += 1
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _expand(pattern: str, values: PatternValues) -> list[Segment]:
    segments: list[Segment] = []
    literal: list[str] = []

    def emit(value: str | None) -> None:
        if value is None:
            segments.append("".join(literal))
            literal.clear()
            segments.append(WILDCARD)
        else:
            literal.append(value)

    index = 0
    length = len(pattern)
    while index < length:
        char = pattern[index]
        if char != "%":
            literal.append(char)
            index += 1
            continue
        if index + 1 < length and pattern[index + 1] == "%":
            literal.append("%")
            index += 2
            continue
        index += 1
        width = 0
        digits_start = index
        while index < length and pattern[index] in _ASCII_DIGITS:
            index += 1
        if index > digits_start:
            width = min(int(pattern[digits_start:index]), _MAX_PAD_WIDTH)
            if index >= length:
                # Slurm keeps the last digit of a dangling width and drops the percent sign.
                literal.append(pattern[index - 1])
                break
        letter = pattern[index] if index < length else ""
        expansion = _specifier(letter, values)
        if expansion is _UNHANDLED:
            # Slurm keeps an unknown letter as typed (with the last width digit, if any).
            literal.append(pattern[index - 1] if index > digits_start else "%")
            continue
        index += 1
        if isinstance(expansion, str) and width and expansion.isascii() and expansion.isdigit():
            expansion = expansion.zfill(width)
        emit(expansion if isinstance(expansion, str) else None)
    segments.append("".join(literal))
    return [segment for segment in segments if segment != ""]


_UNHANDLED = object()


def _specifier(letter: str, values: PatternValues) -> str | None | object:
    if letter in ("j", "J"):
        return values.job_id
    if letter == "A":
        return values.job_id if values.is_array_task is False else values.array_job_id
    if letter == "a":
        return NOT_AN_ARRAY_TASK if values.is_array_task is False else values.array_task_id
    if letter == "s":
        return "batch"
    if letter in ("t", "n"):
        return "0"
    if letter == "N":
        return values.hostname
    if letter == "u":
        return values.user
    if letter == "x":
        return values.job_name
    return _UNHANDLED


@dataclass(frozen=True, slots=True)
class FoundFile:
    """The output file found for a pattern, with how it was found."""

    path: str
    size: int
    mtime: float
    matches: int = 1
    """How many files matched the wildcard pattern (1 for a literal path)."""
    glob_pattern: str | None = None


@dataclass(frozen=True, slots=True)
class NotFound:
    """Why no file was found."""

    tried: tuple[str, ...]
    reason: str
    not_regular: tuple[str, ...] = ()
    """Paths that exist but are no regular file (a FIFO, ``/dev/zero``, a directory)."""

    def describe(self) -> str:
        """``not a regular file: /dev/zero`` when that is why, else ``not found (why)``."""
        if self.not_regular:
            return f"not a regular file: {', '.join(self.not_regular)} (not read)"
        return f"not found ({self.reason})"


def find_output_file(
    expansions: Sequence[Expansion], *, max_entries: int = 20_000
) -> FoundFile | NotFound:
    """The regular file an expanded pattern names; never raises.

    Expansions are tried in order; a literal path wins when it exists; a wildcard pattern is
    matched by listing directories (at most ``max_entries`` entries in all), and when several
    files match, the most recently modified one is taken (``matches`` says how many there were).
    """
    tried: list[str] = []
    reasons: list[str] = []
    not_regular: list[str] = []
    budget = [max_entries]
    for expansion in expansions:
        literal = expansion.literal
        if literal is not None:
            tried.append(literal)
            found = _regular_file(literal)
            if isinstance(found, FoundFile):
                return found
            reasons.append(found)
            if found.endswith(_NOT_REGULAR):
                not_regular.append(literal)
            continue
        pattern = expansion.glob_pattern
        tried.append(pattern)
        matches = _bounded_glob(pattern, budget)
        files = [found for found in map(_regular_file, matches) if isinstance(found, FoundFile)]
        if files:
            newest = max(files, key=lambda found: (found.mtime, found.path))
            return FoundFile(newest.path, newest.size, newest.mtime, len(files), pattern)
        reasons.append(f"{pattern}: no file matches")
    if budget[0] <= 0:
        reasons.append(f"stopped listing directories after {max_entries} entries")
    return NotFound(tuple(tried), "; ".join(reasons) or "no pattern", tuple(not_regular))


_NOT_REGULAR = ": not a regular file"


def _regular_file(path: str) -> FoundFile | str:
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return f"{path}{_NOT_REGULAR}"
    return FoundFile(path, info.st_size, info.st_mtime)


def _bounded_glob(pattern: str, budget: list[int]) -> list[str]:
    """Paths matching an absolute ``fnmatch`` pattern, listing at most ``budget[0]`` entries."""
    parts = pattern.split("/")
    bases = ["/"]
    for position, part in enumerate(parts):
        if part == "":
            continue
        last = position == len(parts) - 1
        next_bases: list[str] = []
        if not glob.has_magic(part):
            name = _unescape(part)
            next_bases = [os.path.join(base, name) for base in bases]
        else:
            for base in bases:
                if budget[0] <= 0:
                    break
                try:
                    with os.scandir(base) as entries:
                        for entry in entries:
                            budget[0] -= 1
                            if budget[0] < 0:
                                break
                            if fnmatch.fnmatchcase(entry.name, part) and (last or entry.is_dir()):
                                next_bases.append(os.path.join(base, entry.name))
                except OSError:
                    continue
        bases = next_bases
        if not bases:
            return []
    return bases


def _unescape(part: str) -> str:
    """Undo ``glob.escape`` (``[*]`` -> ``*``) for a part without wildcards."""
    return part.replace("[*]", "*").replace("[?]", "?").replace("[[]", "[")
