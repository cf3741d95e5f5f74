"""What a failing request says about the model, read from ``allocation_sites.json``.

Some library functions allocate on the GPU only tensors of a known number of bytes per element
of the rank's partition (DeepSpeed ZeRO-3 making the fp32 master copy of a sub group): a
request that fails there bounds the partition from below (``partition_elements_at_least``).  A
frame in a file only one ZeRO stage runs names that stage (``zero_stage_of``).  Paths are
matched as ``oomlens.knowledge.frames`` matches them: the data's package-relative path is the
end of the frame's, on a ``/`` boundary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = "allocation_sites.json"


@dataclass(frozen=True, slots=True)
class AllocationSite:
    """A function whose every GPU allocation is ``bytes_per_element`` per element of (part of)
    the rank's partition, as reviewed in ``library`` ``version``."""

    library: str
    version: str
    file: str
    function: str
    bytes_per_element: int
    what: str


@dataclass(frozen=True, slots=True)
class _Data:
    sites: tuple[AllocationSite, ...]
    stages: dict[str, int]


@cache
def _data() -> _Data:
    raw = json.loads((Path(__file__).with_name(DATA)).read_text(encoding="utf-8"))
    sites = tuple(
        AllocationSite(
            s["library"], s["version"], s["file"], s["function"], s["bytes_per_element"], s["what"]
        )
        for s in raw["sites"]
    )
    return _Data(sites, {s["file"]: int(s["zero_stage"]) for s in raw["stages"]})


def _ends_with(filename: str, suffix: str) -> bool:
    path = filename.replace("\\", "/")
    return path == suffix or path.endswith("/" + suffix)


def allocation_site(filename: str, function: str) -> AllocationSite | None:
    """The reviewed site a frame is in, or None."""
    return next(
        (s for s in _data().sites if s.function == function and _ends_with(filename, s.file)),
        None,
    )


def partition_elements_at_least(filename: str, function: str, request: int) -> int | None:
    """The fewest elements the rank's partition can hold when a ``request`` of bytes failed in
    ``function`` of ``filename`` (None when the frame is no reviewed site).  ``request``: the
    fewest bytes the failing tensor can have held."""
    site = allocation_site(filename, function)
    if site is None or request < site.bytes_per_element:
        return None
    return request // site.bytes_per_element


def zero_stage_of(filename: str) -> int | None:
    """The ZeRO stage whose optimizer runs ``filename``, or None."""
    return next((stage for f, stage in _data().stages.items() if _ends_with(filename, f)), None)
