"""glibc's allocator held steady for the log reader's pass (``steady_heap``).

The pass frees and allocates the same large buffers again and again: a batch's joined bytes
(8 MiB), the scan's arrays, a group's merged arrays.  By default glibc hands such buffers back
to the kernel (``munmap``, or trimming the heap's top) as they are freed, and the next one is
faulted in again page by page; each thread that scans also gets an arena of its own, whose heap
keeps the batches it joined.  1 GiB 64-rank logs, two cores, two scanning threads, medians of
10 and 5 interleaved runs: dense, wall 1.69 s instead of 1.75 s, CPU 2.46 s instead of 2.55 s
(minor page faults 43 k instead of 90-107 k, CPU in the kernel 0.23-0.30 s instead of
0.33-0.42 s), peak RSS 161 instead of 177 MiB; sparse, 1.32 s instead of 1.45 s, 152 instead
of 169 MiB.  Settings tried on the dense log (wall, peak RSS): one arena with the thresholds
below, 1.64 s, 171 MiB; two arenas, 1.70 s, 188 MiB; an arena per thread, 1.74 s, 205 MiB;
without them, 1.81 s, 176 MiB.

Elsewhere than glibc (no ``mallopt``) it does nothing.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MMAP_THRESHOLD = 32 << 20
"""Buffers under this come from the heap, not from a mapping of their own that is unmapped
when freed (glibc's default: 128 KiB, raised as large buffers are freed, up to 32 MiB)."""
TRIM_THRESHOLD = 64 << 20
"""Free memory at the heap's top kept up to this, not given back to the kernel to be faulted
in again by the next batch (glibc's default: 128 KiB, twice the raised mmap threshold)."""
ARENA_MAX = 1
"""Arenas: one, shared by the scanning threads (their allocations are few and large, so they
hardly wait for it), rather than one per thread, each keeping the batches its thread joined."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_DEFAULTS = (
    (_M_MMAP_THRESHOLD, 128 << 10),
    (_M_TRIM_THRESHOLD, 128 << 10),
    (_M_ARENA_MAX, 8 * (os.cpu_count() or 1)),
)
"""glibc's defaults (``mallopt(3)``): the thresholds' starting values, and the arenas it allows
a 64-bit process, eight per core (``mallopt`` takes no 0 for "the default" back)."""

_lock = threading.Lock()
_holders = 0


@functools.cache
def _libc() -> Any | None:
    """glibc through ctypes, or None where it is not the C library (musl, macOS)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _set(libc: Any, settings: tuple[tuple[int, int], ...]) -> None:
    for parameter, value in settings:
        libc.mallopt(parameter, value)


@contextmanager
def steady_heap() -> Iterator[None]:
    """glibc's allocator keeps what the pass frees and gives one arena to the threads that
    start their allocations meanwhile, until the last pass inside leaves (passes may run in
    several threads at once); then glibc's default values again and the free memory kept
    given back (``malloc_trim``).  Setting a threshold turns off glibc's raising of them as
    large buffers are freed, which cannot be turned back on: after the pass the starting
    values hold without it (a 117 MB snapshot loaded after a pass: the same page faults and
    peak RSS as in a fresh process)."""
    global _holders
    libc = _libc()
    if libc is None:
        yield
        return
    with _lock:
        _holders += 1
        if _holders == 1:
            _set(
                libc,
                (
                    (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                    (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                    (_M_ARENA_MAX, ARENA_MAX),
                ),
            )
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                _set(libc, _DEFAULTS)
                libc.malloc_trim(0)
