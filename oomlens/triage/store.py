"""The triage store: a SQLite file that remembers what was analyzed, so a re-run only does what
is new or changed.

Two tables matter.  ``files`` caches, per path, the ``stat`` identity (size, mtime, inode) a file
had when it was last looked at, with its SHA-256 and whether it is a training log: a file whose
``stat`` identity is unchanged is not read again.  ``results`` holds one analysis per *run key*,
the digest of the analyzer's identity, the run directory and every input file's relative path
and content hash (see ``run_key``): a run whose key is stored is not analyzed again.

Every result is committed in its own transaction as soon as it arrives, in WAL mode, so a
process killed at any moment (SIGKILL included) loses at most the analyses still in flight,
and SQLite's journal leaves the file consistent.  The store is a cache: a file written by
another version of this schema is emptied and rebuilt, and a corrupt one is refused with a
message saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from oomlens.errors import UsageError
from oomlens.ingest.files import not_regular_problem

STORE_SCHEMA = 1

_TABLES = (
    """CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS files (
        path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
        inode INTEGER NOT NULL, sha256 TEXT, is_log INTEGER)""",
    """CREATE TABLE IF NOT EXISTS results (
        key TEXT PRIMARY KEY, run_id TEXT NOT NULL, analyzer TEXT NOT NULL,
        report BLOB, error TEXT, report_file TEXT, seconds REAL NOT NULL,
        finished_at REAL NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS results_by_root ON results (run_id)""",
)


@dataclass(frozen=True, slots=True)
class FileRecord:
    """What the store knows about one file, valid while its ``stat`` identity is unchanged."""

    size: int
    mtime_ns: int
    inode: int
    sha256: str | None
    is_log: bool | None


@dataclass(frozen=True, slots=True)
class StoredResult:
    """One run's analysis: the report's JSON dict, or the error that prevented it."""

    key: str
    run_id: str
    """``RunSpec.identity`` of the run."""
    report: dict[str, Any] | None
    error: str | None
    report_file: str | None
    """The per-run HTML report written with this analysis, if any."""
    seconds: float
    """How long the analysis took."""


def run_key(analyzer: str, config: str | None, root: str, files: Iterable[tuple[str, str]]) -> str:
    """The identity of one analysis: same analyzer, options, run directory and file contents.

    ``files`` are ``(path relative to the run, content SHA-256)``.  Relative paths matter
    because a file's location says which rank it belongs to.
    """
    digest = hashlib.sha256()
    for part in (analyzer, config or "", root):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for relative, sha in sorted(files):
        digest.update(relative.encode("utf-8", "surrogateescape") + b"\0" + sha.encode() + b"\0")
    return digest.hexdigest()


class ResultStore:
    """The SQLite store at ``path`` (``None``: in memory, for a run that keeps nothing).

    Raises ``UsageError`` when the file cannot be opened or is not a sound SQLite database.
    One process writes at a time; others wait up to ``busy_timeout`` seconds.
    """

    def __init__(self, path: str | None, *, busy_timeout: float = 60.0) -> None:
        self.path = path
        target = ":memory:" if path is None else path
        special = None if path is None else not_regular_problem(path, "a triage store")
        if special is not None:
            raise UsageError(f"{path}: {special}; pass another --store")
        if path is not None:
            _create_if_missing(path)
        try:
            self._db = sqlite3.connect(target, timeout=busy_timeout, isolation_level=None)
            self._prepare()
        except sqlite3.DatabaseError as exc:
            raise UsageError(
                f"{path}: not a usable triage store ({exc}); delete it or pass another --store"
            ) from exc

    def _prepare(self) -> None:
        db = self._db
        # WAL keeps readers and the single writer apart and makes each commit one append;
        # on file systems without shared memory (some network mounts) SQLite refuses it and
        # the rollback journal, just as safe against a killed process, stays in use.
        db.execute("PRAGMA journal_mode=WAL").fetchone()
        db.execute("PRAGMA synchronous=NORMAL")
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")
        with self._transaction():
            for statement in _TABLES:
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is not None and row[0] != str(STORE_SCHEMA):
                db.execute("DELETE FROM files")
                db.execute("DELETE FROM results")
            db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('schema', ?)",
                (str(STORE_SCHEMA),),
            )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- files ---------------------------------------------------------------------------

    def load_files(self) -> dict[str, FileRecord]:
        """Everything known about files, by path."""
        rows = self._db.execute("SELECT path, size, mtime_ns, inode, sha256, is_log FROM files")
        return {
            _path_of(key): FileRecord(
                size, mtime_ns, inode, sha, None if is_log is None else bool(is_log)
            )
            for key, size, mtime_ns, inode, sha, is_log in rows
        }

    def put_files(self, records: Sequence[tuple[str, FileRecord]]) -> None:
        """Remember ``records`` (replacing what was known of those paths), in one commit."""
        if not records:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO files (path, size, mtime_ns, inode, sha256, is_log)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        _key_of(path),
                        r.size,
                        r.mtime_ns,
                        r.inode,
                        r.sha256,
                        None if r.is_log is None else int(r.is_log),
                    )
                    for path, r in records
                ],
            )

    # --- results -------------------------------------------------------------------------

    def get_results(self, keys: Iterable[str]) -> dict[str, StoredResult]:
        """The stored results among ``keys``."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, StoredResult] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                "SELECT key, run_id, report, error, report_file, seconds FROM results"
                f" WHERE key IN ({marks})",
                chunk,
            )
            for key, root, report, error, report_file, seconds in rows:
                found[key] = StoredResult(
                    key, root, _unpack(report), error, report_file, float(seconds)
                )
        return found

    def put_result(self, result: StoredResult, *, analyzer: str) -> None:
        """Commit one run's result; older results of the same run are dropped."""
        with self._transaction():
            self._db.execute(
                "DELETE FROM results WHERE run_id = ? AND key != ?", (result.run_id, result.key)
            )
            self._db.execute(
                "INSERT OR REPLACE INTO results"
                " (key, run_id, analyzer, report, error, report_file, seconds, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    result.key,
                    result.run_id,
                    analyzer,
                    _pack(result.report),
                    result.error,
                    result.report_file,
                    result.seconds,
                    time.time(),
                ),
            )

    def count_results(self) -> int:
        row = self._db.execute("SELECT count(*) FROM results").fetchone()
        return int(row[0])


_UNDECODABLE = "\0fs:"
"""Key prefix of a path whose name holds bytes that are not UTF-8 (``os.fsdecode``'s lone
surrogates, which SQLite's text cannot hold): the rest is the name's bytes in hex.  No path
holds a NUL, so no other key starts so."""


def _key_of(path: str) -> str:
    """``path`` as the ``files`` table's key: itself, or ``_UNDECODABLE`` and its bytes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return _UNDECODABLE + path.encode("utf-8", "surrogateescape").hex()
    return path


def _path_of(key: str) -> str:
    if key.startswith(_UNDECODABLE):
        return bytes.fromhex(key[len(_UNDECODABLE) :]).decode("utf-8", "surrogateescape")
    return key


def _create_if_missing(path: str) -> None:
    """Create the store's file when there is none, or raise ``UsageError`` saying why it cannot
    be.  SQLite would report a read-only or missing directory as "unable to open database
    file", which reads like a damaged store; an empty file is a new store to SQLite."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return
    except OSError as exc:
        directory = os.path.dirname(os.path.abspath(path))
        raise UsageError(
            f"{path}: the triage store cannot be created in {directory} ({exc.strerror or exc});"
            " pass --store with a file in a directory you can write, or --no-store"
        ) from exc
    os.close(descriptor)


def _pack(report: dict[str, Any] | None) -> bytes | None:
    if report is None:
        return None
    return zlib.compress(json.dumps(report, separators=(",", ":")).encode(), 6)


def _unpack(blob: bytes | None) -> dict[str, Any] | None:
    if blob is None:
        return None
    data = json.loads(zlib.decompress(blob))
    if not isinstance(data, dict):
        raise UsageError("triage store: a stored report is not a JSON object; delete the store")
    return data
