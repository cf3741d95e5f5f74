"""The registry of input kinds: every module of this package that defines ``KIND``.

Adding an input kind is adding one module here (see ``base.InputKind``): its content check,
its file-name hints, its reader and the slot of the run's facts it fills.  Run discovery
(``oomlens.ingest.detect``), reading (``oomlens.ingest.run``), ``oomlens triage`` and the SLURM
epilog all go through this registry.
"""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample

__all__ = [
    "KINDS",
    "FoundInput",
    "InputKind",
    "ReadOptions",
    "Reading",
    "Sample",
    "by_precedence",
    "kind",
    "kind_by_name",
    "preload_readers",
    "workdir_patterns",
]


def _discover() -> tuple[InputKind, ...]:
    found: list[InputKind] = []
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base" or module.name.startswith("_"):
            continue
        declared = getattr(importlib.import_module(f"{__name__}.{module.name}"), "KIND", None)
        if isinstance(declared, InputKind):
            found.append(declared)
    return tuple(sorted(found, key=lambda k: k.order))


KINDS: tuple[InputKind, ...] = _discover()
"""Every kind, in reading (and listing) order.  Read it as ``kinds.KINDS`` (not imported by
name), so that the registry stays one object."""


def by_precedence() -> tuple[InputKind, ...]:
    """Every kind in the order content checks run."""
    return tuple(sorted(KINDS, key=lambda k: k.precedence))


def kind(kind_id: str) -> InputKind:
    """The kind named ``kind_id``; KeyError for an unknown one."""
    for candidate in KINDS:
        if candidate.id == kind_id:
            return candidate
    raise KeyError(kind_id)


def kind_by_name(name: str) -> InputKind | None:
    """The kind whose name hints (``InputKind.names``) match the file name ``name``, if any."""
    lower = name.lower()
    for candidate in KINDS:
        if any(fnmatch.fnmatchcase(lower, pattern) for pattern in candidate.names):
            return candidate
    return None


def preload_readers() -> None:
    """Import every kind's reader now (for processes that later cannot read the installation,
    and for forked workers that should start warm)."""
    for candidate in KINDS:
        importlib.import_module(candidate.reader)


def workdir_patterns() -> tuple[str, ...]:
    """The names of the files jobs leave in their work directory, of every kind that says so."""
    return tuple(p for k in KINDS if k.from_workdir for p in k.names)
