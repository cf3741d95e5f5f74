"""The cyclic garbage collector paused while millions of acyclic containers are built.

Shared by the snapshot loader (``oomlens.ingest.snapshot``), the allocator analytics
(``oomlens.analysis.allocator``) and the what-if replay (``oomlens.analysis.whatif.replay``),
which all build that many: collecting in the middle doubles
their time and finds nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Cyclic GC off while millions of containers are built; they hold no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
