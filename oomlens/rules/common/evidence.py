"""How rules cite what they rest on: quotes of log lines and messages, evidence built from
OOM events, snapshots, config values, kernel lines and captures, and sizes in words.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from oomlens.diagnosis import Evidence, EvidenceKind, Figure, in_bytes
from oomlens.facts import SourceRef
from oomlens.facts.capture import RankCapture
from oomlens.facts.config import ConfigValue
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import (
    ExceptionEvent,
    Frame,
    OomEvent,
    OomMessage,
    Phase,
)
from oomlens.facts.oom_balance import MessageBalance
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import SnapshotAnalysis
from oomlens.units import format_size

QUOTE_LIMIT = 400


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """A log line or message shortened for citation (the full text stays in the input)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def oom_figures(m: OomMessage) -> dict[str, Figure]:
    """The figures of an allocator OOM message, under the message's own names."""
    return {
        "tried_to_allocate": in_bytes(m.tried_to_allocate),
        "allocated_by_pytorch": in_bytes(m.allocated_by_pytorch),
        "reserved_unallocated": in_bytes(m.reserved_unallocated),
        "free": in_bytes(m.free),
        "total_capacity": in_bytes(m.total_capacity),
        "allowed": in_bytes(m.allowed),
        "process_in_use": in_bytes(m.process_in_use),
        "other_processes": in_bytes(m.other_processes_total),
    }


def oom_evidence(event: OomEvent, note: str = "") -> Evidence:
    kind = {"error_file": EvidenceKind.ERROR_FILE, "capture": EvidenceKind.CAPTURE}.get(
        event.origin, EvidenceKind.LOG
    )
    prefix = f"{event.message.exception_class}: " if event.message.exception_class else ""
    return Evidence(kind, quote(prefix + event.message.text), event.source, note, verbatim=True)


def as_printed(exception: ExceptionEvent) -> bool:
    """Whether ``exception_line`` of ``exception`` is its line as printed (a class put before a
    text that did not name it is not)."""
    return exception_line(exception) == exception.text


def exception_line(exception: ExceptionEvent) -> str:
    """The exception as printed, ``class: message``: its text, which starts with its class when
    it was read from an exception line; the class put before a text that does not name it (a
    C++ exception's ``what():``)."""
    cls, text = exception.exception_class, exception.text
    if not text:
        return cls
    if not cls or text == cls or text.startswith(cls + ":"):
        return text
    return f"{cls}: {text}"


def phase_evidence(facts: RunFacts, event: OomEvent) -> Evidence | None:
    """The frame (or line) that places ``event`` in a phase, as evidence; None when nothing
    does (``RunFacts.signals.place``)."""
    place = facts.signals.place(event)
    if place.phase is Phase.UNKNOWN or place.evidence is None:
        return None
    return Evidence(
        EvidenceKind.LOG,
        f"phase {place.phase.value}: {place.evidence}",
        place.site,
        "the traceback frame that places the failure",
    )


def size(num: int | float | None) -> str:
    return "unknown" if num is None else format_size(num)


def snapshot_evidence(
    snapshot: SnapshotAnalysis, text: str, note: str = "", *, supports: bool = True
) -> Evidence:
    return Evidence(EvidenceKind.SNAPSHOT, text, snapshot.source, note, supports)


def config_evidence(value: ConfigValue[Any], note: str = "") -> Evidence:
    return Evidence(EvidenceKind.CONFIG, value.cite(), value.source, note)


def kernel_kill_evidence(kill: KernelOomKill, note: str) -> Evidence:
    """The kernel's ``Killed process`` line as evidence (shmem-rss is where pinned pages show)."""
    scope = "Memory cgroup out of memory" if kill.cgroup else "Out of memory"
    return Evidence(
        EvidenceKind.KERNEL,
        f"{scope}: Killed process {kill.pid} ({kill.process_name}) anon-rss "
        f"{size(kill.anon_rss)}, shmem-rss {size(kill.shmem_rss)}",
        kill.source,
        note,
    )


def frame_site(event: OomEvent, frame: Frame) -> SourceRef:
    """Where ``frame`` of ``event``'s traceback was read (its ``File ...`` line); the
    traceback's start when that line is unknown (an error file's call stack, a capture)."""
    assert event.traceback is not None
    if frame.at is None:
        return event.traceback.source
    return replace(event.traceback.source, line=frame.at, rank=event.source.rank)


def capacity_evidence(event: OomEvent, n: OomMessage) -> Evidence:
    return oom_evidence(
        event,
        f"allocated {size(n.allocated_by_pytorch)} of {size(n.limit)} {n.limit_name}, only "
        f"{size(n.reserved_unallocated)} cached: the live tensors themselves filled the card",
    )


def leaf_key(value: ConfigValue[Any]) -> str:
    return value.key_path.rsplit(".", 1)[-1]


def captured_kill_evidence(capture: RankCapture, note: str) -> Evidence:
    """A captured rank that vanished while its cgroup counted an OOM kill, with its last host
    sample (what it held when it was killed)."""
    gone = capture.gone
    who = f"rank {capture.rank}" if capture.rank is not None else "the process"
    text = (
        f"{who} (pid {capture.pid}) disappeared without an exit record; the cgroup's "
        f"memory.events oom_kill went {gone.oom_kill_before} -> {gone.oom_kill_after}"
        if gone is not None
        else f"{who} disappeared without an exit record"
    )
    host = capture.host_memory
    last = host.last if host is not None else None
    if last is not None:
        parts = [f"RSS {size(last.rss)}"]
        if last.rss_shmem:
            parts.append(f"shared (pinned) {size(last.rss_shmem)}")
        if last.cgroup_current is not None and last.cgroup_max:
            parts.append(f"cgroup {size(last.cgroup_current)} of {size(last.cgroup_max)}")
        text += "; last sample: " + ", ".join(parts)
    return Evidence(
        EvidenceKind.CAPTURE, text, gone.source if gone is not None else capture.source, note
    )


def oversized_evidence(event: OomEvent) -> Evidence:
    n = event.message
    return Evidence(
        EvidenceKind.DERIVED,
        f"the request ({size(n.tried_to_allocate)}) is larger than the whole card "
        f"({size(n.total_capacity)})",
        event.source,
        "no batch size or memory setting makes room for it: not a lack of memory",
        supports=False,
    )


def self_listed_evidence(event: OomEvent, b: MessageBalance) -> Evidence | None:
    """A listed ``Process N`` that is this job seen from a container, with the arithmetic."""
    if b.self_listed is None or b.reserved is None:
        return None
    return Evidence(
        EvidenceKind.DERIVED,
        f"process {b.self_listed.pid} holds {size(b.self_listed.bytes)}: this process' allocator "
        f"reserved {size(b.reserved)} (allocated {size(b.allocated)} + reserved but unallocated "
        f"{size(b.message.reserved_unallocated)}) and the message has no 'this process has' "
        "clause",
        event.source,
        "that process is this job itself under its host pid (a container), not another one",
    )
