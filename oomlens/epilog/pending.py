"""Jobs in the spool whose analysis the Epilog left unfinished: the sweeper's work list.

The Epilog stops at its budget and defers snapshots larger than ``max_snapshot_bytes``; both
are recorded in ``<spool>/<job>/epilog.json`` (``status`` ``timed_out``/``crashed``, and the
``deferred`` list), and so is a report the spool did not take (``status`` ``error``, a full
disk).  The sweeper (:mod:`.sweep`, ``oomlens epilog --sweep`` from cron) analyzes
those files later, without the Epilog's time limit, then writes ``<spool>/<job>/sweep.json`` so
that the job leaves this list.  It reads the files as the job's user (``uid``/``gid``), never
as root: the user controls them.  A job directory without a readable ``epilog.json`` (the
spool did not take it, or the Epilog was killed) cannot be swept: :func:`unrecorded_jobs`
lists those, for the sweeper to report.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from oomlens.epilog.runner import Action
from oomlens.epilog.worker import WorkerStatus

SWEEP_MARKER = "sweep.json"
"""Written by a sweeper into the job's spool directory once it has analyzed the job."""
RECORD_NAME = "epilog.json"
_UNFINISHED = frozenset({WorkerStatus.TIMED_OUT, WorkerStatus.CRASHED, Action.ERROR})
_MAX_RECORD_BYTES = 16 * 1024**2


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One job whose analysis is to be (re)done without the Epilog's limits."""

    job_dir: Path
    """``<spool>/<job>``: where the Epilog's record is and the sweep's reports go."""
    job_id: str
    user: str | None
    uid: int | None
    gid: int | None
    status: str
    """The Epilog's outcome (``analyzed`` with deferred inputs, ``timed_out``, ``crashed``)."""
    paths: tuple[str, ...]
    """Every input to analyze: what the Epilog analyzed (or meant to) and what it deferred."""
    deferred: tuple[str, ...]


def pending_jobs(spool_dir: Path) -> list[PendingJob]:
    """The spool's jobs with a deferred input or an unfinished analysis and no ``sweep.json``,
    oldest job id first.  Records that cannot be read are left out (:func:`unrecorded_jobs`
    lists them); never raises for them."""
    pending: list[PendingJob] = []
    try:
        entries = sorted(os.scandir(spool_dir), key=lambda entry: _sort_key(entry.name))
    except OSError:
        return []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        job_dir = Path(entry.path)
        if (job_dir / SWEEP_MARKER).exists():
            continue
        record, _ = _read_record(job_dir / RECORD_NAME)
        if record is None:
            continue
        status = str(record.get("status", ""))
        deferred = tuple(_paths(record.get("deferred")))
        if status not in _UNFINISHED and not deferred:
            continue
        job_field = record.get("job")
        job: dict[str, object] = job_field if isinstance(job_field, dict) else {}
        inputs = tuple(_paths(record.get("inputs")))
        user, uid, gid = job.get("user"), job.get("uid"), job.get("gid")
        pending.append(
            PendingJob(
                job_dir=job_dir,
                job_id=str(job.get("id") or entry.name),
                user=user if isinstance(user, str) else None,
                uid=uid if isinstance(uid, int) else None,
                gid=gid if isinstance(gid, int) else None,
                status=status,
                paths=inputs + deferred,
                deferred=deferred,
            )
        )
    return pending


def _paths(items: object) -> list[str]:
    if not isinstance(items, list):
        return []
    return [
        item["path"]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("path"), str)
    ]


@dataclass(frozen=True, slots=True)
class UnrecordedJob:
    """A job directory without a usable ``epilog.json``: nothing says what to sweep."""

    job_dir: Path
    problem: str
    """What is wrong with its ``epilog.json`` (missing, not JSON...)."""


def unrecorded_jobs(spool_dir: Path, *, settled_seconds: float) -> list[UnrecordedJob]:
    """The spool's job directories without ``sweep.json`` whose ``epilog.json`` is missing or
    unreadable, oldest job id first.  Only those unchanged for ``settled_seconds`` (an
    Epilog's budget and more): a younger one may be an Epilog's still at work.  Never raises."""
    unrecorded: list[UnrecordedJob] = []
    try:
        entries = sorted(os.scandir(spool_dir), key=lambda entry: _sort_key(entry.name))
    except OSError:
        return []
    now = time.time()
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < settled_seconds:
                continue
        except OSError:
            continue
        job_dir = Path(entry.path)
        if (job_dir / SWEEP_MARKER).exists():
            continue
        record, problem = _read_record(job_dir / RECORD_NAME)
        if record is None:
            unrecorded.append(UnrecordedJob(job_dir, f"{RECORD_NAME}: {problem}"))
    return unrecorded


def _read_record(path: Path) -> tuple[dict[str, object] | None, str]:
    """The record at ``path``, or None and why not."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if len(data) > _MAX_RECORD_BYTES:
        return None, "larger than 16 MiB"
    try:
        record = json.loads(data)
    except ValueError:
        return None, "not valid JSON"
    return (record, "") if isinstance(record, dict) else (None, "not a JSON object")


def _sort_key(name: str) -> tuple[int, str]:
    head = name.split(".", 1)[0]
    return (int(head), name) if head.isascii() and head.isdigit() else (2**63, name)
