"""Tell what an input is by its content, and find the inputs of a run directory.

``detect_kind(path)`` looks at a bounded head of the file (decompressed when compressed) and
asks the registered kinds (``oomlens.ingest.kinds``) in their precedence order (the binary
kinds first; a JSON object only the JSON kinds, whatever the others' precedence); it returns a
``Detection``: the kind with the reason, or none with what the file looked like instead.  Names
are never trusted.  A text file in a document's format (an HTML page, a JUnit report, Python
source, a script, a CSV table, Markdown...: ``ingest.documents``) is no input, whatever error
it quotes; a Markdown paste of a log is one only when the user names it.  ``accept`` is the
one place that decides what to do with a text file no kind recognised (a quiet training log,
when the user named it or its name or place says so).

``discover_run(directory)`` walks a run directory (bounded depth, the junk of
``oomlens.ingest.layout`` skipped; beyond ``MAX_FILES`` files, those named like inputs are
looked into first) and returns ``RunInputs``: every recognised file with what
its location says (rank, torchrun local rank and attempt), and what was skipped and why.  All
files of one directory are one run; ``run_id`` tells torchrun runs apart when a directory holds
several.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import re
import stat
import tempfile
from dataclasses import dataclass

from oomlens.errors import InputError
from oomlens.ingest import kinds
from oomlens.ingest.documents import Document, document
from oomlens.ingest.kinds import FoundInput, InputKind, Sample
from oomlens.ingest.layout import (
    DEEPSPEED_RANK_LOG,
    Location,
    location,
    not_an_input,
    skipped_dir,
    text_log_name,
    without_compression,
)
from oomlens.ingest.textstream import HEAD_BYTES, Compression, open_text, read_head

MAX_DEPTH = 6
MAX_FILES = 5000
_TEXT_RATIO = 0.7
"""Below this share of printable characters in the head, a file is binary, not text."""


@dataclass(frozen=True, slots=True)
class Detection:
    path: str
    kind: InputKind | None
    """None: no kind recognised the content."""
    compression: Compression
    reason: str
    """Why this kind (or, without one, what the file looked like instead)."""
    plain_text: bool = False
    """No kind, but text: a log that prints no marker may still be one (see ``accept``)."""
    quoted_in: str | None = None
    """The document (``a Markdown document``...) that quotes the log: read as a log only when
    the user names it (see ``accept``)."""

    @property
    def kind_id(self) -> str:
        return self.kind.id if self.kind is not None else "unknown"


_ZERO_RUN = re.compile(rb"\x00{16,}")
"""A run of zero bytes: what a crash leaves in a log file (a hole the writer never filled, a
preallocated tail), not binary content; the reader drops them too."""
_HOLEY_SCAN_BYTES = 64 * HEAD_BYTES
"""How far the sniffing reads through zero runs for a head's worth of text."""


def _text_of_holey(path: str | os.PathLike[str], head: bytes, shown: str) -> bytes:
    """The head without its zero runs; when they left little of it, the text after them,
    read on through at most ``_HOLEY_SCAN_BYTES``."""
    text = _ZERO_RUN.sub(b"", head)
    if len(text) >= HEAD_BYTES // 2 or len(head) < HEAD_BYTES:
        return text
    more = read_head(path, _HOLEY_SCAN_BYTES, display=shown)
    return _ZERO_RUN.sub(b"", more)[:HEAD_BYTES]


def _old_protocol_pickle(data: bytes) -> bool:
    """``data`` is one whole pickle of protocol 0 (text-like opcodes a log never makes up to
    the end): its opcodes, read by ``pickletools.genops`` (which parses, never builds or
    imports anything), run from the first byte to a STOP that ends the data."""
    if b"\n" not in data or data[:1] == pickle.PROTO:
        return False  # protocol 0 writes every argument on a line of its own
    end = -1
    try:
        for opcode, _, position in pickletools.genops(data):
            if opcode.proto > 0:
                return False  # protocol 1 is binary: the text test refuses it
            if opcode.name == "STOP" and position is not None:
                end = position + 1
                break
    except Exception:  # noqa: BLE001 - anything genops cannot parse is no pickle
        return False
    return end > 1 and not data[end:].strip()


def _text_ratio(head: bytes) -> float:
    if not head:
        return 1.0
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd") + sum(1 for ch in text if ch < " " and ch not in "\t\n\r\x1b\x0c")
    return 1.0 - bad / max(len(text), 1)


def detect_kind(path: str | os.PathLike[str], *, display: str | None = None) -> Detection:
    """The kind of ``path`` by content.  Raises InputError when it cannot be opened."""
    shown = display if display is not None else os.fspath(path)
    source = open_text(path, display=shown)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise InputError(shown, f"cannot be read ({exc.strerror or exc})") from exc
    compression = source.compression
    if size == 0:
        return Detection(shown, None, Compression.NONE, "the file is empty")
    head = read_head(path, HEAD_BYTES, display=shown)
    if compression is not Compression.NONE and not head:
        # a decoder hands over whole blocks: a stream cut inside its first one yields nothing
        nothing = (
            f"a {compression} stream cut short before any of its text could be decoded"
            if source.cut_short()
            else f"{compression} data that decompresses to nothing"
        )
        return Detection(shown, None, compression, nothing)
    sample = Sample(shown, size, head, compression)
    ordered = kinds.by_precedence()
    for candidate in (k for k in ordered if k.binary):
        reason = candidate.recognise(sample)
        if reason is not None:
            return Detection(shown, candidate, compression, reason)
    if _ZERO_RUN.search(head):
        head = _text_of_holey(path, head, shown)
        if not head:
            return Detection(shown, None, compression, "nothing but zero bytes")
        sample = Sample(shown, size, head, compression)
    if _text_ratio(head) < _TEXT_RATIO:
        return Detection(shown, None, compression, "binary data, not text")
    if sample.json_problem is not None:
        return Detection(shown, None, compression, sample.json_problem)
    json_kinds = [k for k in ordered if k.json_document]
    if sample.json_object is not None:
        # A JSON object is decided among the kinds whose files are JSON documents, whatever
        # the precedence of the text kinds: none of those may claim it.
        for candidate in json_kinds:
            reason = candidate.recognise(sample)
            if reason is not None:
                return Detection(shown, candidate, compression, reason)
        labels = " nor ".join(sorted(k.label for k in json_kinds))
        return Detection(shown, None, compression, f"JSON, but neither {labels}")
    found = document(sample.text, whole=sample.whole)
    if found is not None and not _quotes_log(found, ordered, shown):
        # an error quoted in a document (a README, the training script, a report) is no crash
        return Detection(shown, None, compression, f"{found.what}, not a log")
    # a document that quotes a log: a ticket's paste when named, notes beside the run's log
    quoted_in = found.what if found is not None else None
    for candidate in (k for k in ordered if not k.binary):
        reason = candidate.recognise(sample)
        if reason is not None:
            return Detection(shown, candidate, compression, reason, quoted_in=quoted_in)
    if sample.whole and _old_protocol_pickle(head):
        # text no kind recognised: what a user names is read as a quiet log, but not this
        return Detection(
            shown,
            None,
            compression,
            "a pickle of protocol 0 (torch writes snapshots with protocol 2 or later)",
        )
    return Detection(
        shown,
        None,
        compression,
        "text without any training-log, kernel-log or config marker in its first 64 KiB",
        plain_text=True,
        quoted_in=quoted_in,
    )


def _quotes_log(found: Document, ordered: tuple[InputKind, ...], shown: str) -> bool:
    """What the document quotes (its code blocks of output, a snippet's comments) has log
    lines, or, set apart as output in code blocks, a line the log reader reads
    (``_reader_reads``), or is recognised by a text kind: the document holds a log.  So may a
    code block the head read ends inside."""
    if found.cut_in_block:
        return True
    if not found.quoted.strip():
        return False
    if found.quotes_log_lines:
        return True
    quoted = found.quoted.encode("utf-8", "surrogateescape")
    sample = Sample(shown, len(quoted), quoted, Compression.NONE)
    text_kinds = (k for k in ordered if not k.binary and not k.json_document)
    if any(k.recognise(sample) is not None for k in text_kinds):
        return True
    return found.fenced and _reader_reads(found.quoted)


def _reader_reads(text: str) -> bool:
    """The log reader, reading ``text`` as a log, finds what tells of a failure in it: an
    out-of-memory error (caught or not), an exception or a traceback, a process's failure or
    a fatal signal, a launcher's failed exit or kill, a kernel's or a scheduler's kill, an
    allocator's summary, a rejected config.  What counts as a log's line is what the reader
    reads, not a list of forms."""
    from oomlens.ingest.log import read_log  # the log package loads numpy: only when asked

    with tempfile.TemporaryDirectory(prefix="oomlens-quoted-") as folder:
        path = os.path.join(folder, "quoted.txt")
        with open(path, "wb") as out:
            out.write(text.encode("utf-8", "surrogateescape"))
        try:
            log = read_log(path)
        except InputError:
            return False
    return bool(
        log.oom_events
        or log.caught_oom_events
        or log.exceptions
        or log.partial_tracebacks
        or log.process_failures
        or log.failure_summaries
        or any(e.return_code != 0 for e in log.launcher_exits)
        or log.killed_subprocesses
        or log.fatal_signals
        or log.kernel_oom_kills
        or log.slurm_oom_kills
        or log.allocator_summaries
        or log.config_errors
        or log.batch_assertions
    )


_NOWHERE = Location()


def accept(
    detection: Detection,
    *,
    named_by_user: bool = False,
    where: Location = _NOWHERE,
    name: str = "",
) -> tuple[InputKind, str] | None:
    """The kind to read a detected file as, and why; None when it is no input.

    A recognised kind stands.  A text file no kind recognised is taken by the kind that accepts
    plain text (the training log) when the user named the file, when it is a per-rank file of a
    launcher's layout, or when its name is a log's.  A document that quotes a log is taken only
    when the user named it (a ticket's paste; in a run directory, notes).
    """
    if detection.quoted_in is not None and not named_by_user:
        return None
    if detection.kind is not None:
        return detection.kind, detection.reason
    if not detection.plain_text:
        return None
    for candidate in kinds.KINDS:
        reason = candidate.accepts_plain_text(
            named_by_user=named_by_user, location=where, name=name
        )
        if reason:
            return candidate, reason
    return None


# --- run directories ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunInputs:
    root: str
    layout: str
    """``torchrun_log_dir``, ``deepspeed_rank_logs``, ``rank_named_files`` or ``flat``."""
    files: tuple[FoundInput, ...]
    skipped: tuple[tuple[str, str], ...]
    """``(path, why)`` for files and directories not used."""
    truncated: bool
    """True when more than ``MAX_FILES`` files could be inputs: the others were not examined
    (each is in ``skipped``, with how many were left out)."""


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
    files: list[FoundInput] = []
    skipped: list[tuple[str, str]] = []
    candidates: list[tuple[str, str, str, int]] = []
    """``(path, shown, name, size)`` of every regular file that may be an input, in walk order."""
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
                if skipped_dir(entry.name):
                    skipped.append((shown, "skipped directory"))
                elif depth + 1 > MAX_DEPTH:
                    skipped.append((shown, f"deeper than {MAX_DEPTH} levels"))
                else:
                    subdirs.append(entry.path)
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append((shown, "not a regular file"))
                continue
            if not_an_input(entry.name):
                skipped.append((shown, "not a log, snapshot, config or kernel log (by its name)"))
                continue
            candidates.append((entry.path, shown, entry.name, info.st_size))
        stack.extend((path, depth + 1) for path in reversed(subdirs))
    chosen = _examined(root, candidates)
    truncated = len(chosen) < len(candidates)
    for path, shown, name, size in candidates:
        if path not in chosen:
            skipped.append(
                (
                    shown,
                    f"not examined: one of {len(candidates) - len(chosen)} files left out of "
                    f"{len(candidates)} (at most {MAX_FILES} are read; those named like inputs "
                    "first)",
                )
            )
            continue
        if size == 0:
            skipped.append((shown, "empty"))
            continue
        try:
            detection = detect_kind(path, display=shown)
        except InputError as exc:
            skipped.append((shown, exc.problem))
            continue
        except Exception as exc:  # noqa: BLE001 - one file's bug must not cost the run
            skipped.append((shown, f"internal error while reading it: {type(exc).__name__}"))
            continue
        where = location(os.path.relpath(path, root))
        accepted = accept(detection, where=where, name=name)
        if accepted is None:
            skipped.append((shown, _why_not(detection)))
            continue
        files.append(FoundInput(path, accepted[0], accepted[1], where))
    return RunInputs(shown_root, _layout(files), tuple(files), tuple(skipped), truncated)


def _examined(root: str, candidates: list[tuple[str, str, str, int]]) -> set[str]:
    """The paths of the files to look into: all of them up to ``MAX_FILES``; beyond, those
    whose name or place says they are an input (an input kind's name, a log's name, a per-rank
    file of a launcher's layout) first, then the largest: a cap never hides the run's log
    behind thousands of small files that sort before it."""
    if len(candidates) <= MAX_FILES:
        return {path for path, _, _, _ in candidates}

    def order(candidate: tuple[str, str, str, int]) -> tuple[int, int, str]:
        path, _, name, size = candidate
        hinted = (
            kinds.kind_by_name(without_compression(name)) is not None
            or text_log_name(name)
            or location(os.path.relpath(path, root)).per_rank
        )
        return (0 if hinted else 1, -size, path)

    return {path for path, _, _, _ in sorted(candidates, key=order)[:MAX_FILES]}


def _why_not(detection: Detection) -> str:
    if detection.quoted_in is not None:
        return f"{detection.quoted_in} that quotes a log, not a log (name it to read it as one)"
    return detection.reason


def _layout(files: list[FoundInput]) -> str:
    if any(f.location.attempt is not None for f in files):
        return "torchrun_log_dir"
    if any(DEEPSPEED_RANK_LOG.fullmatch(os.path.basename(f.path)) for f in files):
        return "deepspeed_rank_logs"
    if any(f.location.rank is not None for f in files):
        return "rank_named_files"
    return "flat"


def _shown(shown_root: str, root: str, path: str) -> str:
    return os.path.join(shown_root, os.path.relpath(path, root))
