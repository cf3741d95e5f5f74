"""The sweeper: finishes, without the Epilog's limits, what the Epilog left undone.

The Epilog stops at its budget and defers snapshots larger than ``max_snapshot_bytes``
(:mod:`.pending` lists those jobs).  ``oomlens epilog --sweep``, run from cron as root, takes
them oldest first and, for each one:

1. claims it: creates ``sweep.lock`` in the job's spool directory with ``O_EXCL`` (a lock older
   than the budget, left by a sweeper that died, is taken over); the few steps of a claim are
   serialized between sweepers by ``flock`` on the job directory, so two sweepers never both
   take a job;
2. analyzes every input the Epilog found or deferred (no snapshot size cap), in a child process
   that becomes the job's user before it touches a path, with a memory cap, SIGKILLed at the
   per-job budget (:func:`~oomlens.epilog.worker.run_in_child`, as the Epilog does);
3. as this process (root), through the job directory's descriptor: replaces ``verdict.json``
   and ``report.html`` atomically (the Epilog's stay as ``verdict.epilog.json`` and
   ``report.epilog.html``), writes ``sweep.json`` (so that the job leaves the pending list),
   removes the lock, and appends one ``swept`` line to ``epilog.log``.

A job's problem (an unknown user, an unreadable or hostile file, a hang, a crash, a full disk,
a bug) becomes that job's recorded status; the sweep goes on with the next job.  A job
directory without a readable ``epilog.json`` cannot be swept; each sweep reports it (one
``error`` line) until someone removes it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import oomlens
from oomlens.epilog.analysis import analyze_for_epilog, prepare_analysis
from oomlens.epilog.inputs import why_unreadable
from oomlens.epilog.pending import (
    SWEEP_MARKER,
    PendingJob,
    UnrecordedJob,
    pending_jobs,
    unrecorded_jobs,
)
from oomlens.epilog.runner import log_line, write_log_line
from oomlens.epilog.settings import EpilogSettings
from oomlens.epilog.spool import (
    SpoolError,
    open_job_directory,
    open_spool,
    replace_file,
    temporary_prefix,
    write_all,
    write_new_file,
)
from oomlens.epilog.worker import (
    Analyzer,
    Send,
    WorkerResult,
    WorkerStatus,
    analyze_into,
    run_in_child,
    workdir_copy_mode,
    write_workdir_copies,
)
from oomlens.errors import UsageError

SWEEP_SCHEMA = "oomlens.sweep/1"
SWEPT = "swept"
"""The ``action`` of the sweeper's lines in ``epilog.log`` (their ``status`` says how it went)."""
DEFAULT_BUDGET_PER_JOB = 300.0
LOCK_NAME = "sweep.lock"
STALE_LOCK_GRACE_SECONDS = 30.0
"""A lock is stale when it is older than the budget (the longer of its holder's and ours)
plus this: its holder would have killed its analysis and finished by then."""
_CLAIM_WAIT_SECONDS = 10.0
"""How long a sweeper waits for another one's ``flock`` on a job directory (held for a few
file operations) before it leaves the job to it."""
_MAX_RECORD_BYTES = 16 * 1024**2
_REPORT_NAMES = {"verdict": "verdict.json", "html": "report.html"}
_KEPT_NAMES = {"verdict.json": "verdict.epilog.json", "report.html": "report.epilog.html"}


class SweepStatus:
    """``status`` of a swept job: a :class:`~oomlens.epilog.worker.WorkerStatus`, or this."""

    ERROR = "error"
    """The analysis could not be started or its results not recorded (the spool, a bug in
    oomlens); no ``sweep.json`` is written, so the next sweep tries again."""


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """What the sweeper did with one job."""

    job_key: str
    status: str
    record: dict[str, Any] = field(default_factory=dict)
    """``sweep.json``'s content (also when it could not be written)."""
    logged: bool = False
    problems: tuple[str, ...] = ()
    elapsed: float = 0.0

    def summary_line(self) -> str:
        """One line for the person (or cron mail) that ran the sweep."""
        parts = [f"oomlens sweep: job {self.job_key}: {self.status}"]
        verdict = self.record.get("verdict")
        if verdict:
            diagnosis = self.record.get("diagnosis")
            parts.append(f"verdict {verdict}" + (f" ({diagnosis})" if diagnosis else ""))
        report = (self.record.get("files") or {}).get("verdict")
        if report:
            parts.append(f"report {report}")
        parts.append(f"{self.elapsed:.2f} s")
        text = ", ".join(parts)
        reason = self.record.get("reason")
        details = ([str(reason)] if reason else []) + list(self.problems[:3])
        if details:
            text += "; " + "; ".join(details)
        return text


@dataclass(frozen=True, slots=True)
class SweepRun:
    """What one sweep did: an outcome per job it took, oldest first."""

    outcomes: tuple[SweepOutcome, ...]
    busy: tuple[str, ...] = ()
    """Pending jobs another sweeper holds (or finished meanwhile)."""
    left: int = 0
    """Pending jobs not taken because of ``max_jobs``."""
    unrecorded: tuple[SweepOutcome, ...] = ()
    """An ``error`` outcome per job directory without a readable ``epilog.json``
    (:func:`~oomlens.epilog.pending.unrecorded_jobs`), reported before the pending jobs."""


def sweep_spool(
    settings: EpilogSettings,
    *,
    budget_per_job: float = DEFAULT_BUDGET_PER_JOB,
    max_jobs: int | None = None,
    max_memory_bytes: int | None = None,
    analyzer: Analyzer = analyze_for_epilog,
    report: Callable[[SweepOutcome], None] | None = None,
) -> SweepRun:
    """Sweep ``settings.spool_dir``: each pending job, oldest first, up to ``max_jobs``.

    ``max_memory_bytes`` caps each analysis (None: the settings' ``max_memory_bytes``; 0: no
    cap).  ``report`` is called with each outcome as soon as the job is done, and with each
    unrecorded job's.  Raises ``UsageError`` when the spool does not exist or cannot be used
    safely; nothing about a job is raised.
    """
    if budget_per_job <= 0:
        raise UsageError(f"budget per job {budget_per_job!r}: must be a positive number of seconds")
    memory = settings.max_memory_bytes if max_memory_bytes is None else max_memory_bytes
    spool_fd = open_existing_spool(settings)
    outcomes: list[SweepOutcome] = []
    busy: list[str] = []
    unrecorded: list[SweepOutcome] = []
    try:
        # An Epilog is done within its budget; one whose directory is older left what it could.
        settled = settings.budget_seconds + STALE_LOCK_GRACE_SECONDS
        for lost in unrecorded_jobs(settings.spool_dir, settled_seconds=settled):
            unrecorded.append(_report_unrecorded(spool_fd, lost, settings))
            if report is not None:
                report(unrecorded[-1])
        pending = pending_jobs(settings.spool_dir)
        if pending:
            prepare_analysis()  # once here, inherited by every analysis process
        for index, job in enumerate(pending):
            if max_jobs is not None and len(outcomes) >= max_jobs:
                left = len(pending) - index
                return SweepRun(tuple(outcomes), tuple(busy), left, tuple(unrecorded))
            outcome = _sweep_job_safely(spool_fd, job, settings, budget_per_job, memory, analyzer)
            if outcome is None:
                busy.append(job.job_dir.name)
                continue
            outcomes.append(outcome)
            if report is not None:
                report(outcome)
    finally:
        os.close(spool_fd)
    return SweepRun(tuple(outcomes), tuple(busy), unrecorded=tuple(unrecorded))


def open_existing_spool(settings: EpilogSettings) -> int:
    """The spool directory's fd, checked as the Epilog checks it; unlike the Epilog, the
    sweeper does not create a missing spool.  Raises ``UsageError``."""
    spool_dir = settings.spool_dir
    if not os.path.lexists(spool_dir):
        raise UsageError(
            f"{spool_dir}: the spool does not exist; give the Epilog's spool_dir "
            "(--spool or the settings file)"
        )
    try:
        return open_spool(spool_dir)
    except SpoolError as exc:
        raise UsageError(str(exc)) from exc


def _sweep_job_safely(
    spool_fd: int,
    job: PendingJob,
    settings: EpilogSettings,
    budget: float,
    memory: int,
    analyzer: Analyzer,
) -> SweepOutcome | None:
    """One job; a bug in oomlens becomes an ``error`` outcome (logged), never a stop."""
    started = time.monotonic()
    started_at = _now()
    try:
        return _sweep_job(spool_fd, job, settings, budget, memory, analyzer, started, started_at)
    except Exception as exc:  # noqa: BLE001 - one bad job must not stop the sweep
        reason = f"internal error: {type(exc).__name__}: {str(exc)[:500]}"
        return _error_outcome(job, settings, spool_fd, reason, started, started_at)


def _sweep_job(
    spool_fd: int,
    job: PendingJob,
    settings: EpilogSettings,
    budget: float,
    memory: int,
    analyzer: Analyzer,
    started: float,
    started_at: str,
) -> SweepOutcome | None:
    key = job.job_dir.name
    try:
        job_fd = open_job_directory(spool_fd, key)
    except (SpoolError, OSError) as exc:
        reason = f"spool: {key}: cannot open the job directory ({_strerror(exc)})"
        return _error_outcome(job, settings, spool_fd, reason, started, started_at)
    try:
        try:
            claim = _claim(job_fd, budget)
        except OSError as exc:
            reason = f"spool: {key}/{LOCK_NAME}: cannot create it ({_strerror(exc)})"
            return _error_outcome(job, settings, spool_fd, reason, started, started_at)
        if claim is None:
            return None
        try:
            epilog_record = _read_record(job_fd) or {}
            work = _sweep_work(job, key, epilog_record, settings, analyzer)
            try:
                result = run_in_child(
                    work,
                    run_as=job,
                    deadline=time.monotonic() + budget,
                    max_memory_bytes=memory,
                )
            except OSError as exc:
                result = WorkerResult(
                    SweepStatus.ERROR, detail=f"could not start the analysis: {_strerror(exc)}"
                )
            recorder = _Recorder(
                job, key, settings, epilog_record, budget, memory, started, started_at
            )
            if claim.took_over:
                recorder.problems.append(claim.took_over)
            return recorder.finish(spool_fd, job_fd, claim, result)
        finally:
            _release(job_fd, claim)
    finally:
        os.close(job_fd)


def _sweep_work(
    job: PendingJob,
    key: str,
    epilog_record: dict[str, Any],
    settings: EpilogSettings,
    analyzer: Analyzer,
) -> Callable[[dict[str, Any], Send], None]:
    """What the analysis process does, as the job's user."""
    job_fields = epilog_record.get("job")
    work_dir = job_fields.get("work_dir") if isinstance(job_fields, dict) else None
    # The work directory gets the finished report whenever the site copies reports there (as
    # the Epilog would have, had it finished): also when the Epilog ran out of time or
    # deferred the job and so wrote no copy of its own.
    update_copies = settings.copy_to_workdir

    def work(payload: dict[str, Any], send: Send) -> None:
        notes: list[str] = payload["notes"]
        inputs: list[dict[str, Any]] = []
        readable: list[str] = []
        for path in dict.fromkeys(job.paths):
            item: dict[str, Any] = {"path": path, "deferred_by_epilog": path in job.deferred}
            problem = why_unreadable(path)
            if problem:
                item["problem"] = problem
            else:
                readable.append(path)
                try:
                    item["bytes"] = os.stat(path).st_size
                except OSError:
                    pass
            inputs.append(item)
        payload["inputs"] = inputs
        send(payload)
        if not readable:
            payload["status"] = WorkerStatus.NO_INPUT
            payload["error"] = f"none of the job's {len(inputs)} files could be read"
            return
        analysis = analyze_into(payload, analyzer, readable, max_snapshot_bytes=None)
        if analysis is None:
            return
        notes.extend(
            str(entry["problem"])
            for entry in analysis.report.get("inputs") or []
            if isinstance(entry, dict) and entry.get("problem")
        )
        if update_copies:
            payload["workdir_copies"] = write_workdir_copies(
                work_dir if isinstance(work_dir, str) else None,
                key,
                job.uid,
                analysis.report,
                analysis.html,
                notes,
                mode=workdir_copy_mode(readable, job.uid),
            )
        payload["status"] = WorkerStatus.ANALYZED

    return work


# ------------------------------------------------------------------------------ the claim


@dataclass(frozen=True, slots=True)
class _Claim:
    token: str
    """Written into the lock: tells this sweeper's lock from a later one on the same inode."""
    took_over: str | None = None


class _LockBusy(Exception):
    """Another sweeper holds the job directory's ``flock`` for longer than a claim takes."""


@contextmanager
def _directory_lock(job_fd: int) -> Iterator[None]:
    """``flock`` on the job directory, waited for at most ``_CLAIM_WAIT_SECONDS``."""
    give_up = time.monotonic() + _CLAIM_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(job_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > give_up:
                raise _LockBusy from None
            time.sleep(0.02)
    try:
        yield
    finally:
        fcntl.flock(job_fd, fcntl.LOCK_UN)


def _claim(job_fd: int, budget: float) -> _Claim | None:
    """Take the job (create ``sweep.lock``); None when another sweeper has it or is done.

    A lock older than the longer of its holder's budget and ours (plus a grace) was left by a
    sweeper that died: it is replaced.  Raises OSError when the lock cannot be created.
    """
    try:
        with _directory_lock(job_fd):
            if _exists(job_fd, SWEEP_MARKER):
                return None
            took_over = None
            try:
                fd = _create_lock(job_fd)
            except FileExistsError:
                age, holder = _lock_holder(job_fd)
                holder_budget = holder.get("budget_s")
                if not isinstance(holder_budget, int | float) or isinstance(holder_budget, bool):
                    holder_budget = 0.0
                if age <= max(budget, float(holder_budget)) + STALE_LOCK_GRACE_SECONDS:
                    return None
                os.unlink(LOCK_NAME, dir_fd=job_fd)
                who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
                took_over = f"took over a stale {LOCK_NAME} ({who}, {age:.0f} s old)"
                fd = _create_lock(job_fd)
            token = secrets.token_hex(16)
            holder_info = {
                "token": token,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": _now(),
                "budget_s": budget,
            }
            try:
                write_all(fd, json.dumps(holder_info).encode())
            except OSError:
                os.unlink(LOCK_NAME, dir_fd=job_fd)
                raise
            finally:
                os.close(fd)
            _remove_leftovers(job_fd)
            return _Claim(token, took_over)
    except _LockBusy:
        return None


def _remove_leftovers(job_fd: int) -> None:
    """Remove the temporary reports of a sweeper killed while it wrote them (this one holds
    the job now)."""
    prefixes = tuple(temporary_prefix(name) for name in _KEPT_NAMES)
    try:
        names = os.listdir(job_fd)
    except OSError:
        return
    for name in names:
        if name.startswith(prefixes) and name.endswith(".tmp"):
            try:
                os.unlink(name, dir_fd=job_fd)
            except OSError:
                pass


def _create_lock(job_fd: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(LOCK_NAME, flags, 0o600, dir_fd=job_fd)


def _lock_holder(job_fd: int) -> tuple[float, dict[str, Any]]:
    """The lock's age in seconds and what its holder wrote into it ({} when unreadable)."""
    info = os.stat(LOCK_NAME, dir_fd=job_fd, follow_symlinks=False)
    age = time.time() - info.st_mtime
    holder = _read_json(job_fd, LOCK_NAME, 64 * 1024)
    return age, holder or {}


def _holds(job_fd: int, claim: _Claim) -> bool:
    """Whether ``sweep.lock`` is still this sweeper's (not taken over as stale)."""
    holder = _read_json(job_fd, LOCK_NAME, 64 * 1024)
    return holder is not None and holder.get("token") == claim.token


def _release(job_fd: int, claim: _Claim) -> None:
    """Remove ``sweep.lock`` if it is still ours; never raises."""
    try:
        with _directory_lock(job_fd):
            if _holds(job_fd, claim):
                os.unlink(LOCK_NAME, dir_fd=job_fd)
    except (OSError, _LockBusy):
        pass


# ------------------------------------------------------------------------------ recording


class _Recorder:
    """Builds ``sweep.json`` and the log line for one job, and writes the results."""

    def __init__(
        self,
        job: PendingJob,
        key: str,
        settings: EpilogSettings,
        epilog_record: dict[str, Any],
        budget: float,
        memory: int,
        started: float,
        started_at: str,
    ) -> None:
        self.job = job
        self.key = key
        self.settings = settings
        self.epilog_record = epilog_record
        self.budget = budget
        self.memory = memory
        self.started = started
        self.started_at = started_at
        self.problems: list[str] = []

    def finish(
        self, spool_fd: int, job_fd: int, claim: _Claim, result: WorkerResult
    ) -> SweepOutcome:
        payload = result.payload
        record = self._record(result)
        job_dir = self.settings.spool_dir / self.key
        files: dict[str, str] = {}
        written = False
        try:
            with _directory_lock(job_fd):
                if not _holds(job_fd, claim):
                    self.problems.append(
                        f"{LOCK_NAME} was taken over by another sweeper while this one worked; "
                        "its results were not written"
                    )
                else:
                    reports_written = True
                    if result.status == WorkerStatus.ANALYZED:
                        files.update(self._write_reports(job_fd, payload))
                        reports_written = "verdict" in files
                    if result.status != SweepStatus.ERROR and reports_written:
                        files["sweep"] = str(job_dir / SWEEP_MARKER)
                        written = self._write_record(job_fd, record, files)
        except _LockBusy:
            self.problems.append(f"{job_dir}: another process kept the directory locked")
        if not written:
            files.pop("sweep", None)
        record["files"] = files
        status = result.status
        if status != SweepStatus.ERROR and not written:
            record["reason"] = (
                f"the analysis ended {status}, but its results could not be recorded; "
                "the job stays pending"
            )
            status = record["status"] = SweepStatus.ERROR
        return self._close(spool_fd, status, record)

    def _record(self, result: WorkerResult) -> dict[str, Any]:
        payload = result.payload
        job_fields = self.epilog_record.get("job")
        job = dict(job_fields) if isinstance(job_fields, dict) else {}
        job.setdefault("id", self.job.job_id)
        job.setdefault("user", self.job.user)
        job.setdefault("uid", self.job.uid)
        job.setdefault("gid", self.job.gid)
        record: dict[str, Any] = {
            "schema": SWEEP_SCHEMA,
            "oomlens_version": oomlens.__version__,
            "started_at": self.started_at,
            "job": job,
            "epilog_status": self.job.status,
            "status": result.status,
        }
        if result.detail:
            record["reason"] = result.detail
        analysis = payload.get("analysis") if isinstance(payload.get("analysis"), dict) else None
        if analysis:
            for name in ("verdict", "diagnosis", "confidence", "summary"):
                record[name] = analysis.get(name)
        for name in ("inputs", "notes", "workdir_copies", "identity"):
            if payload.get(name):
                record[name] = payload[name]
        record["limits"] = {"budget_s": round(self.budget, 3), "max_memory_bytes": self.memory}
        record["timing"] = {
            "analysis_process_s": round(result.seconds, 3),
            "analysis_s": payload.get("analysis_seconds"),
        }
        return record

    def _write_reports(self, job_fd: int, payload: dict[str, Any]) -> dict[str, str]:
        """``verdict.json`` and ``report.html``, each replacing the Epilog's atomically."""
        epilog_files = self.epilog_record.get("files")
        by_epilog = set(epilog_files) if isinstance(epilog_files, dict) else set()
        files: dict[str, str] = {}
        report = payload.get("report")
        if isinstance(report, dict):
            verdict = json.dumps(report, indent=2).encode()
            self._put(job_fd, files, "verdict", verdict, keep="verdict" in by_epilog)
        html = payload.get("html")
        page = html.encode("utf-8", "replace") if isinstance(html, str) else None
        self._put(job_fd, files, "html", page, keep="html" in by_epilog)
        return files

    def _put(
        self, job_fd: int, files: dict[str, str], label: str, data: bytes | None, *, keep: bool
    ) -> None:
        """Write one report over the Epilog's (kept when ``keep``); ``files`` gets its path
        under ``label`` and the kept original's under ``<label>_epilog``."""
        name = _REPORT_NAMES[label]
        keep_as = _KEPT_NAMES[name] if keep else None
        job_dir = self.settings.spool_dir / self.key
        try:
            if data is None:
                # No new HTML: the Epilog's must not stand beside the new verdict.
                if keep_as is not None and _retire(job_fd, name, keep_as):
                    files[f"{label}_epilog"] = str(job_dir / keep_as)
                return
            replace_file(job_fd, name, data, keep_original_as=keep_as)
            files[label] = str(job_dir / name)
            if keep_as is not None and _exists(job_fd, keep_as):
                files[f"{label}_epilog"] = str(job_dir / keep_as)
        except OSError as exc:
            self.problems.append(f"spool: {name}: {_strerror(exc)}")

    def _write_record(self, job_fd: int, record: dict[str, Any], files: dict[str, str]) -> bool:
        full = {**record, "files": files}
        if self.problems:
            full["problems"] = list(self.problems)
        full["timing"] = {**record["timing"], "elapsed_s": self._elapsed()}
        try:
            write_new_file(job_fd, SWEEP_MARKER, json.dumps(full, indent=2, default=str).encode())
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                self.problems.append(f"{SWEEP_MARKER}: another sweeper wrote it first")
            else:
                self.problems.append(f"spool: {SWEEP_MARKER}: {_strerror(exc)}")
            return False
        return True

    def _close(self, spool_fd: int, status: str, record: dict[str, Any]) -> SweepOutcome:
        record["timing"]["elapsed_s"] = self._elapsed()
        if self.problems:
            record["problems"] = list(self.problems)
        line = log_line(SWEPT, record)
        line["status"] = status
        logged = write_log_line(self.settings, spool_fd, line, self.problems)
        return SweepOutcome(
            self.key,
            status,
            record,
            logged=logged,
            problems=tuple(self.problems),
            elapsed=time.monotonic() - self.started,
        )

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)


def _error_outcome(
    job: PendingJob,
    settings: EpilogSettings,
    spool_fd: int,
    reason: str,
    started: float,
    started_at: str,
) -> SweepOutcome:
    """A job the sweeper could not handle: logged, nothing written into its directory."""
    recorder = _Recorder(
        job, job.job_dir.name, settings, {}, 0.0, settings.max_memory_bytes, started, started_at
    )
    recorder.problems.append(reason)
    record = recorder._record(WorkerResult(SweepStatus.ERROR, detail=reason))
    record.pop("limits", None)
    record["files"] = {}
    return recorder._close(spool_fd, SweepStatus.ERROR, record)


def _report_unrecorded(
    spool_fd: int, lost: UnrecordedJob, settings: EpilogSettings
) -> SweepOutcome:
    """The ``error`` outcome (logged) of a job directory that has no usable ``epilog.json``."""
    key = lost.job_dir.name
    job = PendingJob(lost.job_dir, key, None, None, None, "", (), ())
    reason = (
        f"{lost.problem}: the Epilog left no record of this job (the spool was full, or it was "
        f"killed), so there is nothing to sweep; its line in {settings.log_path.name} or syslog "
        "says more; remove the directory once dealt with"
    )
    recorder = _Recorder(
        job, key, settings, {}, 0.0, settings.max_memory_bytes, time.monotonic(), _now()
    )
    record = recorder._record(WorkerResult(SweepStatus.ERROR, detail=reason))
    record.pop("limits", None)
    record["epilog_status"] = None
    record["files"] = {}
    return recorder._close(spool_fd, SweepStatus.ERROR, record)


# ------------------------------------------------------------------------------ helpers


def _retire(job_fd: int, name: str, keep_as: str) -> bool:
    """Move ``name`` to ``keep_as`` (when that is free); whether ``name`` is gone."""
    try:
        os.link(name, keep_as, src_dir_fd=job_fd, dst_dir_fd=job_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except FileExistsError:
        pass
    os.unlink(name, dir_fd=job_fd)
    return True


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read_record(job_fd: int) -> dict[str, Any] | None:
    """The Epilog's ``epilog.json`` of the claimed job, or None."""
    return _read_json(job_fd, "epilog.json", _MAX_RECORD_BYTES)


def _read_json(dir_fd: int, name: str, limit: int) -> dict[str, Any] | None:
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    if size > limit:
        return None
    data = b"".join(chunks)
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _strerror(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
