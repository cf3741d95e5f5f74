"""Open an input only when it is a regular file.

A path can name a FIFO (opening it blocks until a writer comes, forever when none does), a
socket, or a device (``/dev/zero`` never ends and reports a size of 0).  Every place a path
enters oomlens (the command line, ``--config``, ``--thresholds``, settings files, run and job
directories, triage archives) checks with ``special_kind`` before it opens anything, and
``open_regular`` checks again through the descriptor it opened without blocking, so a path
swapped for a FIFO in between is refused too.
"""

from __future__ import annotations

import io
import os
import stat

from oomlens.errors import InputError

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
