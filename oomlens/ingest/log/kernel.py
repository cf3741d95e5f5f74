"""Kernel and scheduler lines: the OOM killer, cgroup limits, slurm's oom-kill events, fatal
signals.  Usable on lines inside training logs and on separate kernel logs.

``parse_kernel_line(text, ref, year)`` returns the event a line holds (or None);
``read_kernel_log(path)`` reads a whole kernel log (``dmesg``, ``dmesg -T``,
``journalctl -k``) into ``KernelLogFacts``.  The leading dmesg/journal stamp is removed
before matching and kept as the event's time (``[  123.45]`` as ``uptime_seconds``).
"""

from __future__ import annotations

import os
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.kernel import (
    FatalSignalKind,
    FatalSignalLine,
    KernelEvent,
    KernelLogFacts,
    KernelOomKill,
    OomKillerInvoked,
    SlurmOomKill,
)
from oomlens.ingest.log import timestamps
from oomlens.ingest.textstream import open_text
from oomlens.lazyregex import lazy_regex

ANCHORS: tuple[bytes, ...] = (
    b"Killed",
    b"oom-kill",
    b"oom_kill",
    b"srun: error",
    b"CANCELLED AT",
    b"Bus error",
    b"Aborted",
    b"Segmentation fault",
    b"shared memory",
    b"/dev/shm",
)
"""Literals one of which every line ``parse_kernel_line`` understands holds (no anchor starts
with a common byte such as a space: the multi-pattern search stays fast)."""

_UPTIME = lazy_regex(r"\[\s{0,12}(\d{1,10}\.\d{1,9})\] ")
_DMESG_T = lazy_regex(r"\[\w{3} \w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4}\] ")
_DMESG_ISO = lazy_regex(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d{1,9}(?:[+-]\d\d:?\d\d|Z)? ")
_JOURNAL = lazy_regex(
    r"(?:\w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:[+-]"
    r"\d\d:?\d\d|Z)?) "
    r"\S{1,255} kernel: (?:\[\s{0,12}\d{1,10}\.\d{1,9}\] )?"
)
_KILLED = lazy_regex(
    r"(?P<cg>Memory cgroup out of memory: )?(?:Out of memory(?: \(oom_kill_allocating_task\))?: )?"
    r"Killed process (?P<pid>\d{1,10}) \((?P<name>[^)\n]{0,64})\)"
    r"(?:,? total-vm:(?P<vm>\d{1,15})kB, anon-rss:(?P<anon>\d{1,15})kB, file-rss:(?P<file>\d{1,15"
    r"})kB"
    r"(?:, shmem-rss:(?P<shmem>\d{1,15})kB)?)?"
)
_CONSTRAINT = lazy_regex(r"oom-kill:constraint=(?P<constraint>\w{1,40})(?P<rest>[^\n]{0,2000})")
_KV = lazy_regex(r",(oom_memcg|task|pid)=([^,\s]{0,500})")
_INVOKED = lazy_regex(r"(?P<name>\S{1,64}) invoked oom-killer: ")
_SLURM_EVENTS = lazy_regex(
    r"Detected (?P<n>\d{1,9}) oom[-_]kill events?(?:\(s\))? in (?:step |StepId=)?"
    r"(?P<step>[\w+-]{1,40}(?:\.[\w+-]{1,40}){0,3})"
)
_SRUN_TASK = lazy_regex(
    r"srun: error: (?P<node>\S{1,255}): tasks? (?P<task>\d{1,7})(?:[-,\d]{0,200})?: Out Of Memory"
)
_SLURM_CANCELLED = lazy_regex(
    r"\*\*\* ?(?:JOB|STEP) [\w.+-]{1,60}(?: ON \S{1,255})? CANCELLED AT \S{1,40}"
    r"(?: DUE TO [A-Z][A-Z ]{0,40}?)? ?\*\*\*"
)
_SRUN_EXITED = lazy_regex(
    r"srun: error: \S{1,255}: tasks? [\d,-]{1,200}: Exited with exit code \d{1,3}"
)
_BUS = lazy_regex(r"(?:^|\s|:)Bus error\b")
_SHELL_KILLED = lazy_regex(r"(?:^[ \t]{0,16}|: |\d |\] ?|\| ?|it/s\]|s/it\])Killed(?:\s|\Z)")
"""The shell's report of a child killed by SIGKILL; indented when the log was pasted indented."""
_ABORTED = lazy_regex(r"(?:^|: |\d )Aborted(?: \(core dumped\))?(?:\s|\Z)")
_SEGV = lazy_regex(r"(?:^|: |\d )Segmentation fault(?: \(core dumped\))?(?:\s|\Z)")
_SHM = lazy_regex(
    r"insufficient shared memory|shared memory segment /dev/shm|/dev/shm[^\n]{0,120}No space left"
    r" on device|"
    r"No space left on device[^\n]{0,120}/dev/shm|"
    r"Error while creating shared memory segment|posix_fallocate failed[^\n]{0,40}No space left"
)


def _kib(value: str | None) -> int | None:
    return int(value) * 1024 if value is not None else None


def strip_kernel_stamp(text: str, year: int | None) -> tuple[str, datetime | None, float | None]:
    """``(rest, time, uptime_seconds)`` after a leading dmesg/journal stamp, if any."""
    when: datetime | None = None
    uptime: float | None = None
    match = _JOURNAL.match(text)
    if match is not None:
        when, _ = timestamps.leading_timestamp(text, year)
        rest = text[match.end() :]
        stamp = _UPTIME.search(match.group(0))
        if stamp is not None:
            uptime = float(stamp.group(1))
        return rest, when, uptime
    match = _DMESG_T.match(text)
    if match is not None:
        when, _ = timestamps.leading_timestamp(text, year)
        return text[match.end() :], when, None
    match = _DMESG_ISO.match(text)
    if match is not None:
        when, _ = timestamps.leading_timestamp(text, year)
        return text[match.end() :], when, None
    match = _UPTIME.match(text)
    if match is not None:
        return text[match.end() :], None, float(match.group(1))
    return text, None, None


def parse_kernel_line(text: str, ref: SourceRef, year: int | None = None) -> KernelEvent | None:
    """The kernel/scheduler event ``text`` holds, or None."""
    body, when, uptime = strip_kernel_stamp(text, year)
    if "Killed process" in body:
        match = _KILLED.search(body)
        if match is not None:
            return KernelOomKill(
                source=ref,
                pid=int(match.group("pid")),
                process_name=match.group("name"),
                cgroup=match.group("cg") is not None,
                total_vm=_kib(match.group("vm")),
                anon_rss=_kib(match.group("anon")),
                file_rss=_kib(match.group("file")),
                shmem_rss=_kib(match.group("shmem")),
                timestamp=when,
                uptime_seconds=uptime,
            )
    if "oom-kill" in body or "oom_kill" in body:
        match = _CONSTRAINT.search(body)
        if match is not None:
            values = dict(_KV.findall(match.group("rest")))
            pid = values.get("pid")
            return OomKillerInvoked(
                ref,
                None,
                match.group("constraint"),
                values.get("oom_memcg"),
                values.get("task"),
                int(pid) if pid and pid.isdigit() else None,
                when,
            )
        match = _INVOKED.search(body)
        if match is not None:
            return OomKillerInvoked(ref, match.group("name"), None, None, None, None, when)
        match = _SLURM_EVENTS.search(body)
        if match is not None:
            return SlurmOomKill(ref, int(match.group("n")), match.group("step"), None, None, when)
    if "Out Of Memory" in body:
        match = _SRUN_TASK.search(body)
        if match is not None:
            return SlurmOomKill(
                ref, None, None, match.group("node"), int(match.group("task")), when
            )
    kind: FatalSignalKind | None = None
    if "CANCELLED AT" in body and _SLURM_CANCELLED.search(body):
        kind = FatalSignalKind.SCHEDULER_CANCELLED
    elif "srun: error" in body and _SRUN_EXITED.search(body):
        kind = FatalSignalKind.TASK_EXITED
    elif _SHM.search(body):
        kind = FatalSignalKind.SHM_EXHAUSTED
    elif "Bus error" in body and _BUS.search(body):
        kind = FatalSignalKind.SIGBUS
    elif "Killed" in body and len(body) < 400 and _SHELL_KILLED.search(body):
        kind = FatalSignalKind.SIGKILL
    elif "Aborted" in body and len(body) < 400 and _ABORTED.search(body):
        kind = FatalSignalKind.SIGABRT
    elif "Segmentation fault" in body and len(body) < 400 and _SEGV.search(body):
        kind = FatalSignalKind.SIGSEGV
    if kind is not None:
        return FatalSignalLine(ref, kind, body[:500], when)
    return None


MAX_KERNEL_EVENTS = 2000


def read_kernel_log(path: str | os.PathLike[str], *, display: str | None = None) -> KernelLogFacts:
    """Every OOM kill, oom-killer invocation, slurm oom event and fatal signal of a kernel log.

    Streams the file; keeps at most ``MAX_KERNEL_EVENTS`` events (counting the rest).
    Raises InputError when the file cannot be opened.
    """
    source = open_text(path, display=display)
    shown = source.display
    try:
        year: int | None = datetime.fromtimestamp(os.stat(path).st_mtime).year
    except OSError:  # pragma: no cover - the file was just opened
        year = None
    kills: list[KernelOomKill] = []
    invocations: list[OomKillerInvoked] = []
    slurm: list[SlurmOomKill] = []
    fatal: list[FatalSignalLine] = []
    dropped = 0
    kept = 0
    for number, text in source.lines():
        if not any(anchor in text for anchor in _TEXT_ANCHORS):
            continue
        event = parse_kernel_line(text, SourceRef(shown, number), year)
        if event is None:
            continue
        if kept >= MAX_KERNEL_EVENTS:
            dropped += 1
            continue
        kept += 1
        if isinstance(event, KernelOomKill):
            kills.append(event)
        elif isinstance(event, OomKillerInvoked):
            invocations.append(event)
        elif isinstance(event, SlurmOomKill):
            slurm.append(event)
        else:
            fatal.append(event)
    return KernelLogFacts(
        shown,
        source.stats.lines,
        tuple(kills),
        tuple(invocations),
        tuple(slurm),
        tuple(fatal),
        dropped,
    )


_TEXT_ANCHORS = tuple(anchor.decode() for anchor in ANCHORS)
