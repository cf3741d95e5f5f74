"""The capture's files: append-only JSON lines, flushed as they go, and whole files written to
a temporary name and renamed into place, so a process killed at any moment leaves files that
parse (at worst a last line cut short, which the reader skips).

Every file starts with a header line ``{"oomlens_capture": 1, "file": ..., "run": ...,
"rank": ...}``: that is how ``oomlens analyze`` recognises them, by content.

Bounded: each file has a byte budget.  The events file stops taking events at its budget (the
count of the dropped ones goes into the exit record); the series file, when full, is rewritten
with every other sample of its older part (its recent part kept whole) and the caller is told
to sample half as often, so a week-long run keeps its whole history at a coarser grain.

A write that fails (disk full, quota, read-only, I/O error) stops all recording of this
process: one line on stderr, and every later call is a no-op.  Nothing here raises.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

FORMAT_VERSION = 1
HEADER_KEY = "oomlens_capture"
KEEP_RECENT_LINES = 2000
"""Lines at the end of the series file that a compaction keeps whole."""

Opener = Callable[[str, str], IO[str]]


def _default_open(path: str, mode: str) -> IO[str]:
    return open(path, mode, encoding="utf-8", newline="\n")


class Stop:
    """Shared by every file of one process: once a write failed, nothing is written again."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.reason: str | None = None
        self._stream = stream
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def stop(self, path: str, exc: OSError) -> None:
        with self._lock:
            if self.reason is not None:
                return
            why = exc.strerror or str(exc) or type(exc).__name__
            self.reason = f"{path}: {why}"
        try:
            stream = self._stream if self._stream is not None else sys.stderr
            stream.write(
                f"oomlens capture: recording stopped: {self.reason} (the training goes on)\n"
            )
            stream.flush()
        except Exception:  # noqa: BLE001 - even stderr may be gone; the training must go on
            pass


def encode(record: dict[str, Any]) -> str:
    """One JSON line (no NaN/Infinity: they are written as null)."""
    try:
        text = json.dumps(record, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        text = json.dumps(_finite(record), separators=(",", ":"), default=str)
    return text + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class JsonLines:
    """One append-only JSON-lines file with a header and a byte budget."""

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        budget: int,
        stop: Stop,
        *,
        compact: bool = False,
        opener: Opener = _default_open,
    ) -> None:
        self.path = path
        self.budget = budget
        self.compact = compact
        self.dropped = 0
        self.compactions = 0
        self._stop = stop
        self._opener = opener
        self._lock = threading.Lock()
        self._size = 0
        self._handle: IO[str] | None = None
        self._header = encode({HEADER_KEY: FORMAT_VERSION, **header})
        try:
            self._handle = opener(path, "a")
            self._handle.write(self._header)
            self._handle.flush()
            self._size = len(self._header.encode("utf-8"))
        except OSError as exc:
            self._handle = None
            stop.stop(path, exc)

    def write(self, lines: list[str]) -> bool:
        """Append ``lines`` (each ending in a newline) and flush.  True when the caller should
        halve its sampling rate (a compaction happened)."""
        if not lines or self._stop.stopped:
            return False
        with self._lock:
            handle = self._handle
            if handle is None:
                return False
            data = "".join(lines)
            size = len(data.encode("utf-8"))
            halved = False
            if self._size + size > self.budget:
                if self.compact:
                    halved = self._compact_locked()
                    handle = self._handle
                if handle is None or self._size + size > self.budget:
                    self.dropped += len(lines)
                    return halved
            try:
                handle.write(data)
                handle.flush()
            except OSError as exc:
                self._close_locked()
                self._stop.stop(self.path, exc)
                return False
            self._size += size
            return halved

    def _compact_locked(self) -> bool:
        """Rewrite the file with every other line of its older part; True when done."""
        tmp = self.path + ".tmp"
        try:
            if self._handle is not None:
                self._handle.flush()
            with open(self.path, encoding="utf-8", errors="replace") as source:
                lines = source.readlines()
            if lines and not lines[-1].endswith("\n"):
                lines.pop()
            body = lines[1:]
            keep = min(KEEP_RECENT_LINES, len(body) // 4)
            older, recent = body[: len(body) - keep], body[len(body) - keep :]
            kept = [self._header, *older[::2], *recent]
            with self._opener(tmp, "w") as out:
                out.writelines(kept)
            os.replace(tmp, self.path)
            self._close_locked()
            self._handle = self._opener(self.path, "a")
            self._size = sum(len(line.encode("utf-8")) for line in kept)
            self.compactions += 1
            return True
        except OSError as exc:
            self._close_locked()
            self._stop.stop(self.path, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False

    def _close_locked(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.close()
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._close_locked()


def write_whole(path: str, data: bytes, stop: Stop) -> bool:
    """Write ``data`` to ``path`` through a temporary file and a rename (a reader never sees a
    half-written file).  False when it could not (and recording is then stopped)."""
    if stop.stopped:
        return False
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        stop.stop(path, exc)
        return False
