"""Jobs in the spool whose analysis the Epilog left unfinished: the sweeper's work list.

The Epilog stops at its budget and defers snapshots larger than ``max_snapshot_bytes``; both
are recorded in ``<spool>/<job>/epilog.json`` (``status`` ``timed_out``/``crashed``, and the
``deferred`` list).  The sweeper (:mod:`.sweep`, ``oomlens epilog --sweep`` from cron) analyzes
those files later, without the Epilog's time limit, then writes ``<spool>/<job>/sweep.json`` so
that the job leaves this list.  It reads the files as the job's user (``uid``/``gid``), never
as root: the user controls them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from oomlens.epilog.worker import WorkerStatus

SWEEP_MARKER = "sweep.json"
"""Written by a sweeper into the job's spool directory once it has analyzed the job."""
_UNFINISHED = frozenset({WorkerStatus.TIMED_OUT, WorkerStatus.CRASHED})
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
    oldest job id first.  Records that cannot be read are skipped; never raises for them."""
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
        record = _read_record(job_dir / "epilog.json")
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


def _read_record(path: Path) -> dict[str, object] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_RECORD_BYTES + 1)
        record = json.loads(data) if len(data) <= _MAX_RECORD_BYTES else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _sort_key(name: str) -> tuple[int, str]:
    head = name.split(".", 1)[0]
    return (int(head), name) if head.isdigit() else (2**63, name)
