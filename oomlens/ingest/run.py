"""Read every input of a run: the per-rank logs, torchelastic error files and kernel logs.

``read_run(inputs)`` takes what ``discover_run`` found (or ``inputs_of(paths)`` built from
files given one by one) and reads each file with the reader of its kind, giving each the
rank its location says.  A file that cannot be read becomes an ``InputError`` in
``RunLogs.problems``; the others are still read.  Snapshot pickles and ds_config files are
passed through in ``RunLogs.other`` for their own loaders (never unpickled here).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from oomlens.errors import InputError
from oomlens.facts.kernel import KernelLogFacts
from oomlens.facts.log import ErrorFileFacts, LogFacts
from oomlens.ingest.detect import DiscoveredFile, InputKind, RunInputs, detect_kind
from oomlens.ingest.elastic import read_error_file
from oomlens.ingest.log import read_log
from oomlens.ingest.log.kernel import read_kernel_log


@dataclass(frozen=True, slots=True)
class RunLogs:
    logs: tuple[LogFacts, ...]
    error_files: tuple[ErrorFileFacts, ...]
    kernel_logs: tuple[KernelLogFacts, ...]
    other: tuple[DiscoveredFile, ...]
    """Snapshot pickles and ds_config files, for their own loaders."""
    problems: tuple[InputError, ...]
    """One per file that could not be read, in input order."""


def inputs_of(
    paths: Iterable[str | os.PathLike[str]],
) -> tuple[tuple[DiscoveredFile, ...], tuple[InputError, ...]]:
    """Files given one by one, recognised by content.  An unknown kind is a problem, except
    text without a recognisable marker, which is read as a training log (the user named it)."""
    files: list[DiscoveredFile] = []
    problems: list[InputError] = []
    for path in paths:
        shown = os.fspath(path)
        try:
            detection = detect_kind(path)
        except InputError as exc:
            problems.append(exc)
            continue
        kind = detection.kind
        if kind is InputKind.UNKNOWN:
            if detection.reason.startswith("text without"):
                kind = InputKind.TRAINING_LOG
            else:
                problems.append(
                    InputError(
                        shown,
                        f"is not an input oomlens reads: {detection.reason}",
                        "pass a training log, snapshot, ds_config, kernel log or error.json",
                    )
                )
                continue
        files.append(DiscoveredFile(shown, kind, detection.reason, None, None, None, None, None))
    return tuple(files), tuple(problems)


def read_run(inputs: RunInputs | Iterable[DiscoveredFile]) -> RunLogs:
    """Read the logs, error files and kernel logs among ``inputs``."""
    files = inputs.files if isinstance(inputs, RunInputs) else tuple(inputs)
    logs: list[LogFacts] = []
    error_files: list[ErrorFileFacts] = []
    kernel_logs: list[KernelLogFacts] = []
    other: list[DiscoveredFile] = []
    problems: list[InputError] = []
    for file in files:
        rank = file.rank if file.rank is not None else file.local_rank
        try:
            if file.kind is InputKind.TRAINING_LOG:
                logs.append(read_log(file.path, rank=rank))
            elif file.kind is InputKind.ELASTIC_ERROR:
                error_files.append(
                    read_error_file(file.path, rank=file.rank, local_rank=file.local_rank)
                )
            elif file.kind is InputKind.KERNEL_LOG:
                kernel_logs.append(read_kernel_log(file.path))
            else:
                other.append(file)
        except InputError as exc:
            problems.append(exc)
    return RunLogs(
        tuple(logs), tuple(error_files), tuple(kernel_logs), tuple(other), tuple(problems)
    )
