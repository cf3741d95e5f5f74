"""torch.distributed.elastic (torchrun) and torch.multiprocessing lines, and the signs that a
rank is failing because a peer died.

* agent lines (all generations): ``failed (exitcode: -9) local_rank: 1 (pid: 2306) of
  binary: ...``, ``Sending process 2305 closing signal SIGTERM``;
* ``torch.multiprocessing.spawn``: ``process 0 terminated with signal SIGKILL`` /
  ``... with exit code 1``;
* the ``ChildFailedError`` block (``FailureBlockParser``): ``<script> FAILED``, each failure's
  time, host, rank, local rank, exit code, pid, error file and traceback, and which is the
  root cause (first observed);
* peer-failure lines: NCCL watchdog timeouts, ``DistBackendError`` aborts, lost connections.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.log import FailureSummary, ProcessFailure
from oomlens.ingest.log import timestamps
from oomlens.ingest.log.torch_oom import parse_oom_message
from oomlens.lazyregex import lazy_regex

AGENT_ANCHORS: tuple[bytes, ...] = (b"failed (exitcode", b"closing signal", b"terminated with")
SUMMARY_ANCHORS: tuple[bytes, ...] = (b"ChildFailedError",)
PEER_ANCHORS: tuple[bytes, ...] = (
    b"atchdog",
    b"DistBackendError",
    # (``terminate called after throwing`` is the reader's terminate anchor, which carries the
    # peer bit too)
    b"by peer",
    b"Broken pipe",
    b"remote process exited",
    b"ncclRemoteError",
    b"DistNetworkError",
    b"DistStoreError",
    b"communicator was aborted",
    b"Heartbeat monitor",
)
ANCHORS: tuple[bytes, ...] = AGENT_ANCHORS + SUMMARY_ANCHORS + PEER_ANCHORS

_AGENT_FAILED = lazy_regex(
    r"failed \(exitcode: (?P<code>-?\d{1,6})\) local_rank: (?P<lr>\d{1,6}) \(pid: (?P<pid>\d{1,10"
    r"})\)"
)
_CLOSING = lazy_regex(
    r"Sending process (?P<pid>\d{1,10}) closing signal (?P<sig>SIG[A-Z0-9]{1,10})"
)
_SPAWN = lazy_regex(
    r"process (?P<idx>\d{1,6}) terminated with (?:signal (?P<sig>SIG[A-Z0-9]{1,10})|exit code (?P"
    r"<code>-?\d{1,6}))"
)
_PEER = (
    ("watchdog_timeout", lazy_regex(r"Watchdog caught collective operation timeout")),
    (
        "watchdog_exception",
        lazy_regex(r"detected by watchdog|watchdog got stuck|Heartbeat monitor timed out"),
    ),
    (
        "terminate_dist_backend",
        lazy_regex(r"terminate called after throwing an instance of 'c10::DistBackendError'"),
    ),
    (
        "connection_lost",
        lazy_regex(
            r"Connection reset by peer|Broken pipe|remote process exited|closed by peer|ncclRemot"
            r"eError|"
            r"DistNetworkError|DistStoreError"
        ),
    ),
    ("nccl_error", lazy_regex(r"NCCL communicator was aborted|DistBackendError")),
)
_RANK_IN_TEXT = lazy_regex(r"\bRank (\d{1,6})\]")


def signal_name(exitcode: int | None) -> str | None:
    """``SIGKILL`` for ``-9`` (and for a shell's ``137``); None for a normal exit code."""
    if exitcode is None:
        return None
    number = -exitcode if exitcode < 0 else (exitcode - 128 if 128 < exitcode < 160 else 0)
    if number <= 0:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True, slots=True)
class AgentLine:
    """``kind``: ``failed`` (exitcode, local_rank, pid), ``closing`` (pid, signal),
    ``spawn`` (index as local_rank, signal or exitcode)."""

    kind: str
    exitcode: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    signal: str | None = None


def parse_agent_line(text: str) -> AgentLine | None:
    match = _AGENT_FAILED.search(text)
    if match is not None:
        code = int(match.group("code"))
        return AgentLine(
            "failed", code, int(match.group("lr")), int(match.group("pid")), signal_name(code)
        )
    match = _CLOSING.search(text)
    if match is not None:
        return AgentLine("closing", pid=int(match.group("pid")), signal=match.group("sig"))
    match = _SPAWN.search(text)
    if match is not None:
        spawn_code = int(match.group("code")) if match.group("code") else None
        sig = match.group("sig") or signal_name(spawn_code)
        return AgentLine("spawn", spawn_code, int(match.group("idx")), None, sig)
    return None


def parse_peer_failure(text: str) -> tuple[str, int | None] | None:
    """``(kind, rank named in the text)`` when the line says a collective failed because of a
    peer; see ``PeerFailureSignal`` for the kinds."""
    for kind, pattern in _PEER:
        if pattern.search(text) is not None:
            rank = _RANK_IN_TEXT.search(text)
            return kind, int(rank.group(1)) if rank else None
    return None


_RULE = lazy_regex(r"[=]{10,}\s*\Z")
_SECTION = lazy_regex(r"[-]{10,}\s*\Z")
_ENTRY = lazy_regex(r"\[(\d{1,6})\]:\s*\Z")
_FIELD = lazy_regex(r"  (time|host|rank|exitcode|error_file|traceback)\s{0,12}: ?(.*)\Z")
_RANK_FIELD = lazy_regex(r"(-?\d{1,6}) \(local_rank: (-?\d{1,6})\)")
_EXIT_FIELD = lazy_regex(r"(-?\d{1,6}) \(pid: (\d{1,10})\)")
_SIGNAL_TEXT = lazy_regex(r"Signal (\d{1,3}) \((SIG[A-Z0-9]{1,10}|<N/A>)\) received by PID")
_NO_ERROR_FILE = lazy_regex(r"To enable traceback see:? \S{0,200}elastic/errors\.html\s*\Z")
MAX_BLOCK_LINES = 4000
MAX_FAILURES = 1024
MAX_TRACEBACK_LINES = 400


_TABLE_START = lazy_regex(
    r"\s{0,8}(?:Root Cause \(first observed failure\):|[\w./-]{1,200} FAILED)\s{0,8}\Z"
)


def starts_failure_table(text: str) -> bool:
    """A line of torchrun's failure table that a paste can start with (its title or its root
    cause header), without the ``ChildFailedError:`` line before it."""
    return _TABLE_START.match(text) is not None


class FailureBlockParser:
    """Parses the lines after ``ChildFailedError:`` into a ``FailureSummary``.

    Feed each following line of the agent's stream; ``feed`` returns True while the line
    belongs to the block.  ``finish()`` builds the summary (``complete`` False when the block
    was cut or malformed).
    """

    def __init__(self, source: SourceRef, *, headless: bool = False) -> None:
        self.source = source
        self.title: str | None = None
        self.failures: list[ProcessFailure] = []
        self._rules = 1 if headless else 0
        """A paste that starts inside the table has lost its first rule."""
        self._sections = 0
        self._root = False
        self._fields: dict[str, str] | None = None
        self._traceback: list[str] = []
        self._in_traceback = False
        self._entry_line: int | None = None
        self._lines = 0
        self.complete = False
        self.done = False

    def feed(self, text: str, line: int | None) -> bool:
        if self.done:
            return False
        self._lines += 1
        if self._lines > MAX_BLOCK_LINES:
            self._close_entry()
            self.done = True
            return False
        stripped = text.strip()
        if _RULE.match(stripped):
            self._rules += 1
            if self._rules >= 2:
                self._close_entry()
                self.complete = True
                self.done = True
            return True
        if self._rules == 0:
            if not stripped:
                return True
            self.done = True  # no block after all
            return False
        if _SECTION.match(stripped):
            self._close_entry()
            self._sections += 1
            return True
        if self.title is None and stripped.endswith(" FAILED"):
            self.title = stripped[: -len(" FAILED")]
            return True
        if stripped in ("Failures:", "<NO_OTHER_FAILURES>"):
            return True
        if stripped == "Root Cause (first observed failure):":
            self._close_entry()
            self._root = True
            return True
        entry = _ENTRY.match(stripped)
        if entry is not None:
            self._close_entry()
            self._fields = {}
            self._entry_line = line
            return True
        if self._fields is not None:
            field = _FIELD.match(text)
            if field is not None and not (self._in_traceback and text.startswith("    ")):
                self._in_traceback = field.group(1) == "traceback"
                if self._in_traceback:
                    self._traceback = [field.group(2)]
                else:
                    self._fields[field.group(1)] = field.group(2).strip()
                return True
            if self._in_traceback:
                if len(self._traceback) < MAX_TRACEBACK_LINES:
                    self._traceback.append(text[2:] if text.startswith("  ") else text)
                return True
        self._close_entry()
        self.done = True
        return False

    def _close_entry(self) -> None:
        fields, self._fields = self._fields, None
        traceback_lines, self._traceback = self._traceback, []
        self._in_traceback = False
        if fields is None or len(self.failures) >= MAX_FAILURES:
            return
        rank = local_rank = exitcode = pid = None
        rank_match = _RANK_FIELD.match(fields.get("rank", ""))
        if rank_match is not None:
            rank, local_rank = int(rank_match.group(1)), int(rank_match.group(2))
        exit_match = _EXIT_FIELD.match(fields.get("exitcode", ""))
        if exit_match is not None:
            exitcode, pid = int(exit_match.group(1)), int(exit_match.group(2))
        traceback_text = "\n".join(traceback_lines).strip()
        signal_text = _SIGNAL_TEXT.search(traceback_text)
        signal = signal_name(exitcode)
        if signal_text is not None and signal_text.group(2) != "<N/A>":
            signal = signal_text.group(2)
        message = next((ln.strip() for ln in reversed(traceback_lines) if ln.strip()), None)
        # torch's ProcessFailure makes this text up when the worker left no error file (its
        # entry point was not decorated with @record): a pointer to the docs, not the error
        unrecorded = _NO_ERROR_FILE.match(traceback_text) is not None
        if unrecorded or _cut_in_a_frame(traceback_text):
            # no exception line: the worker's error is not in this text (the entry was cut,
            # or the paste stops inside the traceback)
            message = None
        error_file = fields.get("error_file")
        self.failures.append(
            ProcessFailure(
                source=SourceRef(self.source.path, self._entry_line, rank, fields.get("host")),
                origin="torchrun_summary",
                exitcode=exitcode,
                signal=signal if exitcode is None or exitcode < 0 or exitcode > 128 else None,
                rank=rank,
                local_rank=local_rank,
                pid=pid,
                host=fields.get("host"),
                timestamp=_summary_time(fields.get("time", "")),
                root_cause=self._root,
                error_file=None if error_file in (None, "<N/A>") else error_file,
                message=message[:2000] if message else None,
                oom=parse_oom_message(traceback_text) if traceback_text else None,
                unrecorded=unrecorded,
            )
        )

    def finish(self) -> FailureSummary:
        self._close_entry()
        self.done = True
        return FailureSummary(self.source, self.title, tuple(self.failures), self.complete)


_FRAME_LINE = lazy_regex(r'^\s*File "[^"]*"(?:, line \d+)?(?:, in \S+)?\s*$|^\s*File "[^"]*$')
_EXCEPTION_LINE = lazy_regex(r"^\s*[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b")


def _cut_in_a_frame(traceback_text: str) -> bool:
    """The quoted traceback stops at a frame (``File "...", line N, in f``) or its source
    line, before its exception line: a traceback's last line is the exception when it is
    complete."""
    if "Traceback (most recent call last)" not in traceback_text:
        return False
    # Python 3.11+ marks the failing expression under a source line with ^ and ~
    lines = [ln for ln in traceback_text.splitlines() if ln.strip().strip("^~")]
    if not lines:
        return False
    last = lines[-1]
    if _FRAME_LINE.match(last):
        return True
    # a source line under a frame: the line before it is the frame
    return (
        len(lines) >= 2
        and _FRAME_LINE.match(lines[-2]) is not None
        and _EXCEPTION_LINE.match(last) is None
    )


def _summary_time(text: str) -> datetime | None:
    return timestamps.parse_any(text)
