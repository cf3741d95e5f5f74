"""Triage killed with SIGKILL (workers included) and started again loses no finished result,
leaves a sound store, and ends with the table a clean run makes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas.testing

from oomlens.triage.engine import TriageOptions, triage
from tests._corpus import case_names
from tests.triage._trees import BASE_TIME, copy_case

REPO = Path(__file__).resolve().parents[2]


def _read(store: Path, query: str) -> list[tuple[object, ...]]:
    """Rows of ``query`` on the store, read while another process may be writing it."""
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute(query).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return []
    finally:
        db.close()


def _start(root: Path, store: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "oomlens", "triage", str(root), "-j", "2", "--store", str(store)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill takes the workers too
    )


def _kill_when(process: subprocess.Popen[bytes], ready: object, deadline_s: float = 60) -> None:
    """SIGKILL the process group as soon as ``ready()`` is true (the run must still be going)."""
    assert callable(ready)
    deadline = time.monotonic() + deadline_s
    while not ready():
        assert process.poll() is None, "triage finished before it could be killed"
        assert time.monotonic() < deadline, "triage made no progress"
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL


def _integrity(store: Path) -> str:
    [(verdict,)] = _read(store, "PRAGMA integrity_check")
    return str(verdict)


def test_sigkill_at_any_moment_loses_nothing_finished(tmp_path: Path) -> None:
    # GIVEN an archive of 40 runs: every corpus case, twice
    root = tmp_path / "archive"
    for copy in range(2):
        for n, case in enumerate(case_names()):
            copy_case(case, root / f"batch{copy}" / case, moment=BASE_TIME + 60 * n + copy)
    total = 2 * len(case_names())
    store = tmp_path / "store.sqlite"

    # WHEN triage is killed while it is still hashing files (no result yet)
    first = _start(root, store)
    _kill_when(first, lambda: bool(_read(store, "SELECT path FROM files LIMIT 1")))
    assert _integrity(store) == "ok"
    assert _read(store, "SELECT count(*) FROM results") in ([], [(0,)])

    # AND killed again, started over, once some results are committed
    second = _start(root, store)
    _kill_when(second, lambda: len(_read(store, "SELECT key FROM results")) >= 3)
    committed = {key for (key,) in _read(store, "SELECT key FROM results")}
    assert _integrity(store) == "ok"
    assert 3 <= len(committed) < total

    # THEN a restart keeps every committed result and analyzes only the rest
    resumed = triage([str(root)], TriageOptions(jobs=2, store=str(store)))
    assert committed <= {key for (key,) in _read(store, "SELECT key FROM results")}
    assert resumed.analyzed == total - len(committed)
    assert _integrity(store) == "ok"
    # AND the table is the one a clean run makes
    clean = triage([str(root)], TriageOptions(jobs=2, store=None))
    pandas.testing.assert_frame_equal(resumed.table, clean.table)


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_do_not_outlive_a_parent_killed_alone(tmp_path: Path) -> None:
    # GIVEN a triage whose workers are busy
    root = tmp_path / "archive"
    for n, case in enumerate(case_names()):
        copy_case(case, root / case, moment=BASE_TIME + n)
    store = tmp_path / "store.sqlite"
    process = _start(root, store)
    try:
        deadline = time.monotonic() + 60
        while not _read(store, "SELECT key FROM results LIMIT 1"):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        workers = _children(process.pid)
        assert workers
        # WHEN only the parent is killed (as the kernel's OOM killer would)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        # THEN its workers go too, instead of analyzing on without a deadline
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, [p for p in workers if _alive(p)]
            time.sleep(0.05)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert _integrity(store) == "ok"
