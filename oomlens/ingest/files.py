"""Open an input only when it is a regular file.

A path can name a FIFO (opening it blocks until a writer comes, forever when none does), a
socket, or a device (``/dev/zero`` never ends and reports a size of 0).  Every place a path
enters oomlens (the command line, ``--config``, ``--thresholds``, settings files, run and job
directories, triage archives) checks with ``special_kind`` before it opens anything, and
``open_regular`` checks again through the descriptor it opened without blocking, so a path
swapped for a FIFO in between is refused too.

The one exception is a stream the user names on the command line (``oomlens analyze -``,
``/dev/stdin``, ``<(cmd)``): ``spooled_streams`` reads it once, bounded, into a private
regular file, which the rest of oomlens then reads like any other.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from oomlens.errors import InputError
from oomlens.units import format_size

_SPECIAL = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
WHY = "oomlens reads regular files only: a pipe or device could block or never end"


def special_mode(mode: int) -> str | None:
    """What a file of this ``st_mode`` is, in words, when it is neither a regular file nor a
    directory (``a named pipe (FIFO)``, ``a socket``...); None otherwise."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _SPECIAL if test(mode)), "not a regular file")


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """``special_mode`` of ``path`` (symbolic links followed), without opening it; None for a
    regular file, a directory, or a path that cannot be looked at (opening it says why)."""
    try:
        return special_mode(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def is_special_target(path: str | os.PathLike[str]) -> bool:
    """``path`` exists and is a device, FIFO or socket (``-o /dev/null``, ``-o /dev/stdout``):
    an output there is written in place.  Writing a temporary file and renaming it over such a
    path would replace the device node itself with a regular file (as root, ``/dev/null``)."""
    return special_kind(path) is not None


def not_regular_problem(path: str | os.PathLike[str], what: str = "a regular file") -> str | None:
    """``is a named pipe (FIFO), not <what> (oomlens reads regular files only ...)`` when
    ``path`` is special, else None."""
    kind = special_kind(path)
    if kind is None:
        return None
    return f"is {kind}, not {what} ({WHY})"


def refuse_special(
    path: str | os.PathLike[str],
    *,
    display: str | None = None,
    what: str = "a regular file",
    hint: str = "",
) -> None:
    """Raise ``InputError`` when ``path`` is a FIFO, socket or device (see the module)."""
    problem = not_regular_problem(path, what)
    if problem is not None:
        raise InputError(display if display is not None else os.fspath(path), problem, hint)


def open_regular(
    path: str | os.PathLike[str],
    *,
    display: str | None = None,
    what: str = "a regular file",
    hint: str = "",
    buffer_size: int = io.DEFAULT_BUFFER_SIZE,
) -> io.BufferedReader[io.FileIO]:
    """``path`` opened for reading in binary, when it is a regular file.

    Raises ``InputError`` for a special file (checked before opening, and again on the
    descriptor); ``OSError`` as ``open`` does for the rest (missing, a directory, no
    permission), for the caller to word.
    """
    shown = display if display is not None else os.fspath(path)
    refuse_special(path, display=shown, what=what, hint=hint)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", os.fspath(path))
        kind = special_mode(mode)
        if kind is not None:
            raise InputError(shown, f"is {kind}, not {what} ({WHY})", hint)
        os.set_blocking(fd, True)
        return io.BufferedReader(io.FileIO(fd, "rb", closefd=True), buffer_size=buffer_size)
    except BaseException:
        os.close(fd)
        raise


# --- streams the user named ------------------------------------------------------------------

STDIN = "-"
"""The name of standard input on the command line."""
STDIN_SHOWN = "<stdin>"
"""How standard input is named in reports."""
STREAM_LIMIT = 4 * 1024**3
"""The most a stream named on the command line may give: it is spooled to a temporary file
(read once, in chunks: memory stays bounded), and an endless one (``yes |``) must end."""
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class NamedStream:
    """A stream the user named, and the regular file oomlens reads it from."""

    given: str
    """As named: ``-``, ``/dev/stdin``, ``/dev/fd/63``, a FIFO's path."""
    path: str
    """The file read instead: where it was spooled (a private temporary directory), or, for
    standard input on a regular file, that file through ``/proc/self/fd/0``."""

    @property
    def shown(self) -> str:
        """Its name in reports: ``<stdin>`` for ``-``, else as named."""
        return STDIN_SHOWN if self.given == STDIN else self.given


def is_named_stream(path: str) -> bool:
    """``path`` names a stream: ``-`` (standard input), or a pipe or socket however named
    (``/dev/stdin`` on a pipe, ``<(cmd)``'s ``/dev/fd/63``, a FIFO's path)."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextmanager
def spooled_streams(
    paths: Sequence[str], *, limit: int = STREAM_LIMIT, directory: str | None = None
) -> Iterator[tuple[list[str], tuple[NamedStream, ...]]]:
    """``paths`` with every stream among them (``is_named_stream``) read once into a private
    regular file (removed on exit), and what each stream became (to show reports under the
    names the user gave).

    Only what the user names on the command line goes through here: inside a run directory a
    FIFO stays refused (``discover_run``), as do devices everywhere (``/dev/zero`` never ends).
    Standard input on a regular file (``- < train.log``) is read where it lies.  Raises
    ``InputError`` for a stream named twice (it can be read only once), a terminal, a stream
    larger than ``limit``, and a named pipe nobody writes to (opened without waiting: a FIFO
    without a writer never blocks).
    """
    # Imported here: the loaders import this module, and a snapshot load needs neither.
    import shutil
    import tempfile

    spool = tempfile.mkdtemp(prefix="oomlens-stream-", dir=directory)
    try:
        out: list[str] = []
        spooled: list[NamedStream] = []
        seen: dict[tuple[int, int], str] = {}
        for given in paths:
            if not is_named_stream(given):
                out.append(given)
                continue
            target = _stdin_file() if given == STDIN else None
            if target is None:
                target = os.path.join(spool, f"stream-{len(spooled)}")
                _spool(given, target, limit, seen)
            spooled.append(NamedStream(given, target))
            out.append(target)
        yield out, tuple(spooled)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _stdin_file() -> str | None:
    """A path that reads standard input from its start when it is a regular file (``- <
    file``); None when it is a stream to spool.  Raises ``InputError`` for a terminal, a
    closed or special standard input."""
    try:
        mode = os.fstat(0).st_mode
    except OSError as exc:
        raise InputError(STDIN_SHOWN, "standard input is closed", "pipe a log into it") from exc
    if stat.S_ISREG(mode):
        for path in ("/proc/self/fd/0", "/dev/fd/0"):
            if os.path.exists(path):
                return path
        return None
    if os.isatty(0):
        raise InputError(
            STDIN_SHOWN,
            "standard input is a terminal, not a log",
            "pipe one into it (... | oomlens analyze -) or name the file",
        )
    kind = special_mode(mode)
    if kind is not None and not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise InputError(STDIN_SHOWN, f"standard input is {kind}, not a log ({WHY})")
    return None


def _spool(given: str, target: str, limit: int, seen: dict[tuple[int, int], str]) -> None:
    shown = STDIN_SHOWN if given == STDIN else given
    if given == STDIN:
        fd, owned = 0, False
    else:
        try:
            # without waiting for a writer: a FIFO nobody writes to reads as at its end
            fd = os.open(given, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise InputError(shown, f"cannot be opened ({exc.strerror or exc})") from exc
        owned = True
    try:
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino)
        if identity in seen:
            raise InputError(
                shown,
                f"is the stream already named as {seen[identity]}; a stream reads only once",
                "name it once",
            )
        seen[identity] = shown
        total = _copy(fd, target, shown, limit)
        if total == 0 and stat.S_ISFIFO(info.st_mode) and given != STDIN:
            raise InputError(
                shown,
                "is a named pipe with nothing written to it (no writer had it open)",
                "start the writer first, or name a file",
            )
    finally:
        if owned:
            os.close(fd)


def _copy(fd: int, target: str, shown: str, limit: int) -> int:
    """Copy ``fd`` to its end into ``target``, a chunk at a time; the bytes copied."""
    total = 0
    try:
        with open(target, "wb") as out:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except BlockingIOError:
                    # a writer is there but has not written yet: now wait for it
                    os.set_blocking(fd, True)
                    continue
                if not chunk:
                    return total
                total += len(chunk)
                if total > limit:
                    raise InputError(
                        shown,
                        f"gives more than {format_size(limit)}",
                        "save it to a file and name the file",
                    )
                out.write(chunk)
    except OSError as exc:
        raise InputError(
            shown,
            f"cannot be read into {os.path.dirname(target)} ({exc.strerror or exc})",
            "set TMPDIR to a folder with room",
        ) from exc
