"""A ceiling on this process's address space while a snapshot is unpickled.

The C unpickler sizes some allocations from numbers in the stream and fills them before the
loader's guard runs again: a memo-writing opcode (``PUT``, ``BINPUT``, ``LONG_BINPUT``) with index
``i`` grows the memo to ``2 * i`` pointers and writes a NULL into each, so a 9-byte pickle whose
``LONG_BINPUT`` names 0x10000000 makes this process resident in 4 GiB at once.  Parsing every
opcode in Python before the C unpickler sees it would cost several times the load itself, so the
bound is put where the allocation happens: ``RLIMIT_AS`` is lowered to what the load may use so
far (the same budget the guard applies to resident memory after the fact), and raised as the
pickle is read.  An allocation past it fails before it touches a page; the unpickler turns that
into ``MemoryError``, which the loader reports as a limit hit.

The limit is process-wide, so it is set only while this is the only Python thread (the loads of
``oomlens triage`` run in worker processes; ``analyze`` loads on its main thread after the log
scan's threads are joined) and where the platform enforces it (Linux reads it; a failing
``setrlimit`` leaves it off).  The previous limit is restored afterwards.
"""

from __future__ import annotations

import os
import resource
import threading
from types import TracebackType

# Address space is not resident memory: allocators reserve more than they touch (glibc maps
# heaps of 64 MiB, pymalloc arenas of 1 MiB).  The ceiling allows this many times the resident
# growth the guard allows, so that a genuine load never meets it before the guard's own check.
_HEADROOM = 2


def _virtual_size() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class AddressSpaceBound:
    """Context manager: while active, :meth:`allow` sets how much the address space may grow.

    Inactive (every call a no-op) when another thread runs, the size of the address space is
    unknown, or the platform refuses the limit.
    """

    def __init__(self) -> None:
        self._saved: tuple[int, int] | None = None
        self._start = 0

    def __enter__(self) -> AddressSpaceBound:
        if threading.active_count() != 1:
            return self
        start = _virtual_size()
        if start is None:
            return self
        try:
            self._saved = resource.getrlimit(resource.RLIMIT_AS)
        except (AttributeError, OSError, ValueError):
            return self
        self._start = start
        return self

    def allow(self, growth: int | None) -> None:
        """Let the address space grow by ``growth`` bytes (times the headroom) over its size
        when the load began; None lifts the ceiling back to the one before the load."""
        if self._saved is None:
            return
        soft, hard = self._saved
        if growth is None:
            limit = soft
        else:
            limit = self._start + _HEADROOM * max(growth, 0)
            for ceiling in (soft, hard):
                if ceiling != resource.RLIM_INFINITY:
                    limit = min(limit, ceiling)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        except (OSError, ValueError):
            self._saved = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._saved is not None:
            try:
                resource.setrlimit(resource.RLIMIT_AS, self._saved)
            except (OSError, ValueError):
                pass
            self._saved = None
