"""Which files of a finished job the Epilog analyzes, within bounds the site sets.

Run as the job's user (the caller drops privileges first): every path here is under the user's
control.  The job's stdout/stderr files come from its patterns (:mod:`.patterns`); snapshots and
configs come from its work directory, listed once and only so far.  A log larger than
``max_log_bytes`` is analyzed through a shortened copy (its head and its tail); a snapshot
larger than ``max_snapshot_bytes`` is deferred to a later sweep.  Nothing here raises for a
missing, unreadable or odd file: it is left out with a note.
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from oomlens.epilog.environment import JobEnvironment, ScriptContext
from oomlens.epilog.patterns import (
    FoundFile,
    PatternValues,
    default_output_pattern,
    expand_output_pattern,
    find_output_file,
)
from oomlens.epilog.settings import EpilogSettings
from oomlens.epilog.spool import write_all
from oomlens.units import format_size

_COPY_CHUNK = 1024 * 1024
_MAX_LINE_SEARCH = 1024 * 1024
"""How far the shortened copy looks for a line break to cut at."""
_ZERO_RUN = 512
_ZERO_RUN_RE = re.compile(rb"\x00{%d,}" % _ZERO_RUN)


@dataclass(frozen=True, slots=True)
class JobInput:
    """One file that joins the analysis."""

    path: str
    """The file as the job left it."""
    role: str
    """``stdout``, ``stderr``, ``stdout+stderr`` (one file for both), ``workdir`` or ``capture``
    (a file of the job's ``oomlens capture`` directory)."""
    size: int
    analyzed_path: str
    """``path`` itself, or the shortened copy of it that the analysis reads."""
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "role": self.role, "bytes": self.size}
        if self.analyzed_path != self.path:
            out["analyzed_copy"] = self.analyzed_path
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class DeferredInput:
    """A file the Epilog left for a later sweep, and why."""

    path: str
    size: int
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "bytes": self.size, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class InputPlan:
    """What to analyze, what was deferred, and remarks (files not found, ambiguities)."""

    inputs: tuple[JobInput, ...]
    deferred: tuple[DeferredInput, ...]
    notes: tuple[str, ...]

    @property
    def analysis_paths(self) -> list[str]:
        return [item.analyzed_path for item in self.inputs]


def pattern_values(job: JobEnvironment, hostname: str | None) -> PatternValues:
    """What the job's output patterns expand to, as far as this Epilog's environment tells.

    The slurmctld Epilog knows the job name and array ids but not the batch host's name; the
    slurmd Epilog runs on the batch host but knows neither job name nor array ids.
    """
    if job.array_job_id is not None and job.array_task_id is not None:
        is_array: bool | None = True
    elif job.context is ScriptContext.EPILOG_SLURMCTLD:
        is_array = False
    else:
        is_array = None
    return PatternValues(
        job_id=job.job_id or "",
        user=job.user,
        job_name=job.job_name,
        hostname=None if job.context is ScriptContext.EPILOG_SLURMCTLD else hostname,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        is_array_task=is_array,
    )


def short_hostname() -> str | None:
    """This machine's host name up to the first dot, as slurmd expands ``%N``."""
    try:
        name = socket.gethostname()
    except OSError:
        return None
    return name.split(".", 1)[0] or None


def plan_inputs(
    job: JobEnvironment,
    settings: EpilogSettings,
    *,
    now: float,
    scratch_dir: str | None,
    hostname: str | None = None,
) -> InputPlan:
    """Find the job's files and decide, within the settings' bounds, what to analyze.

    ``now`` is the wall-clock time (``time.time()``) the job is taken to have ended at;
    ``scratch_dir`` is a private directory for shortened copies of huge logs (None: huge logs
    are deferred instead).  Never raises for a file problem; it becomes a note.
    """
    values = pattern_values(job, hostname)
    notes: list[str] = []
    inputs: list[JobInput] = []
    deferred: list[DeferredInput] = []
    seen: set[tuple[int, int]] = set()

    stdout_patterns = [job.stdout_pattern] if job.stdout_pattern else default_output_pattern(values)
    roles: list[tuple[str, list[str]]] = []
    if job.stderr_pattern:
        roles.append(("stderr", [job.stderr_pattern]))
        roles.append(("stdout", stdout_patterns))
    else:
        roles.append(("stdout+stderr", stdout_patterns))

    for role, patterns in roles:
        expansions = [
            expansion
            for pattern in patterns
            for expansion in expand_output_pattern(pattern, values, job.work_dir)
        ]
        if not expansions:
            notes.append(f"{role}: pattern {patterns[0]!r} names no file this Epilog can find")
            continue
        found = find_output_file(expansions, max_entries=settings.workdir_max_entries)
        if not isinstance(found, FoundFile):
            notes.append(f"{role}: {found.describe()}")
            continue
        identity = _identity(found.path)
        if identity is None or identity in seen:
            continue
        unreadable = why_unreadable(found.path)
        if unreadable:
            notes.append(f"{role}: {found.path}: {unreadable}")
            continue
        seen.add(identity)
        note = ""
        if found.matches > 1:
            note = (
                f"{found.matches} files match {found.glob_pattern}; took the newest "
                "(the Epilog does not know every part of the name)"
            )
            notes.append(f"{role}: {note}")
        scratch = None if scratch_dir is None else os.path.join(scratch_dir, str(len(inputs)))
        log_input = _log_input(found, role, note, settings, scratch, deferred, notes)
        if log_input is not None:
            inputs.append(log_input)

    if job.work_dir:
        workdir_inputs = _workdir_files(job.work_dir, settings, now, seen, notes, deferred)
        inputs.extend(workdir_inputs)
        inputs.extend(_capture_files(job, settings, seen, notes, deferred))
    return InputPlan(tuple(inputs), tuple(deferred), tuple(notes))


def _capture_files(
    job: JobEnvironment,
    settings: EpilogSettings,
    seen: set[tuple[int, int]],
    notes: list[str],
    deferred: list[DeferredInput],
) -> list[JobInput]:
    """The files ``oomlens capture`` wrote for this job (``<work dir>/oomlens-capture/
    slurm-<job>/``, ``oomlens.ingest.layout``), bounded like the work directory's; large
    snapshots are deferred."""
    # imported when used: this runs in the analysis process, after the analysis is preloaded
    from oomlens.ingest.kinds import kind, kind_by_name
    from oomlens.ingest.layout import CAPTURE_DIR, capture_run_names

    if not job.work_dir:
        return []
    snapshot_kind = kind("snapshot_pickle")
    chosen: list[JobInput] = []
    for name in capture_run_names(job.job_id, job.array_job_id, job.array_task_id):
        directory = os.path.join(job.work_dir, CAPTURE_DIR, name)
        try:
            with os.scandir(directory) as scanned:
                entries = sorted(scanned, key=lambda e: e.name)[: settings.workdir_max_entries]
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            is_snapshot = kind_by_name(entry.name) is snapshot_kind
            limit = settings.max_snapshot_bytes if is_snapshot else settings.max_log_bytes
            if info.st_size > limit:
                key = "max_snapshot_bytes" if is_snapshot else "max_log_bytes"
                deferred.append(
                    DeferredInput(
                        entry.path, info.st_size, f"larger than {key} ({format_size(limit)})"
                    )
                )
                continue
            unreadable = why_unreadable(entry.path)
            if unreadable:
                notes.append(f"{entry.path}: {unreadable}")
                continue
            chosen.append(JobInput(entry.path, "capture", info.st_size, entry.path))
        if chosen:
            break
    return chosen


def why_unreadable(path: str) -> str | None:
    """Why this process cannot read ``path`` as a regular file, or None when it can.

    The file is opened (without blocking, in case it became a FIFO) because ``stat`` succeeds
    on a file that cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
    finally:
        os.close(fd)
    return None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _log_input(
    found: FoundFile,
    role: str,
    note: str,
    settings: EpilogSettings,
    scratch_dir: str | None,
    deferred: list[DeferredInput],
    notes: list[str],
) -> JobInput | None:
    """The job's log as an input: itself, or a shortened copy when it is too large."""
    path, size = found.path, found.size
    if size <= settings.max_log_bytes:
        return JobInput(path, role, size, path, note)
    if scratch_dir is None:
        deferred.append(DeferredInput(path, size, "larger than max_log_bytes; no scratch space"))
        return None
    try:
        copy, skipped = shorten_log(path, scratch_dir, settings.max_log_bytes)
    except OSError as exc:
        deferred.append(DeferredInput(path, size, f"could not shorten it: {exc.strerror or exc}"))
        return None
    shortened = (
        f"{format_size(size)}: analyzed its first and last {format_size(size - skipped)} "
        f"(max_log_bytes); {format_size(skipped)} in the middle were not read"
    )
    notes.append(f"{path}: {shortened}")
    return JobInput(path, role, size, copy, "; ".join(filter(None, [note, shortened])))


def shorten_log(source: str, destination_dir: str, limit: int) -> tuple[str, int]:
    """Copy the head (an eighth of ``limit``) and the tail of ``source`` into a new file.

    The cuts fall on line breaks (within 1 MiB) and a marker line says how much was left out;
    long runs of zero bytes are left out too (one marker line each), so that a sparse region
    does not make a text log look binary.
    Returns the copy's path (``destination_dir/<name>``) and the number of bytes not copied.
    Raises OSError when the source cannot be read or the copy cannot be written.
    """
    head_limit = limit // 8
    tail_limit = limit - head_limit
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        size = info.st_size
        head_end = head_limit
        probe_length = min(_MAX_LINE_SEARCH, head_limit)
        head_probe = os.pread(fd, probe_length, head_limit - probe_length)
        cut = head_probe.rfind(b"\n")
        if cut >= 0:
            head_end = head_limit - len(head_probe) + cut + 1
        tail_start = max(size - tail_limit, head_end)
        tail_probe = os.pread(fd, _MAX_LINE_SEARCH, tail_start)
        cut = tail_probe.find(b"\n")
        if cut >= 0:
            tail_start += cut + 1
        skipped = tail_start - head_end
        os.makedirs(destination_dir, mode=0o700, exist_ok=True)
        destination = os.path.join(destination_dir, os.path.basename(source) or "log")
        out = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _copy_range(fd, out, 0, head_end)
            if skipped:
                marker = (
                    f"\n[oomlens epilog: {skipped} bytes of this {size}-byte file left out here]\n"
                )
                write_all(out, marker.encode())
            _copy_range(fd, out, tail_start, size)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return destination, skipped


def _copy_range(source_fd: int, out_fd: int, start: int, end: int) -> None:
    """Copy bytes ``start:end``, with every run of zero bytes (a hole left by a crashed file
    server, a sparse region) of ``_ZERO_RUN`` bytes or more replaced by one marker line."""
    pending_zeros = 0
    position = start
    while position < end:
        chunk = os.pread(source_fd, min(_COPY_CHUNK, end - position), position)
        if not chunk:
            break
        position += len(chunk)
        body = chunk.lstrip(b"\0")
        pending_zeros += len(chunk) - len(body)
        if not body:
            continue
        write_all(out_fd, _zeros(pending_zeros))
        trimmed = body.rstrip(b"\0")
        pending_zeros = len(body) - len(trimmed)
        write_all(out_fd, _ZERO_RUN_RE.sub(lambda run: _zeros(len(run.group())), trimmed))
    write_all(out_fd, _zeros(pending_zeros))


def _zeros(count: int) -> bytes:
    if count < _ZERO_RUN:
        return b"\0" * count
    return f"\n[oomlens epilog: {count} zero bytes left out here]\n".encode()


def _workdir_files(
    work_dir: str,
    settings: EpilogSettings,
    now: float,
    seen: set[tuple[int, int]],
    notes: list[str],
    deferred: list[DeferredInput],
) -> list[JobInput]:
    """Snapshots and configs the job left in its work directory (listed once, bounded)."""
    # imported when used: this runs in the analysis process, after the analysis is preloaded
    from oomlens.ingest.kinds import kind, kind_by_name

    patterns = settings.patterns_in_force()
    snapshot_kind = kind("snapshot_pickle")
    candidates: list[tuple[float, str, int]] = []
    listed = 0
    oldest = now - settings.workdir_recent_seconds
    try:
        with os.scandir(work_dir) as entries:
            for entry in entries:
                listed += 1
                if listed > settings.workdir_max_entries:
                    notes.append(
                        f"{work_dir}: listed only its first {settings.workdir_max_entries} "
                        "entries (workdir_max_entries)"
                    )
                    break
                if not any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
                    continue
                try:
                    info = entry.stat()
                except OSError:
                    continue
                if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                    continue
                if info.st_mtime < oldest:
                    continue
                seen.add((info.st_dev, info.st_ino))
                candidates.append((info.st_mtime, entry.path, info.st_size))
    except OSError as exc:
        notes.append(f"{work_dir}: cannot list the work directory ({exc.strerror or exc})")
        return []
    candidates.sort(reverse=True)
    if len(candidates) > settings.workdir_max_files:
        notes.append(
            f"{work_dir}: {len(candidates)} matching files; analyzed the newest "
            f"{settings.workdir_max_files} (workdir_max_files)"
        )
        candidates = candidates[: settings.workdir_max_files]
    chosen: list[JobInput] = []
    for _mtime, path, size in sorted(candidates, key=lambda item: item[1]):
        is_snapshot = kind_by_name(Path(path).name) is snapshot_kind
        limit = settings.max_snapshot_bytes if is_snapshot else settings.max_log_bytes
        if size > limit:
            key = "max_snapshot_bytes" if is_snapshot else "max_log_bytes"
            deferred.append(DeferredInput(path, size, f"larger than {key} ({format_size(limit)})"))
            continue
        unreadable = why_unreadable(path)
        if unreadable:
            notes.append(f"{path}: {unreadable}")
            continue
        chosen.append(JobInput(path, "workdir", size, path))
    return chosen
