"""Tell what an input is by its content, and find the inputs of a run directory.

``detect_kind(path)`` looks at a bounded head of the file (decompressed when compressed)
and returns a ``Detection``: a training log, a snapshot pickle, a ds_config JSON, a kernel
log, a torchelastic error.json, or unknown, with the reason.  Names are never trusted.

``discover_run(directory)`` walks a run directory (bounded depth and file count, obvious junk
skipped) and returns ``RunInputs``: every recognised file with the rank its location gives
(torchrun ``--log-dir`` ``<dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/{stdout.log,
stderr.log,error.json}``, DeepSpeed ``--enable_each_rank_log`` ``<YYYYmmddHHMMSS>_rank<N>.log``,
or a ``rank<N>`` in the file name), and what was skipped and why.  All files of one directory
are one run; ``run_id`` tells torchrun runs apart when a directory holds several.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from enum import StrEnum

import regex

from oomlens.errors import InputError
from oomlens.ingest.capture import is_capture_head
from oomlens.ingest.textstream import Compression, open_text, read_head

HEAD_BYTES = 64 * 1024
MAX_DEPTH = 6
MAX_FILES = 5000
MAX_CONFIG_BYTES = 8 * 1024 * 1024


class InputKind(StrEnum):
    TRAINING_LOG = "training_log"
    SNAPSHOT_PICKLE = "snapshot_pickle"
    DS_CONFIG = "ds_config"
    KERNEL_LOG = "kernel_log"
    ELASTIC_ERROR = "elastic_error"
    CAPTURE = "capture"
    """A file of an oomlens capture directory (``oomlens.ingest.capture``)."""
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Detection:
    path: str
    kind: InputKind
    compression: Compression
    reason: str
    """Why this kind (or, for ``UNKNOWN``, what the file looked like instead)."""


_DS_KEYS = (
    "zero_optimization",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "fp16",
    "bf16",
    "optimizer",
    "scheduler",
    "gradient_clipping",
    "steps_per_print",
    "zero_allow_untested_optimizer",
    "wall_clock_breakdown",
    "activation_checkpointing",
    "zero_force_ds_cpu_optimizer",
    "memory_breakdown",
    "flops_profiler",
    "data_types",
)
_KERNEL_LINE = regex.compile(
    r"\[\s{0,12}\d{1,10}\.\d{1,9}\] |\[\w{3} \w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4}\] |"
    r"(?:\w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S{0,20}) \S{1,255} kern"
    r"el: |"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d{1,9}(?:[+-]\d\d:?\d\d|Z)? "
)
_LOG_MARKERS = regex.compile(
    r"Traceback \(most recent call last\)|\[(?:rank|default)\d{1,6}\]:|OutOfMemoryError|out of me"
    r"mory|"
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\]|"
    r"(?m:^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6,9} )|NCCL (?:INFO|WARN)|torch\.distributed|"
    r"CUDA error|\bstep=\d|'loss': |\b(?:epoch|loss|step|iter)\b\s{0,2}[:=]\s{0,2}\d|"
    r"\b(?:step|iter|epoch|batch) \d{1,9}/\d{1,9}\b|"
    r"\d{1,9}/\d{1,9} \[\d{1,4}:\d\d|Setting ds_accelerator|(?m:^Killed$)"
)
"""Strong signs of a training log; plain prose that merely mentions torch is not one."""


def _text_ratio(head: bytes) -> float:
    if not head:
        return 1.0
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd") + sum(1 for ch in text if ch < " " and ch not in "\t\n\r\x1b\x0c")
    return 1.0 - bad / max(len(text), 1)


def _classify_json(head: bytes, path: str, size: int) -> tuple[InputKind, str] | None:
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return None
    data: object = None
    if size <= MAX_CONFIG_BYTES and len(head) >= size:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    if isinstance(data, dict):
        if "message" in data and (isinstance(data["message"], (dict, str))):
            message = data["message"]
            if isinstance(message, str) or "extraInfo" in message or "message" in message:
                return InputKind.ELASTIC_ERROR, "JSON with a torchelastic 'message'"
        keys = [key for key in _DS_KEYS if key in data]
        if keys:
            return InputKind.DS_CONFIG, "JSON with DeepSpeed keys: " + ", ".join(keys[:4])
        return (
            InputKind.UNKNOWN,
            "JSON, but neither a DeepSpeed config nor a torchelastic error file",
        )
    if '"extraInfo"' in text or '"py_callstack"' in text:
        return InputKind.ELASTIC_ERROR, "JSON-like with torchelastic 'extraInfo'"
    keys = [key for key in _DS_KEYS if f'"{key}"' in text]
    if keys:
        return InputKind.DS_CONFIG, "JSON-like with DeepSpeed keys: " + ", ".join(
            keys[:4]
        ) + " (not strictly valid JSON)"
    return None


def detect_kind(path: str | os.PathLike[str], *, display: str | None = None) -> Detection:
    """The kind of ``path`` by content.  Raises InputError when it cannot be opened."""
    shown = display if display is not None else os.fspath(path)
    source = open_text(path, display=shown)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as raw:
            first = raw.read(2)
    except OSError as exc:
        raise InputError(shown, f"cannot be read ({exc.strerror or exc})") from exc
    if size == 0:
        return Detection(shown, InputKind.UNKNOWN, Compression.NONE, "the file is empty")
    if len(first) == 2 and first[0] == 0x80 and 2 <= first[1] <= 5:
        return Detection(
            shown, InputKind.SNAPSHOT_PICKLE, Compression.NONE, f"pickle protocol {first[1]}"
        )
    head = read_head(path, HEAD_BYTES, display=shown)
    compression = source.compression
    if compression is not Compression.NONE:
        if not head:
            return Detection(
                shown,
                InputKind.UNKNOWN,
                compression,
                f"{compression} data that decompresses to nothing",
            )
        if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
            return Detection(
                shown,
                InputKind.SNAPSHOT_PICKLE,
                compression,
                f"{compression}-compressed pickle protocol {head[1]}",
            )
    if _text_ratio(head) < 0.7:
        return Detection(shown, InputKind.UNKNOWN, compression, "binary data, not text")
    if is_capture_head(head):
        return Detection(shown, InputKind.CAPTURE, compression, "an oomlens capture file")
    decoded_size = (
        size
        if compression is Compression.NONE
        else len(head) + (1 if len(head) >= HEAD_BYTES else 0)
    )
    json_kind = _classify_json(head, shown, decoded_size)
    if json_kind is not None:
        return Detection(shown, json_kind[0], compression, json_kind[1])
    text = head.decode("utf-8", "replace")
    lines = [line for line in text.splitlines()[:400] if line.strip()]
    if len(head) >= HEAD_BYTES and lines:
        lines = lines[:-1]  # the head may cut the last line
    kernel_lines = sum(1 for line in lines if _KERNEL_LINE.match(line))
    if lines and kernel_lines * 2 >= len(lines):
        return Detection(
            shown,
            InputKind.KERNEL_LOG,
            compression,
            f"{kernel_lines} of {len(lines)} lines are kernel log lines",
        )
    marker = _LOG_MARKERS.search(text)
    if marker is not None:
        return Detection(
            shown,
            InputKind.TRAINING_LOG,
            compression,
            f"text with a training-log marker ({marker.group(0)!r})",
        )
    return Detection(
        shown,
        InputKind.UNKNOWN,
        compression,
        "text without any training-log, kernel-log or config marker in its first 64 KiB",
    )


# --- run directories ------------------------------------------------------------------------

_TORCHRUN_FILE = regex.compile(
    r"(?:^|/)(?P<run>[^/]{1,200})/attempt_(?P<attempt>\d{1,6})/(?P<local>\d{1,6})/(?P<name>stdout\.log|stderr\.log|error\.json)\Z"
)
_DS_RANK_FILE = regex.compile(r"(?:^|/)\d{14}_rank(?P<rank>\d{1,6})\.log\Z")
_RANK_IN_NAME = regex.compile(
    r"(?:^|[/_.-])rank[_-]?(?P<rank>\d{1,6})(?=[_.-][^/]*\Z|\Z)", regex.IGNORECASE
)
_TEXT_LOG_SUFFIXES = (".log", ".out", ".err", ".stdout", ".stderr")
_SKIP_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        "node_modules",
        ".venv",
        "venv",
        ".ipynb_checkpoints",
        "site-packages",
        ".mypy_cache",
        ".pytest_cache",
        ".tox",
        ".cache",
    }
)
_JUNK_SUFFIXES = (
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".svg",
    ".ico",
    ".pdf",
    ".so",
    ".o",
    ".a",
    ".pyc",
    ".whl",
    ".pt",
    ".pth",
    ".bin",
    ".ckpt",
    ".safetensors",
    ".npy",
    ".npz",
    ".h5",
    ".onnx",
    ".tar",
    ".zip",
    ".parquet",
    ".arrow",
    ".msgpack",
    ".py",
    ".sh",
    ".md",
    ".ipynb",
    ".html",
    ".css",
    ".js",
    ".lock",
    ".wandb",
    ".tfevents",
    ".db",
    ".sqlite",
)


@dataclass(frozen=True, slots=True)
class DiscoveredFile:
    path: str
    kind: InputKind
    reason: str
    rank: int | None
    """The global rank the location gives (DeepSpeed per-rank logs, ``rank<N>`` names)."""
    local_rank: int | None
    """The local rank of torchrun's ``attempt_<n>/<local_rank>/`` layout."""
    attempt: int | None
    run_id: str | None
    stream: str | None
    """``stdout`` or ``stderr`` for torchrun's per-rank files."""


@dataclass(frozen=True, slots=True)
class RunInputs:
    root: str
    layout: str
    """``torchrun_log_dir``, ``deepspeed_rank_logs``, ``rank_named_files`` or ``flat``."""
    files: tuple[DiscoveredFile, ...]
    skipped: tuple[tuple[str, str], ...]
    """``(path, why)`` for files and directories not used."""
    truncated: bool
    """True when the walk stopped at ``MAX_FILES`` files."""


def _location(relative: str) -> tuple[int | None, int | None, int | None, str | None, str | None]:
    rel = relative.replace(os.sep, "/")
    match = _TORCHRUN_FILE.search(rel)
    if match is not None:
        stream = match.group("name").split(".")[0]
        return (
            None,
            int(match.group("local")),
            int(match.group("attempt")),
            match.group("run"),
            stream if stream != "error" else None,
        )
    match = _DS_RANK_FILE.search(rel)
    if match is not None:
        return int(match.group("rank")), None, None, None, None
    match = _RANK_IN_NAME.search(rel.rsplit("/", 1)[-1])
    if match is not None:
        return int(match.group("rank")), None, None, None, None
    return None, None, None, None, None


def discover_run(directory: str | os.PathLike[str], *, display: str | None = None) -> RunInputs:
    """The inputs of a run directory; see the module docstring.

    Raises InputError when ``directory`` cannot be listed.  A directory with nothing
    recognisable gives ``files == ()`` (the caller reports it, with ``skipped``).
    """
    root = os.fspath(directory)
    shown_root = display if display is not None else root
    if not os.path.isdir(root):
        raise InputError(shown_root, "is not a directory")
    try:
        os.listdir(root)
    except OSError as exc:
        raise InputError(
            shown_root, f"cannot be listed ({exc.strerror or exc})", "check its permissions"
        ) from exc
    files: list[DiscoveredFile] = []
    skipped: list[tuple[str, str]] = []
    examined = 0
    truncated = False
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        current, depth = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(
                (_shown(shown_root, root, current), f"cannot be listed ({exc.strerror or exc})")
            )
            continue
        subdirs: list[str] = []
        for entry in entries:
            shown = _shown(shown_root, root, entry.path)
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as exc:
                skipped.append((shown, f"cannot be read ({exc.strerror or exc})"))
                continue
            if stat.S_ISDIR(info.st_mode):
                if entry.name in _SKIP_DIRS or entry.name.startswith("."):
                    skipped.append((shown, "skipped directory"))
                elif depth + 1 > MAX_DEPTH:
                    skipped.append((shown, f"deeper than {MAX_DEPTH} levels"))
                else:
                    subdirs.append(entry.path)
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append((shown, "not a regular file"))
                continue
            if entry.name.lower().endswith(_JUNK_SUFFIXES) and not entry.name.lower().endswith(
                (".log", ".txt", ".json")
            ):
                skipped.append((shown, "not a log, snapshot, config or kernel log (by its name)"))
                continue
            if examined >= MAX_FILES:
                truncated = True
                skipped.append((shown, f"more than {MAX_FILES} files; not examined"))
                continue
            examined += 1
            if info.st_size == 0:
                skipped.append((shown, "empty"))
                continue
            try:
                detection = detect_kind(entry.path, display=shown)
            except InputError as exc:
                skipped.append((shown, exc.problem))
                continue
            rank, local_rank, attempt, run_id, stream = _location(os.path.relpath(entry.path, root))
            kind, reason = detection.kind, detection.reason
            if kind is InputKind.UNKNOWN and reason.startswith("text without"):
                if stream is not None or rank is not None:
                    # A per-rank file of a launcher's layout is that rank's output.
                    kind, reason = InputKind.TRAINING_LOG, "a per-rank log of the launcher's layout"
                elif entry.name.lower().endswith(_TEXT_LOG_SUFFIXES):
                    # A quiet healthy run prints nothing a marker would catch.
                    kind, reason = InputKind.TRAINING_LOG, "a text log by its name, no markers"
            if kind is InputKind.UNKNOWN:
                skipped.append((shown, reason))
                continue
            files.append(
                DiscoveredFile(entry.path, kind, reason, rank, local_rank, attempt, run_id, stream)
            )
        stack.extend((path, depth + 1) for path in reversed(subdirs))
    if any(f.attempt is not None for f in files):
        layout = "torchrun_log_dir"
    elif any(_DS_RANK_FILE.search(f.path.replace(os.sep, "/")) for f in files):
        layout = "deepspeed_rank_logs"
    elif any(f.rank is not None for f in files):
        layout = "rank_named_files"
    else:
        layout = "flat"
    return RunInputs(shown_root, layout, tuple(files), tuple(skipped), truncated)


def _shown(shown_root: str, root: str, path: str) -> str:
    return os.path.join(shown_root, os.path.relpath(path, root))
