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
renaming a new file over it, which never follows a link either).  Every file appears whole or
not at all: it is written under a temporary name first, so that a full disk leaves no part of
one, and a log line that does not fit is taken back.  The spool directory itself
must belong to this user (or root) and must not be writable by group or others.  Creating
``<job id>/`` is the claim on a job, and its ``claim.json`` says which job claimed it (the job's
identity, :meth:`~oomlens.epilog.environment.JobEnvironment.identity`, and the time).  When the
directory exists already, either the other Epilog of the same job took it (same identity, a
short while ago: nothing more to do) or an earlier job had the same id (Slurm's ids repeat after
``MaxJobId`` or a lost controller state): that job keeps ``<id>/`` and this one is spooled as
``<id>.t<UTC time>``.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


CLAIM_NAME = "claim.json"
SAME_JOB_SECONDS = 6 * 3600.0
"""Both Epilogs of one job run within minutes of each other (PrologEpilogTimeout bounds each);
a claim older than this was made by another job, whatever its identity."""
_MAX_CLAIM_BYTES = 64 * 1024


def claim_job_directory(
    spool_fd: int, key: str, identity: Mapping[str, object] | None = None
) -> int | None:
    """Create ``<key>/`` (mode 0700) in the spool and return its fd; None when it exists.

    With ``identity``, ``claim.json`` (the identity and the time) is written into it at once,
    for :func:`earlier_claim` to compare with.
    """
    if not key or "/" in key or key in (".", ".."):
        raise SpoolError(f"{key!r}: not a job directory name")
    try:
        os.mkdir(key, 0o700, dir_fd=spool_fd)
    except FileExistsError:
        return None
    fd = os.open(key, _DIR_FLAGS, dir_fd=spool_fd)
    if identity is not None:
        claim = {"identity": dict(identity), "claimed_at": time.time()}
        try:
            write_new_file(fd, CLAIM_NAME, json.dumps(claim, default=str).encode())
        except OSError:
            pass  # without it a later Epilog decides by the directory's age
    return fd


def is_same_job_claim(spool_fd: int, key: str, identity: Mapping[str, object], now: float) -> bool:
    """Whether the existing ``<key>/`` was claimed by the same job (the other Epilog of it).

    It was when its ``claim.json`` holds the same identity and is younger than
    :data:`SAME_JOB_SECONDS`; without a readable claim (another Epilog is writing it, or an
    older oomlens made the directory) when the directory itself is younger than that.
    Never raises: a directory that cannot be read counts as the same job (nothing is
    overwritten either way).
    """
    try:
        job_fd = os.open(key, _DIR_FLAGS, dir_fd=spool_fd)
    except OSError:
        return True
    try:
        claim = _read_small_json(job_fd, CLAIM_NAME)
        if claim is None:
            age = now - os.fstat(job_fd).st_mtime
            return age < SAME_JOB_SECONDS
    finally:
        os.close(job_fd)
    claimed_at = claim.get("claimed_at")
    if not isinstance(claimed_at, int | float) or now - claimed_at >= SAME_JOB_SECONDS:
        return False
    recorded: object = claim.get("identity")
    return bool(recorded == json.loads(json.dumps(dict(identity), default=str)))


def _read_small_json(dir_fd: int, name: str) -> dict[str, Any] | None:
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_CLAIM_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = json.loads(data) if len(data) <= _MAX_CLAIM_BYTES else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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

    Atomic: ``data`` goes to a new temporary name (:func:`temporary_prefix`), which is then
    hard-linked to ``name`` (a link, unlike a rename, fails on a taken name) and removed, so
    that ``name`` is either absent or whole.  Raises OSError (``EEXIST`` when the name is
    taken, ``ENOSPC`` when the disk is full...); nothing is left behind then.
    """
    temporary = f"{temporary_prefix(name)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temporary, _NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            # No fsync: the Epilog must not wait on a busy disk past its budget.
            write_all(fd, data)
        finally:
            os.close(fd)  # NFS reports a failed write-back here
        os.link(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    finally:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass


def append_line(log_path: Path, line: str, *, spool_dir: Path, spool_fd: int | None) -> None:
    """Append one line to the log file in one ``write`` (so that lines never interleave).

    A log inside the spool is opened relative to the spool's fd.  Refuses (OSError) a log that
    is not a regular file, has other hard links, or belongs to another user.  A line the disk
    takes only part of is cut off the file again (unless another line followed it meanwhile)
    and raises OSError ``ENOSPC``.
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
        written = os.write(fd, data)
        if written < len(data):
            _take_back(fd, written)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    finally:
        os.close(fd)


def _take_back(fd: int, written: int) -> None:
    """Cut the ``written`` bytes of a partial line off the end of the log, if they still are
    its end: a later line appended to the part would be lost with it."""
    try:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        if written and os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - written)
    except OSError:
        pass


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until everything is written (a pipe or a file may take less at once)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
