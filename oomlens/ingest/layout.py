"""Where launchers and tools put a run's files, and what a file's name says about it.

The one copy of the run-directory layout rules, for run discovery (``oomlens.ingest.detect``),
``oomlens triage``'s walk and the SLURM epilog:

* torchrun ``--log-dir L``: ``L/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,
  error.json}``;
* DeepSpeed ``--enable_each_rank_log L``: ``L/<YYYYmmddHHMMSS>_rank<N>.log``;
* SLURM's ``slurm-<job>.out`` (and ``<name>.<job>.err``...): one job's output;
* a ``rank<N>`` part of a file name (``snapshot_rank3.pickle``, torchtitan's
  ``rank3_memory_snapshot.pickle``);
* ``oomlens capture``: ``<work dir>/oomlens-capture/<run>/<process>.{events,series}.jsonl``
  (``<process>`` is ``rank<R>[-restart<N>][-pid<P>]``; a SLURM job's ``<run>`` is
  ``slurm-<job>`` or ``slurm-<array job>_<task>``);
* directories never searched (hidden, tool and virtual-environment ones, experiment trackers)
  and names no reader takes (images, checkpoints, code...).

Names are hints only: what a file *is* is decided by its content (``oomlens.ingest.kinds``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TORCHRUN_FILE = re.compile(
    r"(?:^|/)(?P<run>[^/]{1,200})/attempt_(?P<attempt>\d{1,6})/(?P<local>\d{1,6})/"
    r"(?P<name>stdout\.log|stderr\.log|error\.json)\Z"
)
TORCHRUN_ATTEMPT_DIR = re.compile(r"attempt_\d{1,6}")
TORCHRUN_FILES = frozenset({"stdout.log", "stderr.log", "error.json"})
DEEPSPEED_RANK_LOG = re.compile(r"\d{14}_rank(?P<rank>\d{1,6})\.log")
CAPTURE_DIR = "oomlens-capture"
"""Where ``python -m oomlens.capture`` writes, under the job's working directory."""
CAPTURE_FILE = re.compile(r"(?P<process>[^/]{1,200}?)\.(?P<file>events|series)\.jsonl")
"""A capture's per-process file (its name; what it is, its header line says)."""
SLURM_OUTPUT = re.compile(
    r"(?P<stem>.{0,200}?)(?P<sep>[._-])(?P<job>\d{1,12}(?:_\d{1,9})?)\.(?:out|err)"
)
"""SLURM's output files of one job (``slurm-<job>.out``, ``<name>.<job>_<task>.err``...)."""
_RANK_IN_NAME = re.compile(
    r"(?:^|[_.-])rank[_-]?(?P<rank>\d{1,6})(?=[_.-][^/]*\Z|\Z)", re.IGNORECASE
)

SKIP_DIRS = frozenset({"__pycache__", "node_modules", "venv", "site-packages", "wandb"})
"""Directories never searched, besides hidden ones (``.git``, ``.venv``, ``.cache``...)."""

COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
TEXT_LOG_SUFFIXES = (".log", ".out", ".err", ".stdout", ".stderr")
"""Names of text logs: a file so named is a log even when it holds no marker (a quiet run)."""
NOT_INPUT_SUFFIXES = (
    ".png", ".jpg", ".jpeg", ".gif", ".svg", ".ico", ".pdf", ".so", ".o", ".a", ".pyc", ".whl",
    ".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".npy", ".npz", ".h5", ".onnx", ".tar",
    ".zip", ".parquet", ".arrow", ".msgpack", ".py", ".sh", ".md", ".ipynb", ".html", ".css",
    ".js", ".lock", ".wandb", ".tfevents", ".db", ".sqlite", ".sqlite-wal", ".sqlite-shm",
)  # fmt: skip
"""Names no reader takes: not even looked into (a multi-GB checkpoint next to the logs)."""


def skipped_dir(name: str) -> bool:
    """A directory never searched for inputs."""
    return name.startswith(".") or name in SKIP_DIRS


def without_compression(name: str) -> str:
    """``train.log.gz`` -> ``train.log`` (lower-cased)."""
    lower = name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if lower.endswith(suffix):
            return lower[: -len(suffix)]
    return lower


def not_an_input(name: str) -> bool:
    """True when the name alone rules the file out (see ``NOT_INPUT_SUFFIXES``); text logs,
    ``.txt`` and ``.json`` files are always looked into."""
    lower = name.lower()
    return lower.endswith(NOT_INPUT_SUFFIXES) and not lower.endswith(
        (*TEXT_LOG_SUFFIXES, ".txt", ".json")
    )


def text_log_name(name: str) -> bool:
    """A name that makes a marker-less text file a log (compression suffixes aside)."""
    return without_compression(name).endswith(TEXT_LOG_SUFFIXES)


def capture_process(path: str) -> str | None:
    """The process a capture file belongs to (its directory and name prefix, shared by the
    process' events and series files), or None when the name is not a capture file's."""
    head, name = os.path.split(path)
    match = CAPTURE_FILE.fullmatch(name)
    return os.path.join(head, match.group("process")) if match is not None else None


def capture_run_names(
    job_id: str | None, array_job_id: str | None = None, array_task_id: str | None = None
) -> list[str]:
    """The directory names ``oomlens capture`` gives a SLURM job's run under ``CAPTURE_DIR``,
    most specific first (the writer's side: ``oomlens.capture.naming``)."""
    names = []
    if array_job_id is not None and array_task_id is not None:
        names.append(f"slurm-{array_job_id}_{array_task_id}")
    if job_id:
        names.append(f"slurm-{job_id}")
    return names


def rank_from_name(name: str) -> int | None:
    """The rank a ``rank<N>`` part of a file's name gives (``snapshot_rank3.pickle``,
    ``rank3_memory_snapshot.pickle``, ``20261130045900_rank3.log``), else None."""
    match = _RANK_IN_NAME.search(name.replace("\\", "/").rsplit("/", 1)[-1])
    return int(match.group("rank")) if match is not None else None


@dataclass(frozen=True, slots=True)
class Location:
    """What a file's place in a run directory says about it."""

    rank: int | None = None
    """The global rank (DeepSpeed per-rank logs, ``rank<N>`` names)."""
    local_rank: int | None = None
    """The local rank of torchrun's ``attempt_<n>/<local_rank>/`` layout."""
    attempt: int | None = None
    run_id: str | None = None
    stream: str | None = None
    """``stdout`` or ``stderr`` for torchrun's per-rank logs."""

    @property
    def per_rank(self) -> bool:
        """A per-rank file of a launcher's layout (that rank's output)."""
        return self.stream is not None or self.rank is not None


def location(relative: str) -> Location:
    """The location of a file at ``relative`` (to its run directory)."""
    rel = relative.replace(os.sep, "/")
    match = TORCHRUN_FILE.search(rel)
    if match is not None:
        stream = match.group("name").split(".")[0]
        return Location(
            local_rank=int(match.group("local")),
            attempt=int(match.group("attempt")),
            run_id=match.group("run"),
            stream=stream if stream != "error" else None,
        )
    return Location(rank=rank_from_name(rel))
