"""One Epilog run, start to end: decide, claim the job, analyze under the deadline, record.

:func:`run_epilog` is what ``oomlens epilog`` calls.  It never raises (a bug in oomlens becomes
an ``error`` outcome), never calls a Slurm command, and returns within the budget: the analysis
runs in a child process that is SIGKILLed at the deadline (:mod:`.worker`), and what is left
after it (writing a few files, one log line) is bounded.

What it does for a job (``action`` in the log line and ``status`` in ``epilog.json``):

* ``skipped``: no job id or an invalid one, or the job did not fail (logged when
  ``log_successful_jobs``);
* nothing at all (no log line) on a node other than the job's first node, and when the job's
  spool directory exists already (another Epilog, e.g. ``EpilogSlurmctld``, took the job);
* ``analyzed``, ``no_input``, ``refused``, ``analysis_failed``, ``crashed``, ``timed_out``: the
  analysis process' end (:class:`~oomlens.epilog.worker.WorkerStatus`);
* ``error``: the spool cannot be used (when it did not take the report or ``epilog.json``, a
  full disk, ``reason`` says how the analysis ended and the sweeper redoes the job), or oomlens
  itself failed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import syslog
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import oomlens
from oomlens.epilog.analysis import analyze_for_epilog
from oomlens.epilog.environment import (
    JobEnvironment,
    ScriptContext,
    first_host,
    parse_job_environment,
)
from oomlens.epilog.settings import EpilogSettings, load_settings, with_spool
from oomlens.epilog.spool import (
    SpoolError,
    append_line,
    claim_job_directory,
    is_same_job_claim,
    open_spool,
    write_new_file,
)
from oomlens.epilog.worker import Analyzer, WorkerResult, WorkerStatus, run_analysis_process
from oomlens.errors import UsageError

RECORD_SCHEMA = "oomlens.epilog/1"
HARD_LIMIT_MARGIN_SECONDS = 2.0
"""``--hard-limit`` is the wrapper's kill time; the Epilog plans to be done this much before."""
_MAX_LOG_FIELD_CHARS = 300


class Action:
    SKIPPED = "skipped"
    NOT_FIRST_NODE = "not_first_node"
    DUPLICATE = "duplicate"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class EpilogOutcome:
    """What one Epilog run did."""

    action: str
    job_key: str | None
    record: dict[str, Any] = field(default_factory=dict)
    """``epilog.json``'s content (for a job acted on) or the log line's fields."""
    logged: bool = False
    problems: tuple[str, ...] = ()
    elapsed: float = 0.0

    def summary_line(self) -> str:
        """One line for a person running ``oomlens epilog`` by hand."""
        parts = [f"oomlens epilog: job {self.job_key or '?'}: {self.action}"]
        verdict = self.record.get("verdict")
        if verdict:
            diagnosis = self.record.get("diagnosis")
            parts.append(f"verdict {verdict}" + (f" ({diagnosis})" if diagnosis else ""))
        report = self.record.get("files", {}).get("verdict") if self.record else None
        if report:
            parts.append(f"report {report}")
        parts.append(f"{self.elapsed:.2f} s")
        text = ", ".join(parts)
        if self.problems:
            text += "; " + "; ".join(self.problems[:3])
        return text


def effective_budget(budget_seconds: float, hard_limit: float | None) -> float:
    """The seconds this run may take: the settings' budget, shortened to end
    ``HARD_LIMIT_MARGIN_SECONDS`` before the wrapper's hard limit (at least 1 s)."""
    if hard_limit is None:
        return budget_seconds
    return max(1.0, min(budget_seconds, hard_limit - HARD_LIMIT_MARGIN_SECONDS))


def _checked_hard_limit(
    hard_limit: float | str | None, settings: EpilogSettings, problems: list[str]
) -> float | None:
    """``hard_limit`` as seconds; None, with a problem, for anything but a positive number (the
    Epilog exits 0 whatever its options are, so a bad one is logged, not refused)."""
    if hard_limit is None:
        return None
    try:
        seconds = float(hard_limit)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return seconds
    problems.append(
        f"--hard-limit {str(hard_limit)!r} is not a positive number of seconds; ignored: the "
        f"budget is budget_seconds ({settings.budget_seconds:g} s)"
    )
    return None


def runs_here(job: JobEnvironment) -> bool:
    """Whether this Epilog is the one that handles the job: always in slurmctld's Epilog; in
    slurmd's, only on the job's first node (the one that ran the batch script)."""
    if job.context is not ScriptContext.EPILOG_SLURMD:
        return True
    if job.node_name is None or job.nodelist is None:
        return True
    first = first_host(job.nodelist)
    return first is None or first == job.node_name


def run_epilog(
    environ: Mapping[str, str],
    *,
    settings_path: str | Path,
    spool_override: str | Path | None = None,
    hard_limit: float | str | None = None,
    started: float | None = None,
    analyzer: Analyzer = analyze_for_epilog,
) -> EpilogOutcome:
    """Handle one finished job as described by ``environ``; never raises.

    ``spool_override`` (``--spool``) replaces the settings' ``spool_dir``; one that is not an
    absolute path is ignored, and the record's problems say so.  ``started`` is the
    ``time.monotonic()`` at which the process started (the budget counts
    from there); ``hard_limit`` the seconds after which the wrapper kills the process (a number,
    or ``--hard-limit`` as given): one that is not a positive number is ignored, and the
    record's problems say so.
    """
    started = time.monotonic() if started is None else started
    try:
        return _run(environ, settings_path, spool_override, hard_limit, started, analyzer)
    except Exception as exc:  # noqa: BLE001 - a bug must not fail the Epilog
        problem = f"internal error: {type(exc).__name__}: {str(exc)[:500]}"
        return EpilogOutcome(
            Action.ERROR, None, problems=(problem,), elapsed=time.monotonic() - started
        )


def _run(
    environ: Mapping[str, str],
    settings_path: str | Path,
    spool_override: str | Path | None,
    hard_limit: float | str | None,
    started: float,
    analyzer: Analyzer,
) -> EpilogOutcome:
    job = parse_job_environment(environ)
    problems = [f"environment: {problem}" for problem in job.problems]
    try:
        settings = load_settings(settings_path)
    except UsageError as exc:
        problems.append(
            f"settings: {exc.message}; used the defaults, without copies into work directories"
        )
        settings = replace(EpilogSettings(), copy_to_workdir=False)
    if spool_override is not None:
        try:
            settings = with_spool(settings, spool_override)
        except UsageError as exc:
            problems.append(f"{exc.message}; used {settings.spool_dir}")
    limit = _checked_hard_limit(hard_limit, settings, problems)
    budget = effective_budget(settings.budget_seconds, limit)
    recorder = _Recorder(job, settings, problems, started, budget, str(settings_path))
    try:
        return _act(job, settings, recorder, started + budget, analyzer)
    except Exception as exc:  # noqa: BLE001 - a bug is recorded like any other outcome
        return recorder.finish(
            Action.ERROR, reason=f"internal error: {type(exc).__name__}: {str(exc)[:500]}"
        )
    finally:
        recorder.close_spool()


def _act(
    job: JobEnvironment,
    settings: EpilogSettings,
    recorder: _Recorder,
    finish_by: float,
    analyzer: Analyzer,
) -> EpilogOutcome:
    if job.invalid_job_id is not None:
        reason = f"invalid SLURM_JOB_ID {job.invalid_job_id!r}: not a job id; nothing done"
        return recorder.finish(Action.SKIPPED, reason=reason)
    if job.job_id is None:
        return recorder.finish(Action.SKIPPED, reason="no SLURM_JOB_ID: not run by Slurm")
    if not runs_here(job):
        return recorder.finish(Action.NOT_FIRST_NODE, log=False)
    if not job.failed:
        return recorder.finish(
            Action.SKIPPED,
            reason=f"the job did not fail (exit {job.describe_exit()})",
            log=settings.log_successful_jobs,
        )
    key = job.spool_key
    assert key is not None
    identity = job.identity()
    try:
        recorder.spool_fd = open_spool(settings.spool_dir)
        job_fd = claim_job_directory(recorder.spool_fd, key, identity)
        if job_fd is None:
            if is_same_job_claim(recorder.spool_fd, key, identity, time.time()):
                # The other Epilog of this job (slurmd's or slurmctld's) took it and logs it.
                return recorder.finish(Action.DUPLICATE, log=False)
            job_fd = _claim_for_reused_id(recorder, key, identity)
            job = recorder.job
    except (SpoolError, OSError) as exc:
        return recorder.finish(Action.ERROR, reason=f"spool: {exc}")
    try:
        reserve = min(1.0, recorder.budget * 0.2)
        result = _analyze(job, settings, finish_by - reserve, analyzer, recorder.problems)
        return recorder.finish_analysis(job_fd, result)
    finally:
        os.close(job_fd)


def _claim_for_reused_id(recorder: _Recorder, key: str, identity: dict[str, object]) -> int:
    """Claim ``<key>.t<UTC time>`` for a job whose id an earlier job used: that job's
    directory stays as it is, and the log line and ``epilog.json`` say what happened."""
    assert recorder.spool_fd is not None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    for attempt in range(1, 100):
        suffix = f".t{stamp}" if attempt == 1 else f".t{stamp}-{attempt}"
        job_fd = claim_job_directory(recorder.spool_fd, key + suffix, identity)
        if job_fd is not None:
            recorder.job = replace(recorder.job, spool_suffix=suffix)
            recorder.problems.append(
                f"job id {recorder.job.job_id} was used by an earlier job, whose report stays in "
                f"{key}/; this job's is in {key}{suffix}/"
            )
            return job_fd
    raise SpoolError(f"{key}: could not claim a spool directory for a reused job id")


def _analyze(
    job: JobEnvironment,
    settings: EpilogSettings,
    deadline: float,
    analyzer: Analyzer,
    problems: list[str],
) -> WorkerResult:
    scratch = _make_scratch_dir(job, settings, problems)
    try:
        return run_analysis_process(
            job, settings, deadline=deadline, scratch_dir=scratch, analyzer=analyzer
        )
    except OSError as exc:
        return WorkerResult(
            WorkerStatus.ANALYSIS_FAILED, detail=f"could not start the analysis: {exc}"
        )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _make_scratch_dir(
    job: JobEnvironment, settings: EpilogSettings, problems: list[str]
) -> str | None:
    """A private directory for shortened copies of huge logs, owned by the job's user (the
    analysis process runs as that user)."""
    try:
        path = tempfile.mkdtemp(prefix=f"oomlens-epilog-{job.spool_key}-", dir=settings.tmp_dir)
    except OSError as exc:
        problems.append(f"tmp_dir {settings.tmp_dir}: {exc.strerror or exc}; huge logs deferred")
        return None
    if os.geteuid() == 0 and job.uid not in (None, 0):
        try:
            gid = job.gid if job.gid is not None else -1
            os.chown(path, job.uid, gid, follow_symlinks=False)
        except OSError as exc:
            problems.append(f"tmp_dir: cannot hand {path} to uid {job.uid} ({exc.strerror})")
            shutil.rmtree(path, ignore_errors=True)
            return None
    return path


class _Recorder:
    """Builds ``epilog.json`` and the log line, writes them, and makes the outcome."""

    def __init__(
        self,
        job: JobEnvironment,
        settings: EpilogSettings,
        problems: list[str],
        started: float,
        budget: float,
        settings_path: str,
    ) -> None:
        self.job = job
        self.settings = settings
        self.problems = problems
        self.started = started
        self.budget = budget
        self.settings_path = settings_path
        self.spool_fd: int | None = None
        self.unwritten: list[str] = []
        """Spool files of the job that could not be written (they make its status error)."""
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")

    def finish(self, action: str, *, reason: str = "", log: bool = True) -> EpilogOutcome:
        if reason and action == Action.ERROR:
            self.problems.append(reason)
        record: dict[str, Any] = {"status": action}
        if reason:
            record["reason"] = reason
        return self._close(action, record, log)

    def finish_analysis(self, job_fd: int, result: WorkerResult) -> EpilogOutcome:
        payload = result.payload
        record: dict[str, Any] = {"status": result.status}
        if result.detail:
            record["reason"] = result.detail
        analysis = payload.get("analysis") if isinstance(payload.get("analysis"), dict) else None
        if analysis:
            for key in ("verdict", "diagnosis", "confidence", "summary"):
                record[key] = analysis.get(key)
        for key in ("inputs", "deferred", "notes", "workdir_copies", "identity"):
            if payload.get(key):
                record[key] = payload[key]
        files: dict[str, str] = {}
        job_dir = self.settings.spool_dir / str(self.job.spool_key)
        report = payload.get("report")
        if result.status == WorkerStatus.ANALYZED and isinstance(report, dict):
            if self._write(job_fd, "verdict.json", json.dumps(report, indent=2).encode()):
                files["verdict"] = str(job_dir / "verdict.json")
            else:
                self.unwritten.append("verdict.json")
            html = payload.get("html")
            if isinstance(html, str) and self._write(
                job_fd, "report.html", html.encode("utf-8", "replace")
            ):
                files["html"] = str(job_dir / "report.html")
        files["record"] = str(job_dir / "epilog.json")
        record["files"] = files
        record["timing"] = {
            "budget_s": round(self.budget, 3),
            "analysis_process_s": round(result.seconds, 3),
            "analysis_s": payload.get("analysis_seconds"),
        }
        return self._close(result.status, record, True, job_fd=job_fd)

    def _write(self, dir_fd: int, name: str, data: bytes) -> bool:
        try:
            write_new_file(dir_fd, name, data)
        except OSError as exc:
            self.problems.append(f"spool: {name}: {exc.strerror or exc}")
            return False
        return True

    def _close(
        self, action: str, record: dict[str, Any], log: bool, job_fd: int | None = None
    ) -> EpilogOutcome:
        job = self.job
        full: dict[str, Any] = {
            "schema": RECORD_SCHEMA,
            "oomlens_version": oomlens.__version__,
            "started_at": self.started_at,
            "job": {
                "id": job.job_id,
                "user": job.user,
                "uid": job.uid,
                "gid": job.gid,
                "node": job.node_name,
                "nodelist": job.nodelist,
                "context": str(job.context),
                "exit": job.describe_exit(),
                "exit_status": None if job.exit_status is None else job.exit_status.as_dict(),
                "derived_status": (
                    None if job.derived_status is None else job.derived_status.as_dict()
                ),
                "work_dir": job.work_dir,
                "stdout_pattern": job.stdout_pattern,
                "stderr_pattern": job.stderr_pattern,
                "name": job.job_name,
            },
            **record,
            "settings_file": self.settings_path,
        }
        elapsed = time.monotonic() - self.started
        full.setdefault("timing", {})["elapsed_s"] = round(elapsed, 3)
        if self.problems:
            full["problems"] = list(self.problems)
        outcome, reason = full["status"], full.get("reason")
        if self.unwritten:
            # The sweeper redoes a job whose record says error (pending.py).
            action = _unrecorded(full, self.unwritten, outcome, reason)
        if job_fd is not None and not self._write(
            job_fd, "epilog.json", json.dumps(full, indent=2, default=str).encode()
        ):
            # Then the log line (or syslog) is the job's only record, and says so.
            self.unwritten.append("epilog.json")
            action = _unrecorded(full, self.unwritten, outcome, reason)
            full["files"].pop("record", None)
            full["problems"] = list(self.problems)
        logged = False
        if log:
            logged = self._log(action, full)
        return EpilogOutcome(
            action,
            job.spool_key,
            full,
            logged=logged,
            problems=tuple(self.problems),
            elapsed=time.monotonic() - self.started,
        )

    def close_spool(self) -> None:
        if self.spool_fd is not None:
            os.close(self.spool_fd)
            self.spool_fd = None

    def _log(self, action: str, full: dict[str, Any]) -> bool:
        try:
            if self.spool_fd is None and self.settings.log_path.parent == self.settings.spool_dir:
                self.spool_fd = open_spool(self.settings.spool_dir)
        except SpoolError as exc:
            self.problems.append(f"log: {exc}")
            _syslog(self.settings.syslog_facility, action, log_line(action, full))
            return False
        return write_log_line(self.settings, self.spool_fd, log_line(action, full), self.problems)


def _unrecorded(record: dict[str, Any], names: list[str], status: str, reason: object) -> str:
    """Make ``record`` an ``error``, because the spool did not take the files ``names`` (the
    problems say why); its reason keeps the analysis' own ``status`` and ``reason``.  Returns
    the action."""
    record["reason"] = (
        f"the analysis ended {status}, but the spool did not take " + " and ".join(names)
    ) + (f" ({reason})" if reason else "")
    record["status"] = Action.ERROR
    return Action.ERROR


def write_log_line(
    settings: EpilogSettings, spool_fd: int | None, line: dict[str, Any], problems: list[str]
) -> bool:
    """Append ``line`` (see :func:`log_line`) to the settings' log file, and send it to syslog
    when the settings say so or the file cannot be written.  Returns whether the file got it;
    a failure is appended to ``problems``, never raised."""
    text = json.dumps(line, separators=(",", ":"), default=str)
    logged = False
    try:
        append_line(settings.log_path, text, spool_dir=settings.spool_dir, spool_fd=spool_fd)
        logged = True
    except SpoolError as exc:
        problems.append(f"log: {exc}")
    except OSError as exc:
        problems.append(f"log {settings.log_path}: {exc.strerror or exc}")
    if settings.syslog or not logged:
        _syslog(settings.syslog_facility, str(line.get("action", "")), line)
    return logged


def log_line(action: str, full: dict[str, Any]) -> dict[str, Any]:
    """The fields of one ``epilog.log`` line (JSON, documented in docs/epilog.md)."""
    job = full.get("job", {})
    line: dict[str, Any] = {
        "time": full.get("started_at"),
        "job": job.get("id"),
        "user": job.get("user"),
        "node": job.get("node"),
        "context": job.get("context"),
        "exit": job.get("exit"),
        "action": action,
    }
    for key in ("verdict", "diagnosis", "confidence"):
        if full.get(key) is not None:
            line[key] = full[key]
    files = full.get("files") or {}
    if files.get("verdict"):
        line["report"] = files["verdict"]
    if full.get("deferred"):
        line["deferred"] = len(full["deferred"])
    timing = full.get("timing") or {}
    line["elapsed_s"] = timing.get("elapsed_s")
    reason = full.get("reason")
    if reason:
        line["reason"] = _clip(str(reason))
    problems = full.get("problems")
    if problems:
        line["problems"] = [_clip(str(problem)) for problem in problems[:3]]
    return line


def _clip(text: str) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= _MAX_LOG_FIELD_CHARS else text[: _MAX_LOG_FIELD_CHARS - 1] + "…"


def _syslog(facility: str, action: str, line: dict[str, Any]) -> None:
    words = [f"{key}={line[key]}" for key in line if key not in ("time", "problems")]
    if line.get("problems"):
        words.append("problem=" + str(line["problems"][0]))
    warn = action in (Action.ERROR, WorkerStatus.TIMED_OUT, WorkerStatus.CRASHED)
    level = syslog.LOG_WARNING if warn else syslog.LOG_INFO
    try:
        syslog.openlog("oomlens-epilog", syslog.LOG_PID, getattr(syslog, f"LOG_{facility.upper()}"))
        syslog.syslog(level, " ".join(words))
        syslog.closelog()
    except (OSError, AttributeError):
        print(" ".join(words), file=sys.stderr)
