"""Triage a tree of runs: walk, take this shard's share, reuse stored results, analyze the rest
in parallel, and build the table.

The steps, each bounded and each resumable:

1. walk the tree (``walk.find_runs``), telling logs from other text by name or by a cached look
   at their content;
2. keep this shard's runs (``Shard.takes``: a hash of the run's name, so every node of a job
   array agrees without talking to the others);
3. hash the files whose ``stat`` identity changed since the store saw them (threads: hashlib
   releases the GIL) and compute each run's key;
4. analyze the runs whose key has no stored result in worker processes, committing each result
   as it arrives;
5. build one row per run from the stored reports (``table.build_table``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import pandas

from oomlens.errors import InputError, UsageError
from oomlens.ingest.files import not_regular_problem
from oomlens.triage import adapter
from oomlens.triage.pool import TaskPool, default_jobs
from oomlens.triage.shard import Shard
from oomlens.triage.store import FileRecord, ResultStore, StoredResult, run_key
from oomlens.triage.table import RunRow, build_table
from oomlens.triage.walk import FileEntry, RunSpec, find_runs, log_by_name
from oomlens.triage.worker import AnalysisResult, AnalysisTask, analyze_task

_HASH_BATCH = 256
"""File hashes are committed in batches this large: a killed run re-reads at most this many."""


@dataclass(frozen=True, slots=True)
class TriageOptions:
    jobs: int = field(default_factory=default_jobs)
    timeout: float | None = 600.0
    """Wall-time limit per run, seconds; None: no limit."""
    store: str | None = None
    """The SQLite store's path; None keeps nothing between runs."""
    shard: Shard | None = None
    reports_dir: str | None = None
    """Where per-run HTML reports go; None: none are written."""
    config: str | None = None
    """A ds_config to analyze every run with (else each run's own)."""
    retry_errors: bool = False
    """Analyze again the runs whose stored result is an error."""
    memory_limit: int | None = None
    """Address-space limit per worker process, bytes."""
    deepspeed: bool = False
    """Validate configs with DeepSpeed's own models when it is installed.  Off by default:
    importing DeepSpeed (and torch) costs seconds and gigabytes per process, and oomlens' own
    checks stand in for it."""


class Progress(Protocol):
    def start(self, phase: str, total: int) -> None: ...

    def advance(self, count: int = 1) -> None: ...

    def finish(self) -> None: ...


class _Silent:
    def start(self, phase: str, total: int) -> None:
        pass

    def advance(self, count: int = 1) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class TriageResult:
    table: pandas.DataFrame
    """One row per run (``table.COLUMNS``), newest first."""
    found: int
    """Runs in the tree (all shards)."""
    analyzed: int
    """Runs analyzed by this call."""
    reused: int
    """Runs whose stored result was still valid."""
    seconds: float
    warnings: tuple[str, ...]


def triage(
    paths: Sequence[str | os.PathLike[str]],
    options: TriageOptions,
    *,
    progress: Progress | None = None,
    analyze: Callable[[AnalysisTask], AnalysisResult] = analyze_task,
) -> TriageResult:
    """Triage every run under ``paths``; see the module docstring.

    One run that cannot be read or analyzed is a row with its error, never an exception.
    Raises ``UsageError`` for a path that does not exist or a store that cannot be used.
    ``analyze`` runs in worker processes and must be a module-level function.
    """
    started = time.perf_counter()
    progress = progress or _Silent()
    warnings: list[str] = []
    if options.reports_dir is not None:
        warnings.extend(_prepare_reports_dir(options.reports_dir))
    with ResultStore(options.store) as store:
        known = store.load_files()
        changed: dict[str, FileRecord] = {}
        walk = find_runs(paths, is_log=_log_detector(known, changed))
        warnings.extend(f"{path}: {why}; skipped" for path, why in walk.skipped)
        runs = [r for r in walk.runs if options.shard is None or options.shard.takes(r)]

        # New or changed files mean analyses are likely: warm the analysis up while hashing.
        hashes = _hash_files(
            runs,
            known,
            changed,
            store,
            options.jobs,
            progress,
            meanwhile=lambda: adapter.preload(deepspeed=options.deepspeed),
        )
        analyzer = adapter.analyzer_id()
        config = os.path.abspath(options.config) if options.config else None
        config_key = _config_key(config, options.deepspeed)
        keys = {
            run.identity: run_key(
                analyzer, config_key, run.root, ((rel, hashes[f.path]) for rel, f in run.files)
            )
            for run in runs
        }
        stored = store.get_results(keys.values())
        todo = [
            run for run in runs if _needs_analysis(run, stored.get(keys[run.identity]), options)
        ]
        progress.start("analyzing", len(todo))
        for run, result in _analyze_runs(todo, config, options, analyze):
            if result.report_problem:
                warnings.append(result.report_problem)
            saved = StoredResult(
                keys[run.identity],
                run.identity,
                result.report,
                result.error,
                result.report_file,
                result.seconds,
            )
            store.put_result(saved, analyzer=analyzer)  # committed now: a kill loses nothing
            stored[saved.key] = saved
            progress.advance()
        progress.finish()
        rows = [RunRow(run, stored[keys[run.identity]]) for run in runs]
    return TriageResult(
        build_table(rows),
        len(walk.runs),
        len(todo),
        len(runs) - len(todo),
        time.perf_counter() - started,
        tuple(warnings),
    )


def _prepare_reports_dir(reports_dir: str) -> list[str]:
    """Create the reports directory; the warnings to show (none, or why there is no HTML)."""
    try:
        os.makedirs(reports_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{reports_dir}: cannot create the reports directory ({exc.strerror or exc})"
        ) from exc
    if adapter.html_available():
        return []
    return ["per-run HTML reports are not available in this oomlens version"]


def _analyze_runs(
    runs: Sequence[RunSpec],
    config: str | None,
    options: TriageOptions,
    analyze: Callable[[AnalysisTask], AnalysisResult],
) -> Iterator[tuple[RunSpec, AnalysisResult]]:
    """Analyze ``runs`` in worker processes; yield each run's result as it ends.

    A run whose analysis overran ``options.timeout``, ran out of memory or crashed its worker
    gets a result with that error.
    """
    if not runs:
        return
    adapter.preload(deepspeed=options.deepspeed)
    tasks = [
        AnalysisTask(run.inputs, config, _report_path(run, options), options.deepspeed)
        for run in runs
    ]
    run_of_task = {id(task): run for task, run in zip(tasks, runs, strict=True)}
    with TaskPool(
        analyze,
        jobs=max(1, min(options.jobs, len(tasks))),
        timeout=options.timeout,
        memory_limit=options.memory_limit,
    ) as pool:
        for task, outcome in pool.run(tasks):
            if outcome.failure is not None:
                result = AnalysisResult(None, outcome.failure, None, None, 0.0)
            else:
                result = outcome.value
            yield run_of_task[id(task)], result


def _log_detector(
    known: dict[str, FileRecord], changed: dict[str, FileRecord]
) -> Callable[[FileEntry], bool]:
    """``is_log`` for the walk: by name, else by content, remembered in the store."""

    def is_log(entry: FileEntry) -> bool:
        by_name = log_by_name(os.path.basename(entry.path))
        if by_name is not None:
            return by_name
        record = changed.get(entry.path) or known.get(entry.path)
        if record is not None and _same_version(record, entry) and record.is_log is not None:
            return record.is_log
        try:
            verdict = adapter.is_training_log(entry.path)
        except (InputError, OSError):
            verdict = False
        sha = record.sha256 if record is not None and _same_version(record, entry) else None
        changed[entry.path] = FileRecord(entry.size, entry.mtime_ns, entry.inode, sha, verdict)
        return verdict

    return is_log


def _same_version(record: FileRecord, entry: FileEntry) -> bool:
    return (record.size, record.mtime_ns, record.inode) == (
        entry.size,
        entry.mtime_ns,
        entry.inode,
    )


def _hash_files(
    runs: Sequence[RunSpec],
    known: dict[str, FileRecord],
    changed: dict[str, FileRecord],
    store: ResultStore,
    jobs: int,
    progress: Progress,
    *,
    meanwhile: Callable[[], None],
) -> dict[str, str]:
    """The content hash of every file of ``runs``, reading only files that changed.

    When some files must be read, ``meanwhile()`` runs in this thread while threads hash.
    """
    hashes: dict[str, str] = {}
    to_read: dict[str, FileEntry] = {}
    for run in runs:
        for _, entry in run.files:
            record = changed.get(entry.path) or known.get(entry.path)
            if record is not None and record.sha256 and _same_version(record, entry):
                hashes[entry.path] = record.sha256
            else:
                to_read[entry.path] = entry
    pending = [
        (path, record)
        for path, record in changed.items()
        if path not in to_read and record.sha256 is None
    ]
    store.put_files(pending)  # new content verdicts of files that need no hashing
    if not to_read:
        return hashes
    progress.start("hashing", len(to_read))
    batch: list[tuple[str, FileRecord]] = []
    threads = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        hashed = threads.map(_hash_file, to_read.values())
        meanwhile()
        for entry, sha in hashed:
            hashes[entry.path] = sha or "unreadable"
            if sha is not None:
                previous = changed.get(entry.path) or known.get(entry.path)
                is_log = (
                    previous.is_log
                    if previous is not None and _same_version(previous, entry)
                    else None
                )
                batch.append(
                    (entry.path, FileRecord(entry.size, entry.mtime_ns, entry.inode, sha, is_log))
                )
            if len(batch) >= _HASH_BATCH:
                store.put_files(batch)
                batch = []
            progress.advance()
    finally:
        # An interrupt must not wait for the hashing of every file still queued.
        threads.shutdown(wait=True, cancel_futures=True)
    store.put_files(batch)
    progress.finish()
    return hashes


_HASH_CHUNK = 8 * 1024 * 1024
"""Read size for hashing.  Large on purpose: each read and each digest update releases the
GIL, and with small chunks (``hashlib.file_digest`` uses 256 KiB) the hashing threads spend
their time waiting for the GIL while the main thread imports the analysis."""


def _hash_file(entry: FileEntry) -> tuple[FileEntry, str | None]:
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    try:
        with open(entry.path, "rb", buffering=0) as stream:
            while count := stream.readinto(view):
                digest.update(view[:count])
    except OSError:
        return entry, None
    return entry, digest.hexdigest()


def _config_key(config: str | None, deepspeed: bool) -> str:
    """The options that change an analysis: the config override's path and content, and
    which validator checks configs."""
    key = "deepspeed" if deepspeed else "oomlens"
    if config is None:
        return key
    special = not_regular_problem(config, "a ds_config file")
    if special is not None:
        raise UsageError(f"{config}: {special}")
    try:
        with open(config, "rb") as stream:
            digest = hashlib.file_digest(stream, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"{config}: cannot be read ({exc.strerror or exc})") from exc
    return f"{key}\0{config}\0{digest}"


def _needs_analysis(run: RunSpec, result: StoredResult | None, options: TriageOptions) -> bool:
    if result is None:
        return True
    if result.error is not None:
        return options.retry_errors
    if options.reports_dir is not None and adapter.html_available():
        expected = _report_path_for(run, options.reports_dir)
        return result.report_file != expected or not os.path.isfile(expected)
    return False


def _report_path(run: RunSpec, options: TriageOptions) -> str | None:
    if options.reports_dir is None:
        return None
    return _report_path_for(run, options.reports_dir)


_NAME_CHARS = 80
"""The most characters of a run's name a report's file name keeps."""


def report_file_name(run: RunSpec) -> str:
    """The file name of ``run``'s HTML report: the run's name (``RunSpec.name``: its path
    under the directory given), so that a reader finds a run's report by its name, then the
    start of its identity (two runs may share a name: ``a/x`` and ``a_x``, or one named
    twice on the command line).  A name's ``/`` and every character that is not a letter,
    a digit, ``.``, ``-`` or ``_`` (spaces, controls, undecodable bytes) become ``_``; it
    never starts with a dot (a hidden file)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run.name)
    safe = safe[:_NAME_CHARS].lstrip(".") or "run"
    return f"{safe}-{run.identity[:12]}.html"


def _report_path_for(run: RunSpec, reports_dir: str) -> str:
    return os.path.join(os.path.abspath(reports_dir), report_file_name(run))
