"""Find the runs in a tree of directories, fast, and decide which files belong to which run.

A *run directory* is a directory that directly holds a training log.  Launchers' per-rank
layouts belong to the run around them rather than being runs of their own:

* torchrun ``--log-dir L``: ``L/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and
  ``error.json``;
* DeepSpeed ``--enable_each_rank_log L``: ``L/<YYYYmmddHHMMSS>_rank<N>.log``.

Such a layout belongs to the directory above ``L`` when that directory holds the run's other
files (a combined log, a snapshot, a config), else ``L`` itself is the run.  An ``oomlens
capture`` directory (``<process>.events.jsonl`` files) with no run directory around it is a run
of its own; inside one, it is that run's.  Every other
directory below a run directory belongs to it, down to the next run directory.  SLURM output
files of several jobs in one directory (``slurm-<job>.out``, ``<name>.<job>.err``...) are one
run per job, and so are logs that each start with a launcher's header and ran one after the
other (``attempt1.log``, ``attempt2.log``: ``oomlens.ingest.launches``); the directory's other
files then belong to neither (a snapshot or config could be either's).

The walk lists directories with ``os.scandir`` and looks inside files only to tell a training
log from other text (``is_log``, which the caller may cache); it never follows symbolic links
(it reports those to directories where a run could be) and skips hidden, tool and
virtual-environment directories.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from oomlens.errors import InputError, UsageError
from oomlens.ingest.files import not_regular_problem
from oomlens.ingest.kinds import kind, kind_by_name
from oomlens.ingest.launches import launch_span, separate_launches
from oomlens.ingest.layout import (
    CAPTURE_FILE,
    DEEPSPEED_RANK_LOG,
    SLURM_OUTPUT,
    TEXT_LOG_SUFFIXES,
    TORCHRUN_ATTEMPT_DIR,
    TORCHRUN_FILES,
    not_an_input,
    skipped_dir,
    without_compression,
)

MAX_DEPTH = 32

_LOG_SUFFIXES = (*TEXT_LOG_SUFFIXES, ".txt")
"""Names a training log may have for the walk (besides none at all); content decides."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A regular file seen by the walk, with the ``stat`` fields that identify its version."""

    path: str
    size: int
    mtime_ns: int
    inode: int


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run found in the tree.

    ``name`` is the run's path relative to the directory given on the command line (that
    directory's own name when it is the run), with ``/`` separators: stable across machines
    that mount the archive in different places, so shards agree on it.  ``root`` is the run
    directory's absolute path (the directory of the files, for a run made of files).
    ``inputs`` is what to hand to the analysis (the run directory
    itself, or its files and sub-directories when other runs are nested inside it, or a
    job's files for SLURM output files).  ``files`` are every file whose content makes the
    run what it is, with their path relative to ``root``.
    """

    name: str
    root: str
    path: str
    """What to show as the run's location: ``root``, or the log file for a run that is one
    file (or one SLURM job's output files)."""
    inputs: tuple[str, ...]
    files: tuple[tuple[str, FileEntry], ...]

    @property
    def identity(self) -> str:
        """Tells this run from every other, whatever directory the walk started from."""
        return hashlib.sha256("\0".join(self.inputs).encode("utf-8", "surrogateescape")).hexdigest()

    @property
    def mtime_ns(self) -> int:
        """When the run last wrote anything: the newest of its files."""
        return max((entry.mtime_ns for _, entry in self.files), default=0)


@dataclass(slots=True)
class _Dir:
    path: str
    files: list[FileEntry] = field(default_factory=list)
    subdirs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    """Symbolic links to directories, which the walk does not follow."""


@dataclass(frozen=True, slots=True)
class WalkResult:
    runs: tuple[RunSpec, ...]
    skipped: tuple[tuple[str, str], ...]
    """``(path, why)`` for directories that could not be listed or were too deep, and for
    symbolic links to directories outside every run directory (where a run could have been)."""


def find_runs(
    paths: Sequence[str | os.PathLike[str]], *, is_log: Callable[[FileEntry], bool]
) -> WalkResult:
    """The runs under ``paths`` (directories, or log files taken as one run each).

    ``is_log(entry)`` says whether a file whose name allows it to be a log is a training log;
    it is asked only for such files and must not raise.  Runs come sorted by name, then root.
    Raises ``UsageError`` when a path does not exist or a directory cannot be listed.
    """
    runs: dict[tuple[str, tuple[str, ...]], RunSpec] = {}
    skipped: list[tuple[str, str]] = []
    for given in paths:
        top = os.path.abspath(os.fspath(given))
        if os.path.isfile(top):
            entry = _file_entry(top)
            runs[(top, (top,))] = RunSpec(
                os.path.basename(top),
                os.path.dirname(top),
                top,
                (top,),
                ((os.path.basename(top), entry),),
            )
            continue
        special = not_regular_problem(top, "a run directory or a log")
        if special is not None:
            raise UsageError(f"{os.fspath(given)}: {special}")
        if not os.path.isdir(top):
            raise UsageError(f"{os.fspath(given)}: no such directory")
        tree = _list_tree(top, skipped)
        found = list(_runs_in_tree(top, tree, is_log))
        for run in found:
            runs.setdefault((run.root, run.inputs), run)
        links = list(_unfollowed_links(top, tree, {run.root for run in found}))
        skipped.extend(links)
        if not found and not links and len(paths) > 1:
            # named on the command line among others: its absence from the table is said
            skipped.append(
                (
                    top,
                    "no training log there (a .log, .out or .err file, or text with a "
                    "training-log marker); oomlens analyze reads any text file named to it",
                )
            )
    ordered = sorted(runs.values(), key=lambda run: (run.name, run.root))
    return WalkResult(tuple(ordered), tuple(skipped))


def _file_entry(path: str) -> FileEntry:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc
    return FileEntry(path, info.st_size, info.st_mtime_ns, info.st_ino)


def _list_tree(top: str, skipped: list[tuple[str, str]]) -> dict[str, _Dir]:
    """Every directory under ``top`` with its regular files and subdirectories."""
    tree: dict[str, _Dir] = {}
    stack: list[tuple[str, int]] = [(top, 0)]
    while stack:
        current, depth = stack.pop()
        listing = _Dir(current)
        try:
            with os.scandir(current) as entries:
                scanned = list(entries)
        except OSError as exc:
            if current == top:
                raise UsageError(
                    f"{current}: cannot be listed ({exc.strerror or exc}); check its permissions"
                ) from exc
            skipped.append((current, f"cannot be listed ({exc.strerror or exc})"))
            continue
        for entry in scanned:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            name = entry.name
            if stat.S_ISDIR(info.st_mode):
                if skipped_dir(name):
                    continue
                if depth + 1 > MAX_DEPTH:
                    skipped.append((entry.path, f"deeper than {MAX_DEPTH} levels"))
                    continue
                listing.subdirs.append(entry.path)
                stack.append((entry.path, depth + 1))
            elif stat.S_ISLNK(info.st_mode) and not skipped_dir(name) and _to_directory(entry):
                listing.links.append(entry.path)
            elif stat.S_ISREG(info.st_mode) and _may_be_input(name):
                listing.files.append(
                    FileEntry(entry.path, info.st_size, info.st_mtime_ns, info.st_ino)
                )
        listing.files.sort(key=lambda f: f.path)
        listing.subdirs.sort()
        tree[current] = listing
    return tree


def _to_directory(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _unfollowed_links(
    top: str, tree: dict[str, _Dir], roots: set[str]
) -> Iterable[tuple[str, str]]:
    """``(link, why)`` for the links to directories that could have been runs: those outside
    every run directory (a link inside one is the run's business, like its other folders)."""
    for path, listing in sorted(tree.items()):
        if not listing.links or any(a in roots for a in _ancestors(path, top, self=True)):
            continue
        for link in sorted(listing.links):
            target = os.path.realpath(link)
            yield (
                link,
                f"a symbolic link (to {target}), which triage does not follow; to triage what"
                f" it points to, pass {target} itself",
            )


def _may_be_input(name: str) -> bool:
    return not name.startswith(".") and not not_an_input(name)


def log_by_name(name: str) -> bool | None:
    """True when a file's name makes it a training log for the walk, None when only its
    content can tell (``.txt``, no suffix, and the names of kernel and system logs)."""
    if kind_by_name(without_compression(name)) is kind("kernel_log"):
        return None
    if without_compression(name).endswith(TEXT_LOG_SUFFIXES):
        return True
    return None


def _may_be_log(name: str) -> bool:
    lower = without_compression(name)
    return lower.endswith(_LOG_SUFFIXES) or "." not in lower


def _runs_in_tree(
    top: str, tree: dict[str, _Dir], is_log: Callable[[FileEntry], bool]
) -> Iterable[RunSpec]:
    torchrun_runs: set[str] = set()
    """``L/<run_id>`` of each torchrun layout: it and everything below are per-rank folders."""
    layout_dirs: set[str] = set()
    """The ``--log-dir`` of each per-rank layout."""
    for path, listing in tree.items():
        names = {os.path.basename(f.path) for f in listing.files}
        parent = os.path.dirname(path)
        if (
            names & TORCHRUN_FILES
            and os.path.basename(path).isdigit()
            and TORCHRUN_ATTEMPT_DIR.fullmatch(os.path.basename(parent))
        ):
            run_dir = os.path.dirname(parent)
            log_dir = os.path.dirname(run_dir)
            if log_dir in tree:
                torchrun_runs.add(run_dir)
                layout_dirs.add(log_dir)
        if any(DEEPSPEED_RANK_LOG.fullmatch(name) for name in names):
            layout_dirs.add(path)
    layout_inside = {
        path for path in tree if any(a in torchrun_runs for a in _ancestors(path, top, self=True))
    }

    roots: set[str] = set()
    logs_of: dict[str, list[FileEntry]] = {}
    for path, listing in tree.items():
        if path in layout_inside:
            continue
        logs = [
            f
            for f in listing.files
            if _may_be_log(os.path.basename(f.path))
            and not DEEPSPEED_RANK_LOG.fullmatch(os.path.basename(f.path))
            and is_log(f)
        ]
        if logs:
            roots.add(path)
            logs_of[path] = logs
    for log_dir in sorted(layout_dirs):
        if log_dir in roots:
            continue
        parent = os.path.dirname(log_dir)
        if (
            log_dir != top
            and parent in tree
            and parent not in layout_inside
            and (parent in roots or _holds_run_files(tree[parent]))
        ):
            roots.add(parent)
        else:
            roots.add(log_dir)
    for path, listing in sorted(tree.items()):
        # A capture directory with no run directory around it is a run of its own.
        if path not in layout_inside and any(_capture_events(f) for f in listing.files):
            if not any(a in roots for a in _ancestors(path, top, self=True)):
                roots.add(path)
    holds_runs = {a for root in roots for a in _ancestors(root, top, self=False)}
    """Directories with a run directory somewhere below them."""

    for root in sorted(roots):
        name = _run_name(top, root)
        files = _owned_files(root, tree, roots)
        jobs = _slurm_jobs(logs_of.get(root, []))
        if len(jobs) < 2:
            jobs = _launches(logs_of.get(root, []))
        if len(jobs) >= 2:
            job_paths = {f.path for job_files in jobs.values() for f in job_files}
            for job, job_files in sorted(jobs.items()):
                yield RunSpec(
                    f"{name}/{job}",
                    root,
                    job_files[0].path,
                    tuple(f.path for f in job_files),
                    tuple((os.path.relpath(f.path, root), f) for f in job_files),
                )
            if all(f.path in job_paths for f in logs_of[root]):
                continue
            files = [f for f in files if f.path not in job_paths]
            inputs = _explicit_inputs(root, tree, roots, holds_runs, exclude=job_paths)
        elif root in holds_runs:
            inputs = _explicit_inputs(root, tree, roots, holds_runs, exclude=set())
        else:
            inputs = (root,)
        yield RunSpec(
            name, root, root, inputs, tuple((os.path.relpath(f.path, root), f) for f in files)
        )


def _capture_events(entry: FileEntry) -> bool:
    """A capture's per-process events file (by its name: what makes the directory a run)."""
    match = CAPTURE_FILE.fullmatch(os.path.basename(entry.path))
    return match is not None and match.group("file") == "events"


def _ancestors(path: str, top: str, *, self: bool) -> Iterable[str]:
    """``path`` (when ``self``) and its parents up to ``top`` included."""
    if self:
        yield path
    while path != top:
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
        yield path


def _holds_run_files(listing: _Dir) -> bool:
    """A file named like another input kind's (a snapshot, a config, a kernel log) next to a
    per-rank layout: the directory holds the run's other files."""
    return any(kind_by_name(os.path.basename(entry.path)) is not None for entry in listing.files)


def _is_within(path: str, directory: str) -> bool:
    return path.startswith(directory + os.sep)


def _run_name(top: str, root: str) -> str:
    if root == top:
        return os.path.basename(top) or top
    return os.path.relpath(root, top).replace(os.sep, "/")


def _owned_dirs(root: str, tree: dict[str, _Dir], roots: set[str]) -> Iterable[str]:
    stack = [root]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(d for d in tree[current].subdirs if d in tree and d not in roots)


def _owned_files(root: str, tree: dict[str, _Dir], roots: set[str]) -> list[FileEntry]:
    files = [f for d in _owned_dirs(root, tree, roots) for f in tree[d].files]
    files.sort(key=lambda f: f.path)
    return files


def _explicit_inputs(
    root: str, tree: dict[str, _Dir], roots: set[str], holds_runs: set[str], *, exclude: set[str]
) -> tuple[str, ...]:
    """The run's files, and its subdirectories with no other run inside, one by one."""
    inputs: list[str] = []
    stack = [root]
    while stack:
        current = stack.pop()
        inputs.extend(f.path for f in tree[current].files if f.path not in exclude)
        for sub in tree[current].subdirs:
            if sub not in tree or sub in roots:
                continue
            if sub in holds_runs:
                stack.append(sub)
            else:
                inputs.append(sub)
    return tuple(sorted(inputs))


def _launches(logs: list[FileEntry]) -> dict[str, list[FileEntry]]:
    """Logs that each hold a launch of their own (a launcher's header, and times that do not
    overlap the others': ``oomlens.ingest.launches``) by name (``attempt1.log`` is launch
    ``attempt1``); empty unless two or more do."""
    if len(logs) < 2:
        return {}
    spans = {entry.path: launch_span(entry.path) for entry in logs}
    launched = [entry for entry in logs if spans[entry.path] is not None]
    if not separate_launches([span for span in spans.values() if span is not None]):
        return {}
    names: dict[str, list[FileEntry]] = {}
    for entry in launched:
        name = os.path.basename(entry.path)
        stem = os.path.splitext(name[: len(without_compression(name))])[0] or name
        # the stem unless two logs share it (``a.log``, ``a.out``): then the whole name
        names.setdefault(stem if stem not in names else name, []).append(entry)
    return names


def _slurm_jobs(logs: list[FileEntry]) -> dict[str, list[FileEntry]]:
    """SLURM output files by job (``slurm-12_3.out`` is job ``slurm-12_3``); empty if none."""
    jobs: dict[str, list[FileEntry]] = {}
    for entry in logs:
        match = SLURM_OUTPUT.fullmatch(os.path.basename(entry.path))
        if match is None:
            continue
        job = f"{match['stem']}{match['sep']}{match['job']}"
        jobs.setdefault(job, []).append(entry)
    return jobs
