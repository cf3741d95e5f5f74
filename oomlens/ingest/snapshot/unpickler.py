"""Restricted, bounded unpickling for untrusted snapshot files.

A torch memory snapshot is a pickle of builtin containers and scalars only: torch builds it
from plain ``dict``/``list``/``str``/``int``/``tuple``/``bool``/``float`` objects and dumps it
with the stdlib pickler, and an opcode scan of every 2.11 layout finds no ``GLOBAL``,
``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST`` or ``OBJ``.  So the loader allows no import and
no call at all:

* it subclasses the C ``pickle.Unpickler`` (full speed) with a ``find_class`` that refuses every
  name (reached by ``GLOBAL``, ``STACK_GLOBAL``, ``INST`` and ``EXT1/2/4``) and a
  ``persistent_load`` that refuses every id (``PERSID``, ``BINPERSID``).  Without an importable
  name the stream can hold no callable, so ``REDUCE``, ``OBJ``, ``NEWOBJ`` and ``BUILD`` can
  only fail; the loader then names the opcode by scanning the stream with
  :func:`pickletools.genops`, which parses and never executes.
* One hole remains in the C unpickler: ``EXT*`` codes already resolved once in this process are
  served from ``copyreg._extension_cache`` without calling ``find_class``.  When that cache is
  not empty, the loader switches to the pure-Python unpickler with every forbidden opcode
  removed from its dispatch table (slower, equally strict).
* The stream is read through a guard that bounds the bytes read (``max_input_bytes``, applied
  after gzip), the size of any one item (``max_item_bytes``: a declared 2**60-byte string is
  refused before anything is allocated) and the wall-clock time (``max_seconds``).
* What the unpickler builds is bounded too, far below the machine's memory, because several
  loads run at once (triage): the containers it creates (``max_containers`` plus one per
  ``bytes_per_container`` bytes of pickle: counted exactly, from the cyclic collector's
  allocation counter, which only grows while the collector is paused), the strings and bytes
  read as items larger than 256 KiB (``max_string_bytes``: a real snapshot has none), how far a
  gzip stream inflates (``max_gunzip_ratio``), and this process's memory growth, both per byte
  of pickle (``max_memory_ratio``) and in total (``max_memory_bytes``, and a share of the
  memory available).  The guard hands the unpickler at most 64 KiB at a time, so these checks
  run at least every 64 KiB of pickle: a stream of one-byte container opcodes is stopped
  within a few MiB of memory, not gigabytes.

Entry point: :func:`restricted_load`.  Errors are :class:`oomlens.errors.InputError` (refused,
corrupt, truncated, not a pickle) or :class:`oomlens.errors.ResourceLimitError` (a limit hit),
each one line naming the file, what is wrong and what to do.  Nothing else escapes, except
``KeyboardInterrupt``.
"""

from __future__ import annotations

import copyreg
import gc
import gzip
import io
import os
import pickle
import resource
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from oomlens.errors import InputError, ResourceLimitError
from oomlens.gcpause import gc_paused
from oomlens.ingest.files import open_regular
from oomlens.ingest.snapshot.addrspace import AddressSpaceBound
from oomlens.units import format_size

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1024**2
GiB = 1024**3

_GZIP_MAGIC = b"\x1f\x8b"
# The most the unpickler gets per call into the guard, hence how often the limits are checked.
# 64 KiB costs nothing measurable against 1 MiB (bench/snapshot_bench.py, 1 GB: the same time
# within noise; about 16,000 checks of a few microseconds each) and bounds what one chunk of
# one-byte opcodes can build to some 15 MB.
_CHUNK = 64 * 1024
# Items the unpickler reads in one piece above this size count towards max_string_bytes.  The
# stdlib pickler writes frames of about 64 KiB and puts any larger payload outside them, so
# nothing a real snapshot holds comes near it.
_LARGE_ITEM = 256 * 1024
# A pickle never unpickles into less memory than it occupies on disk; a real 2.11 snapshot
# inflates about 3x.  Used only to refuse up front what cannot fit.
_MIN_INFLATION = 1.5

FORBIDDEN_OPCODES: dict[str, str] = {
    "GLOBAL": "imports a Python name",
    "STACK_GLOBAL": "imports a Python name",
    "INST": "imports a class and calls it",
    "OBJ": "calls a class",
    "REDUCE": "calls a function",
    "BUILD": "sets the state of an object (may call __setstate__)",
    "NEWOBJ": "creates an instance of a class",
    "NEWOBJ_EX": "creates an instance of a class",
    "EXT1": "imports a name through the copyreg extension registry",
    "EXT2": "imports a name through the copyreg extension registry",
    "EXT4": "imports a name through the copyreg extension registry",
    "PERSID": "asks for an external object (persistent id)",
    "BINPERSID": "asks for an external object (persistent id)",
}
"""Opcodes that import or call something, and what each would do; no real snapshot has any."""

_MEMORY_HINT = (
    "load it on a machine with more free memory, or raise SnapshotLimits.max_memory_bytes"
)
_REFUSAL_HINT = (
    "a torch memory snapshot holds only plain data, so this file was not written by "
    "torch.cuda.memory._snapshot() or was altered; nothing in it was run. Get the snapshot "
    "from the job again, and do not open this file with pickle.load or "
    "'python -m torch.cuda._memory_viz', which would run it"
)


@dataclass(frozen=True, slots=True)
class SnapshotLimits:
    """Bounds on what loading one snapshot may cost.

    ``max_input_bytes``: pickle bytes read (after gunzip).  ``max_item_bytes``: the largest
    single read the unpickler may ask for (one string, bytes object or frame; real snapshots
    need well under 1 MiB).  ``max_seconds``: wall-clock time of the load (None: no limit).
    ``max_memory_bytes``: growth of this process's resident memory during the load (None: no
    fixed limit).  ``available_memory_fraction``: also refuse to grow past this share of the
    memory the OS reports available when the load starts (None: ignore it).

    What the unpickler may build (None switches a limit off):

    * ``max_containers`` lists, dicts, tuples and sets, plus one more per
      ``bytes_per_container`` bytes of pickle read.  Real snapshots build one per 38 to 140
      bytes (the corpus); a stream of ``EMPTY_SET`` opcodes builds one per byte.
    * ``max_string_bytes``: total bytes of the strings and bytes the pickle holds as items over
      256 KiB (a real snapshot holds none; its strings are frame names and file paths).
    * ``max_gunzip_ratio``: a gzip'd pickle may inflate to at most this many times the
      compressed bytes read, after the first ``gunzip_allowance_bytes`` (real snapshots compress
      3x to 15x).
    * ``max_memory_ratio``: memory growth per byte of pickle read, after the first
      ``memory_allowance_bytes`` (real snapshots: 4x to 6x).

    The walk over the loaded data is bounded by what it visits, not by the file: at most
    ``max_blocks`` blocks (summed over segments) and ``max_trace_entries`` trace entries.
    """

    max_input_bytes: int = 64 * GiB
    max_item_bytes: int = 16 * MiB
    max_seconds: float | None = 3600.0
    max_memory_bytes: int | None = None
    available_memory_fraction: float | None = 0.8
    max_containers: int | None = 256 * 1024
    bytes_per_container: int = 8
    max_string_bytes: int | None = 64 * MiB
    max_gunzip_ratio: float | None = 64.0
    gunzip_allowance_bytes: int = 4 * MiB
    max_memory_ratio: float | None = 12.0
    memory_allowance_bytes: int = 256 * MiB
    max_blocks: int | None = 20_000_000
    max_trace_entries: int | None = 200_000_000

    def effective_memory_limit(self) -> int | None:
        """The memory-growth limit now: the smaller of the fixed and the available-based one."""
        limits: list[int] = []
        if self.max_memory_bytes is not None:
            limits.append(self.max_memory_bytes)
        if self.available_memory_fraction is not None:
            available = _available_memory_bytes()
            if available is not None:
                limits.append(int(available * self.available_memory_fraction))
        return min(limits) if limits else None


@dataclass(frozen=True, slots=True)
class LoadedPickle:
    """What :func:`restricted_load` returns: the data plus how it was stored."""

    data: object
    protocol: int | None
    compressed: bool
    file_bytes: int
    pickle_bytes: int


def looks_like_snapshot_pickle(head: bytes) -> bool:
    """Cheap content sniff: does ``head`` (the first bytes of a file) start a snapshot pickle?

    True for a pickle that opens with the ``PROTO`` opcode and protocol 2 to 5 (every pickle
    torch has written), or for a gzip (deflate) stream whose first bytes do, or whose first
    bytes ``head`` is too short to inflate (a dynamic Huffman header can take a hundred bytes).
    Reads nothing but ``head``; never unpickles.
    """
    if head[:2] == _GZIP_MAGIC:
        if len(head) < 3 or head[2] != 8:  # 8: deflate, the only method gzip defines
            return False
        try:
            inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 8)
        except zlib.error:
            return False
        return len(inflated) < 2 or _is_proto_2_to_5(inflated)
    return _is_proto_2_to_5(head)


def _is_proto_2_to_5(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == pickle.PROTO[0] and 2 <= head[1] <= 5


# --------------------------------------------------------------------------------------------
# Internal signals raised from inside the unpickler
# --------------------------------------------------------------------------------------------


class _Stop(Exception):
    """Base of the signals the guard and the hooks raise through the unpickler."""


class _ImportRefused(_Stop):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.module = module
        self.name = name


class _OpcodeRefused(_Stop):
    def __init__(self, opcode: str) -> None:
        super().__init__(opcode)
        self.opcode = opcode


class _LimitHit(_Stop):
    def __init__(self, problem: str, hint: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint


class _Truncated(_Stop):
    def __init__(self, needed: int, available: int) -> None:
        super().__init__(f"needs {needed} more bytes, {available} left")
        self.needed = needed
        self.available = available


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler with every import and persistent id refused."""

    def find_class(self, module: str, name: str, /) -> NoReturn:
        raise _ImportRefused(module, name)

    def persistent_load(self, pid: object, /) -> NoReturn:
        raise _OpcodeRefused("PERSID/BINPERSID")


def _refuse(opcode: str) -> Callable[[Any], None]:
    def refuse(_unpickler: Any) -> None:
        raise _OpcodeRefused(opcode)

    return refuse


def _restricted_dispatch() -> dict[int, Callable[[Any], None]]:
    table: dict[int, Callable[[Any], None]] = dict(pickle._Unpickler.dispatch)
    for name in FORBIDDEN_OPCODES:
        table[getattr(pickle, name)[0]] = _refuse(name)
    return table


class _PurePythonRestrictedUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with the forbidden opcodes removed from its dispatch table.

    Used only when ``copyreg._extension_cache`` is not empty (see the module docstring).
    """

    dispatch = _restricted_dispatch()

    def find_class(self, module: str, name: str, /) -> NoReturn:
        raise _ImportRefused(module, name)

    def persistent_load(self, pid: object, /) -> NoReturn:
        raise _OpcodeRefused("PERSID/BINPERSID")


# --------------------------------------------------------------------------------------------
# Guarded reading
# --------------------------------------------------------------------------------------------


class _Stream(Protocol):
    """What the guard needs from the file: a buffered reader or a GzipFile."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readinto(self, buffer: Any, /) -> int: ...

    def readline(self, size: int = -1, /) -> bytes: ...

    def peek(self, size: int, /) -> bytes: ...


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class _MemoryProbe:
    """Resident set size of this process: /proc/self/statm where it exists, else peak RSS."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def rss(self) -> int:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _GuardedReader:
    """File-like object handed to the unpickler; every byte it reads passes the limits.

    The C unpickler peeks ahead (at most ``_CHUNK`` bytes here), works through what it got,
    then reads what it consumed; items larger than that it reads in one call.  So every
    ``_CHUNK`` bytes of pickle, and before every large item, the guard checks the limits
    (:meth:`checkpoint`).  ``consumed`` is how far the unpickler has got (used to place
    errors).  ``compressed_position`` (a gzip'd file only) reports how many compressed bytes
    have been read, for the inflation limit.
    """

    def __init__(
        self,
        inner: _Stream,
        *,
        known_size: int | None,
        limits: SnapshotLimits,
        memory_limit: int | None,
        probe: _MemoryProbe,
        compressed_position: Callable[[], int] | None = None,
        bound: AddressSpaceBound | None = None,
    ) -> None:
        self._inner = inner
        self._bound = bound
        self._remaining = known_size
        self._limits = limits
        self._max_input = limits.max_input_bytes
        self._max_item = limits.max_item_bytes
        self._deadline = (
            None if limits.max_seconds is None else time.monotonic() + limits.max_seconds
        )
        self._memory_limit = memory_limit
        self._probe = probe
        self._rss_start = probe.rss()
        self._containers_start = _containers_built()
        self._compressed_position = compressed_position
        self._next_check = _CHUNK
        self.large_item_bytes = 0
        self.consumed = 0

    def _advance(self, count: int) -> None:
        self.consumed += count
        if self._remaining is not None:
            self._remaining -= count
        if self.consumed > self._max_input:
            raise _LimitHit(
                f"the pickle is larger than the input limit of {format_size(self._max_input)}",
                "raise SnapshotLimits.max_input_bytes if this file is a genuine snapshot",
            )
        if self.consumed >= self._next_check:
            self._next_check = self.consumed + _CHUNK
            self.checkpoint()

    def _check_item(self, wanted: int) -> None:
        if wanted > self._max_item:
            raise _LimitHit(
                f"the pickle declares a single {format_size(wanted)} item at about byte "
                f"{self.consumed}, over the {format_size(self._max_item)} limit; a real snapshot "
                "holds nothing that large, so the file is corrupt or crafted",
                "check where the file came from",
            )
        if self._remaining is not None and wanted > self._remaining:
            raise _Truncated(wanted, self._remaining)
        if wanted > _LARGE_ITEM:
            self.large_item_bytes += wanted
            limit = self._limits.max_string_bytes
            if limit is not None and self.large_item_bytes > limit:
                raise _LimitHit(
                    f"the pickle holds more than {format_size(limit)} of strings or bytes in "
                    f"items over {format_size(_LARGE_ITEM)} (stopped at about byte "
                    f"{self.consumed}); a real snapshot holds none that large, so the file is "
                    "crafted or corrupt",
                    "check where the file came from; raise SnapshotLimits.max_string_bytes "
                    "if it is a genuine snapshot",
                )
            self.checkpoint()

    def _check_time(self) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise _LimitHit(
                f"loading took longer than the {self._limits.max_seconds:g} s limit",
                "raise SnapshotLimits.max_seconds if the file is a genuine (very large) snapshot",
            )

    def checkpoint(self) -> None:
        """Check time, containers, inflation and memory so far; raise ``_LimitHit`` if over."""
        self._check_time()
        limits = self._limits
        consumed = self.consumed
        if limits.max_containers is not None:
            built = _containers_built() - self._containers_start
            allowed = limits.max_containers + consumed // max(limits.bytes_per_container, 1)
            if built > allowed:
                raise _LimitHit(
                    f"the pickle builds {built:,} lists, dicts, tuples or sets from the first "
                    f"{format_size(consumed)}, more than one per {limits.bytes_per_container} "
                    "bytes; a real snapshot builds about one per 40 bytes or more, so the file "
                    "is crafted or corrupt",
                    "check where the file came from; raise SnapshotLimits.max_containers if it "
                    "is a genuine snapshot",
                )
        if self._compressed_position is not None and limits.max_gunzip_ratio is not None:
            compressed = self._compressed_position()
            if consumed > limits.gunzip_allowance_bytes + limits.max_gunzip_ratio * compressed:
                raise _LimitHit(
                    f"the gzip stream inflates {format_size(compressed)} into more than "
                    f"{format_size(consumed)}, over {limits.max_gunzip_ratio:g}x (a real "
                    "snapshot compresses 15x at most): a compression bomb",
                    "check where the file came from; raise SnapshotLimits.max_gunzip_ratio "
                    "if it is a genuine snapshot",
                )
        self.check_memory()

    def check_memory(self) -> None:
        """Check time and memory growth (in total and per byte of pickle read)."""
        self._check_time()
        limits = self._limits
        if self._memory_limit is None and limits.max_memory_ratio is None:
            return
        grown = self._probe.rss() - self._rss_start
        if self._memory_limit is not None and grown > self._memory_limit:
            raise _LimitHit(
                f"loading needs more than the {format_size(self._memory_limit)} of memory allowed "
                f"(stopped after {format_size(self.consumed)} of the pickle)",
                _MEMORY_HINT,
            )
        if (
            limits.max_memory_ratio is not None
            and grown > limits.memory_allowance_bytes + limits.max_memory_ratio * self.consumed
        ):
            raise _LimitHit(
                f"loading grows memory by {format_size(grown)} for the first "
                f"{format_size(self.consumed)} of the pickle, more than "
                f"{limits.max_memory_ratio:g}x (a real snapshot takes 4x to 6x): the file is "
                "crafted or corrupt",
                "check where the file came from; raise SnapshotLimits.max_memory_ratio if it "
                "is a genuine snapshot",
            )
        if self._bound is not None:
            self._bound.allow(self.allowed_growth())

    def allowed_growth(self) -> int | None:
        """How much memory the load may have grown by now (None: no limit)."""
        limits = self._limits
        allowed = self._memory_limit
        if limits.max_memory_ratio is not None:
            by_ratio = limits.memory_allowance_bytes + int(limits.max_memory_ratio * self.consumed)
            allowed = by_ratio if allowed is None else min(allowed, by_ratio)
        return allowed

    def read(self, size: int | None = -1, /) -> bytes:
        if size is None or size < 0:
            raise ValueError("the unpickler asked for an unbounded read")
        self._check_item(size)
        data = self._inner.read(size)
        self._advance(len(data))
        return data

    def readinto(self, buffer: Any, /) -> int:
        wanted = memoryview(buffer).nbytes
        self._check_item(wanted)
        count = self._inner.readinto(buffer)
        self._advance(count)
        return count

    def readline(self, size: int | None = -1, /) -> bytes:
        line = self._inner.readline(self._max_item + 1)
        if len(line) > self._max_item:
            self._check_item(len(line))
        self._advance(len(line))
        return line

    def peek(self, size: int = 0, /) -> bytes:
        self._check_time()
        data = self._inner.peek(size)
        return data if len(data) <= _CHUNK else data[:_CHUNK]


def _containers_built() -> int:
    """Container objects (lists, dicts, tuples, sets) allocated and not freed since the
    cyclic collector last ran, as its allocation counter has them: it only grows while the
    collector is paused, as it is during a load, and misses only the few thousand objects
    the interpreter recycles from its free lists.  O(1), so it is read every 64 KiB."""
    return gc.get_count()[0]


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def restricted_load(
    path: str | Path, *, limits: SnapshotLimits | None = None, freeze_gc: bool = True
) -> LoadedPickle:
    """Unpickle ``path`` (a pickle, optionally gzip'd) allowing plain data only.

    Returns the data (builtin containers and scalars) with the pickle protocol, whether the
    file was gzip'd, its size on disk and the pickle's size.  Raises ``InputError`` when the
    file cannot be read, is not a pickle, is truncated or corrupt, or wants to import or call
    anything (nothing is executed); ``ResourceLimitError`` when a limit of ``limits`` would be
    exceeded.

    The cyclic garbage collector is paused while the containers are built (they hold no
    cycles; collecting during the load doubles its time).  With ``freeze_gc`` (the default)
    the loaded objects are then moved to the collector's permanent generation
    (:func:`gc.freeze`), so that later collections do not walk them: a full collection over
    a 1 GB snapshot's objects costs some 15 s.  They are still freed as usual when the last
    reference goes; only reference cycles made before the freeze would outlive it (call
    :func:`gc.unfreeze` if that matters to a long-lived process).
    """
    limits = limits or SnapshotLimits()
    where = str(path)
    raw = _open_regular_file(where, path)
    file_bytes = os.fstat(raw.fileno()).st_size
    probe = _MemoryProbe()
    try:
        return _load_open_file(where, raw, file_bytes, limits, probe, freeze_gc)
    finally:
        probe.close()
        raw.close()


def _open_regular_file(where: str, path: str | Path) -> io.BufferedReader[io.FileIO]:
    """Open ``path`` for reading if it is a regular file; else one clear ``InputError``.

    A FIFO, socket or device is refused before it is opened (``oomlens.ingest.files``).
    """
    try:
        return open_regular(
            path,
            display=where,
            what="a snapshot file",
            hint="save the snapshot to a file first and give that file",
            buffer_size=_CHUNK,
        )
    except FileNotFoundError:
        raise InputError(where, "no such file", "check the path") from None
    except IsADirectoryError:
        raise InputError(
            where, "is a directory, not a snapshot file", "give the .pickle file"
        ) from None
    except OSError as exc:
        raise InputError(
            where, f"cannot be read: {exc.strerror or exc}", "check the path and permissions"
        ) from None


def _load_open_file(
    where: str,
    raw: io.BufferedReader[io.FileIO],
    file_bytes: int,
    limits: SnapshotLimits,
    probe: _MemoryProbe,
    freeze_gc: bool,
) -> LoadedPickle:
    if file_bytes == 0:
        raise InputError(where, "is empty (0 bytes)", "the snapshot was not written; dump it again")
    compressed = raw.peek(2)[:2] == _GZIP_MAGIC
    stream: _Stream
    if compressed:
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
        known_size = None
    else:
        stream = raw
        known_size = file_bytes
        if file_bytes > limits.max_input_bytes:
            raise ResourceLimitError(
                where,
                f"is {format_size(file_bytes)}, over the input limit of "
                f"{format_size(limits.max_input_bytes)}",
                "raise SnapshotLimits.max_input_bytes if this is a genuine snapshot",
            )
    memory_limit = limits.effective_memory_limit()
    if (
        memory_limit is not None
        and known_size is not None
        and known_size * _MIN_INFLATION > memory_limit
    ):
        raise ResourceLimitError(
            where,
            f"a {format_size(known_size)} pickle needs at least "
            f"{format_size(known_size * _MIN_INFLATION)} of memory to load, more than the "
            f"{format_size(memory_limit)} allowed",
            _MEMORY_HINT,
        )
    try:
        head = stream.peek(2)[:2]
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(
            where, f"is not a readable gzip file ({exc})", "check that the file is complete"
        ) from None
    protocol = head[1] if len(head) == 2 and head[0] == pickle.PROTO[0] else None
    if protocol is not None and protocol > pickle.HIGHEST_PROTOCOL:
        raise InputError(
            where,
            f"uses pickle protocol {protocol}, newer than this Python reads "
            f"(up to {pickle.HIGHEST_PROTOCOL})",
            "run oomlens with a newer Python",
        )
    bound = AddressSpaceBound()
    reader = _GuardedReader(
        stream,
        known_size=known_size,
        limits=limits,
        memory_limit=memory_limit,
        probe=probe,
        compressed_position=raw.tell if compressed else None,
        bound=bound,
    )
    unpickler: pickle.Unpickler | pickle._Unpickler
    if copyreg._extension_cache:  # type: ignore[attr-defined]
        unpickler = _PurePythonRestrictedUnpickler(reader)
    else:
        unpickler = _RestrictedUnpickler(reader)
    try:
        with gc_paused():
            # The address space is bounded while the C unpickler runs: it sizes the memo from
            # the index a memo opcode names and fills it before the guard runs again.
            with bound:
                bound.allow(reader.allowed_growth())
                data = unpickler.load()
            reader.checkpoint()
            if freeze_gc:
                gc.freeze()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one clear InputError
        data = None
        raise _explain_failure(where, exc, reader.consumed, compressed, head, known_size) from None
    return LoadedPickle(
        data=data,
        protocol=protocol,
        compressed=compressed,
        file_bytes=file_bytes,
        pickle_bytes=reader.consumed,
    )


def _explain_failure(
    where: str,
    exc: BaseException,
    consumed: int,
    compressed: bool,
    head: bytes,
    known_size: int | None,
) -> InputError:
    """Turn whatever stopped the unpickler into one clear error."""
    if isinstance(exc, _LimitHit):
        return ResourceLimitError(where, exc.problem, exc.hint)
    if isinstance(exc, MemoryError):
        return ResourceLimitError(
            where,
            "asks for more memory than the limit on this load allows (after "
            f"{format_size(consumed)} of the pickle; a memo index or a size far beyond what the "
            "file holds): a corrupt or crafted file, or a snapshot too large for this machine",
            _MEMORY_HINT,
        )
    if isinstance(exc, _ImportRefused | _OpcodeRefused):
        found = _find_forbidden_opcode(where, compressed, consumed)
        if isinstance(exc, _ImportRefused):
            where_op = (
                f"byte {found.position} holds a {found.opcode} opcode"
                if found
                else "it holds a GLOBAL, STACK_GLOBAL, INST or EXT opcode"
            )
            return InputError(
                where,
                f"refused to load: {where_op}, which wants to import {exc.module}.{exc.name}",
                _REFUSAL_HINT,
            )
        if found is not None:
            return _opcode_error(where, found)
        return InputError(
            where,
            f"refused to load: it holds a {exc.opcode} opcode, which {FORBIDDEN_OPCODES['PERSID']}",
            _REFUSAL_HINT,
        )
    if head[:1] != pickle.PROTO and not isinstance(exc, gzip.BadGzipFile | zlib.error | OSError):
        # Every pickle torch writes opens with PROTO; a file that does not and fails is not one.
        return InputError(
            where,
            f"is not a pickle file (it starts with {head!r})",
            "give the file written by torch.cuda.memory._dump_snapshot() or "
            "pickle.dump(torch.cuda.memory._snapshot(), f)",
        )
    if isinstance(exc, _Truncated) or isinstance(exc, EOFError) or "truncated" in str(exc):
        length = f"{known_size} bytes" if known_size is not None else f"about {consumed} bytes"
        return InputError(
            where,
            f"is truncated: the pickle stops after {length}, in the middle of the data",
            "the dump was cut short (job killed while writing, disk full); dump the snapshot again",
        )
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        return InputError(
            where, f"is a corrupt gzip file ({exc})", "check that the file was copied completely"
        )
    if isinstance(exc, OSError):
        return InputError(
            where, f"cannot be read: {exc.strerror or exc}", "check the file and the disk"
        )
    # The C unpickler fails on REDUCE/OBJ/NEWOBJ/BUILD without naming them: look for one.
    found = _find_forbidden_opcode(where, compressed, consumed)
    if found is not None:
        return _opcode_error(where, found)
    detail = f"{type(exc).__name__}: {exc}"
    if len(detail) > 200:
        detail = detail[:200] + "..."
    near = f" near byte {consumed}" if consumed else ""
    return InputError(
        where,
        f"is a corrupt pickle (failed{near}: {detail})",
        "check that the file was copied completely, or dump the snapshot again",
    )


def _opcode_error(where: str, found: _Forbidden) -> InputError:
    what = FORBIDDEN_OPCODES.get(found.opcode, "is not plain data")
    detail = f" ({found.detail})" if found.detail else ""
    return InputError(
        where,
        f"refused to load: byte {found.position} holds a {found.opcode} opcode, "
        f"which {what}{detail}",
        _REFUSAL_HINT,
    )


@dataclass(frozen=True, slots=True)
class _Forbidden:
    opcode: str
    position: int
    detail: str


_DIAGNOSE_MAX_BYTES = 16 * MiB
_DIAGNOSE_MAX_SECONDS = 5.0
_SLACK_BYTES = 2 * MiB  # the unpickler's read-ahead, with room to spare


def _find_forbidden_opcode(where: str, compressed: bool, consumed: int) -> _Forbidden | None:
    """The first import/call opcode in the stream, found by parsing alone (never executing).

    Looks at most at the bytes the unpickler had reached (plus its read-ahead), within a small
    time and size budget; None when there is none there or the budget runs out.
    """
    budget = min(consumed + _SLACK_BYTES, _DIAGNOSE_MAX_BYTES)
    try:
        # Opened again by name: refuse whatever is no longer a regular file there.
        with _open_regular_file(where, where) as raw:
            prefix = (gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw).read(budget)
    except (InputError, OSError, EOFError, zlib.error):
        return None
    import pickletools  # only to name what was refused: no load of a real snapshot needs it

    deadline = time.monotonic() + _DIAGNOSE_MAX_SECONDS
    recent_strings: list[str] = []
    try:
        for count, (opcode, arg, position) in enumerate(pickletools.genops(io.BytesIO(prefix))):
            name = opcode.name
            if name in FORBIDDEN_OPCODES:
                return _Forbidden(name, position or 0, _describe_arg(name, arg, recent_strings))
            if isinstance(arg, str):
                recent_strings = [*recent_strings[-1:], arg]
            if count % 4096 == 0 and time.monotonic() > deadline:
                return None
    except Exception:  # noqa: BLE001 - a parse error past this point is not what we look for
        return None
    return None


def _describe_arg(opcode: str, arg: object, recent_strings: list[str]) -> str:
    if opcode in ("GLOBAL", "INST") and isinstance(arg, str):
        return "imports " + arg.replace(" ", ".", 1)
    if opcode == "STACK_GLOBAL" and len(recent_strings) == 2:
        return f"imports {recent_strings[0]}.{recent_strings[1]}"
    if opcode in ("EXT1", "EXT2", "EXT4"):
        return f"extension code {arg}"
    return ""
