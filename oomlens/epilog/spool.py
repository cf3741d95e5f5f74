"""The Epilog's spool: one private directory per job, and an append-only log of every job.

Layout (``spool_dir`` from the settings or ``--spool``)::

    <spool>/epilog.log               one JSON object per line, one line per job
    <spool>/<job id>/epilog.json     what the Epilog did (always, for a job it acted on)
    <spool>/<job id>/verdict.json    the versioned JSON report (when the analysis finished)
    <spool>/<job id>/report.html     the HTML report (when the analysis finished)
    <spool>/<job id>/sweep.json      what the sweeper did (:mod:`.sweep`), which then replaced
                                     verdict.json and report.html, keeping the Epilog's as
                                     verdict.epilog.json and report.epilog.html

The spool is written by root (or SlurmUser) while users control the jobs, so every write goes
through directory file descriptors with ``O_NOFOLLOW`` and ``O_EXCL``: a planted symbolic link
or an existing name is never followed or overwritten (the sweeper replaces a report only by
renaming a new file over it, which never follows a link either).  The spool directory itself
must belong to this user (or root) and must not be writable by group or others.  Creating
``<job id>/`` is the claim on a job: when it exists already, another Epilog handled the job.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS |= os.O_NONBLOCK  # a FIFO planted as the log fails to open instead of blocking


class SpoolError(Exception):
    """The spool cannot be used safely; the message says which path and why."""


def open_spool(spool_dir: Path) -> int:
    """Open (creating it, mode 0700, when missing) the spool directory; returns its fd.

    Raises ``SpoolError`` when it is a symbolic link or not a directory, belongs to another
    user than this one or root, or is writable by group or others.
    """
    try:
        os.mkdir(spool_dir, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        try:
            os.makedirs(spool_dir.parent, 0o755, exist_ok=True)
            os.mkdir(spool_dir, 0o700)
        except OSError as exc:
            raise SpoolError(f"{spool_dir}: cannot create it ({exc.strerror or exc})") from exc
    except OSError as exc:
        raise SpoolError(f"{spool_dir}: cannot create it ({exc.strerror or exc})") from exc
    try:
        if stat.S_ISLNK(os.lstat(spool_dir).st_mode):
            raise SpoolError(f"{spool_dir}: is a symbolic link; give the real directory instead")
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError as exc:
        reason = "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise SpoolError(f"{spool_dir}: cannot open the spool directory ({reason})") from exc
    info = os.fstat(fd)
    problem = _ownership_problem(info)
    if problem:
        os.close(fd)
        raise SpoolError(f"{spool_dir}: {problem}; fix it with chown/chmod or choose another spool")
    return fd


def _ownership_problem(info: os.stat_result) -> str | None:
    if info.st_uid not in (os.geteuid(), 0):
        return f"belongs to uid {info.st_uid}, not to this user ({os.geteuid()}) or root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by group or others"
    return None


def claim_job_directory(spool_fd: int, key: str) -> int | None:
    """Create ``<key>/`` (mode 0700) in the spool and return its fd; None when it exists."""
    if not key or "/" in key or key in (".", ".."):
        raise SpoolError(f"{key!r}: not a job directory name")
    try:
        os.mkdir(key, 0o700, dir_fd=spool_fd)
    except FileExistsError:
        return None
    return os.open(key, _DIR_FLAGS, dir_fd=spool_fd)


def open_job_directory(spool_fd: int, key: str) -> int:
    """Open the existing ``<key>/`` of the spool (never through a symbolic link); returns its fd.

    Raises SpoolError for a name that is not a job directory's, OSError when it cannot be
    opened (``ELOOP`` for a link, ``ENOTDIR``, ``ENOENT``).
    """
    if not key or "/" in key or key in (".", ".."):
        raise SpoolError(f"{key!r}: not a job directory name")
    return os.open(key, _DIR_FLAGS, dir_fd=spool_fd)


def replace_file(
    dir_fd: int, name: str, data: bytes, *, keep_original_as: str | None = None
) -> bool:
    """Put ``data`` at ``name`` in ``dir_fd`` atomically: written to a new temporary name
    (``O_EXCL|O_NOFOLLOW``, mode 0600, synced), then renamed over ``name``, so that a reader
    sees the old file or the new one, never a part.

    With ``keep_original_as``, an existing regular file ``name`` is first hard-linked to that
    name (when it is free), so that the original stays.  Returns whether it was kept.  Raises
    OSError; the temporary file is removed then.
    """
    temporary = f"{temporary_prefix(name)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temporary, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        kept = keep_original_as is not None and _link_original(dir_fd, name, keep_original_as)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return kept


def temporary_prefix(name: str) -> str:
    """How the temporary files of :func:`replace_file` for ``name`` begin (a process killed
    between writing and renaming one leaves it behind)."""
    return f".{name}."


def _link_original(dir_fd: int, name: str, keep_as: str) -> bool:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    try:
        os.link(name, keep_as, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    return True


def write_new_file(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to a new file ``name`` in ``dir_fd``; never follows or replaces a name.

    Raises OSError (``EEXIST`` when the name is taken, ``ENOSPC`` when the disk is full...).
    """
    fd = os.open(name, _NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def append_line(log_path: Path, line: str, *, spool_dir: Path, spool_fd: int | None) -> None:
    """Append one line to the log file in one ``write`` (so that lines never interleave).

    A log inside the spool is opened relative to the spool's fd.  Refuses (OSError) a log that
    is not a regular file, has other hard links, or belongs to another user.
    """
    data = line.rstrip("\n").encode("utf-8", "replace") + b"\n"
    if spool_fd is not None and log_path.parent == spool_dir:
        fd = os.open(log_path.name, _APPEND_FLAGS, 0o640, dir_fd=spool_fd)
    else:
        fd = os.open(log_path, _APPEND_FLAGS, 0o640)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, f"{log_path}: not a plain file with one link; not writing")
        if info.st_uid not in (os.geteuid(), 0):
            raise OSError(errno.EPERM, f"{log_path}: belongs to uid {info.st_uid}; not writing")
        os.write(fd, data)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until everything is written (a pipe or a file may take less at once)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
