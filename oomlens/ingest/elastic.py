"""torchelastic ``error.json`` files (``TORCHELASTIC_ERROR_FILE``, written by ``@record``).

Two shapes (torch.distributed.elastic ``ProcessFailure._get_error_data``)::

    {"message": {"message": "<Class>: <text>",
                 "extraInfo": {"py_callstack": "...", "timestamp": "<epoch s>"}}}
    {"message": "<text>", "timestamp": <epoch s>}

``read_error_file(path, rank=None, local_rank=None)`` returns ``ErrorFileFacts``.  The
timestamp is converted with the local timezone, as torchrun does for its failure summaries,
so the two compare.  Raises InputError when the file cannot be read, is too large, is not
JSON, or has neither shape.
"""

from __future__ import annotations

import os
from datetime import datetime

from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts import SourceRef
from oomlens.facts.log import ErrorFileFacts, OomEvent, Phase, ProcessFailure, Traceback
from oomlens.ingest._jsonpos import NestingError, loads_bounded
from oomlens.ingest.log.torch_oom import parse_oom_message
from oomlens.ingest.log.traceback import TracebackAssembler, classify_phase
from oomlens.ingest.textstream import read_head

MAX_ERROR_FILE_BYTES = 16 * 1024 * 1024


def _timestamp(value: object) -> datetime | None:
    try:
        seconds = float(str(value))
        return datetime.fromtimestamp(seconds)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _traceback_of(callstack: str, path: str) -> Traceback | None:
    assembler = TracebackAssembler()
    found: Traceback | None = None
    for _number, line in enumerate(callstack.splitlines()[:5000], start=1):
        finished = assembler.feed(line, SourceRef(path, None))
        if finished is not None and finished.traceback is not None and found is None:
            found = finished.traceback
    finished = assembler.close()
    if found is None and finished is not None:
        found = finished.traceback
    return found


def read_error_file(
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    display: str | None = None,
) -> ErrorFileFacts:
    """Read one error.json; ``rank``/``local_rank`` come from its location (the
    ``attempt_N/<local_rank>/error.json`` directory), since the file does not say them."""
    shown = display if display is not None else os.fspath(path)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise InputError(shown, f"cannot be read ({exc.strerror or exc})") from exc
    if size > MAX_ERROR_FILE_BYTES:
        raise ResourceLimitError(
            shown,
            f"is {size} bytes, more than an error file can be",
            "pass the training log instead",
        )
    raw = read_head(path, MAX_ERROR_FILE_BYTES, display=shown)
    try:
        data = loads_bounded(raw.decode("utf-8", "replace"))
    except NestingError as exc:
        raise InputError(shown, f"is JSON {exc}", "pass the training log instead") from exc
    except ValueError as exc:
        raise InputError(shown, f"is not valid JSON ({exc})", "is the file complete?") from exc
    if not isinstance(data, dict) or "message" not in data:
        raise InputError(shown, "is JSON but not a torchelastic error file (no 'message')")
    message_field = data["message"]
    callstack = ""
    if isinstance(message_field, dict):
        message = str(message_field.get("message", ""))
        extra = (
            message_field.get("extraInfo")
            if isinstance(message_field.get("extraInfo"), dict)
            else {}
        )
        assert isinstance(extra, dict)
        callstack = str(extra.get("py_callstack", ""))
        when = _timestamp(extra.get("timestamp"))
    elif isinstance(message_field, str):
        message = message_field
        when = _timestamp(data.get("timestamp"))
    else:
        raise InputError(
            shown, "is not a torchelastic error file ('message' is neither text nor an object)"
        )
    source = SourceRef(shown, None, rank if rank is not None else local_rank, None)
    traceback = _traceback_of(callstack, shown) if callstack else None
    oom = parse_oom_message(message) or (parse_oom_message(callstack) if callstack else None)
    failure = ProcessFailure(
        source=source,
        origin="error_file",
        exitcode=None,
        signal=None,
        rank=rank,
        local_rank=local_rank,
        pid=None,
        host=None,
        timestamp=when,
        root_cause=False,
        error_file=shown,
        message=message[:2000],
        oom=oom,
    )
    event = None
    if oom is not None:
        phase, evidence = (
            classify_phase(traceback.frames) if traceback is not None else (Phase.UNKNOWN, None)
        )
        event = OomEvent(
            source, oom, phase, evidence, traceback, "error_file", when, True, local_rank
        )
    return ErrorFileFacts(shown, failure, event, traceback)
