"""The per-rank picture of a failed run: who failed, how, who failed first, who only died
because a peer did.

``rank_picture(logs, error_files=(), kernel_logs=())`` combines the facts of every log of a
run (one merged log, or one file per rank), torchelastic error files and kernel logs.

How ranks are judged:

* a rank *failed on its own* when it has an OOM event, a non-peer exception, a launcher
  report of a non-zero exit or a signal other than SIGTERM, or a kernel OOM kill of its pid;
* a rank *died because of a peer* when all it shows is what launchers and NCCL do to the
  survivors: SIGTERM (-15) from torchrun or the DeepSpeed launcher (``Sending process ...
  closing signal``, ``Killing subprocess``), NCCL watchdog timeouts, ``DistBackendError``,
  lost connections, an abort on ``c10::DistBackendError`` (-6 after a watchdog);
* the *first* failure is decided by the failure times when every own failure has one
  (``basis="timestamp"``: DeepSpeed/c10/agent times, torchrun's per-failure time, error-file
  times), else by torchrun's ``Root Cause (first observed failure)`` (``"root_cause"``), else
  by line order within one file (``"line_order"``).  Ranks whose earliest times are equal
  (``same_time``) are not ordered by time: the other bases decide among them, or none does;
* a suspected straggler (the rank the others timed out waiting for) is never also a peer
  victim, and output that names no rank is never listed as one.

OOM events printed without any rank (plain ``torchrun`` without ``--tee``) are attributed to
the single rank that failed on its own, when exactly one did (``attributed=True``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.capture import RankCapture
from oomlens.facts.kernel import KernelLogFacts, KernelOomKill
from oomlens.facts.log import (
    ErrorFileFacts,
    ExceptionEvent,
    LogFacts,
    OomEvent,
    ProcessFailure,
)
from oomlens.facts.ranks import RankPicture, RankStatus

_PEER_SIGNALS = frozenset({"SIGTERM"})


@dataclass(slots=True)
class _Builder:
    rank: int | None
    ooms: list[OomEvent] = field(default_factory=list)
    exceptions: list[ExceptionEvent] = field(default_factory=list)
    failures: list[ProcessFailure] = field(default_factory=list)
    kills: list[KernelOomKill] = field(default_factory=list)
    peer_evidence: list[tuple[SourceRef, str]] = field(default_factory=list)
    attributed: bool = False
    captured_kill: RankCapture | None = None


def _rank_of_failure(failure: ProcessFailure) -> int | None:
    return failure.rank if failure.rank is not None else failure.local_rank


def rank_picture(
    logs: Sequence[LogFacts],
    error_files: Sequence[ErrorFileFacts] = (),
    kernel_logs: Sequence[KernelLogFacts] = (),
    captures: Sequence[RankCapture] = (),
) -> RankPicture:
    builders: dict[int | None, _Builder] = {}

    def builder(rank: int | None) -> _Builder:
        found = builders.get(rank)
        if found is None:
            found = builders[rank] = _Builder(rank)
        return found

    pid_rank: dict[int, int | None] = {}
    kernel_kills: list[KernelOomKill] = [k for facts in kernel_logs for k in facts.oom_kills]
    for facts in logs:
        for event in facts.oom_events:
            ooms = builder(event.source.rank).ooms
            # torchrun --tee writes each rank's output twice: to the console log and to the
            # rank's own file; the same message from another file is the same OOM
            if not any(
                seen.message.text == event.message.text and seen.source.path != event.source.path
                for seen in ooms
            ):
                ooms.append(event)
        for exception in facts.exceptions:
            if exception.exception_class.endswith("ChildFailedError"):
                continue  # the agent's own report, not a rank's
            builder(exception.source.rank).exceptions.append(exception)
        for failure in facts.process_failures:
            rank = _rank_of_failure(failure)
            builder(rank).failures.append(failure)
            if failure.pid is not None:
                pid_rank[failure.pid] = rank
        for peer in facts.peer_failures:
            if peer.source.rank is not None:
                builder(peer.source.rank).peer_evidence.append((peer.source, peer.kind))
        for killed in facts.killed_subprocesses:
            if killed.local_rank is not None:
                # the launcher names every local rank's pid when it kills them: the kernel's
                # OOM-kill lines name pids too
                pid_rank.setdefault(killed.pid, killed.local_rank)
                builder(killed.local_rank).peer_evidence.append(
                    (killed.source, "killed_by_launcher")
                )
        for closing in facts.closing_signals:
            rank = (
                closing.local_rank if closing.local_rank is not None else pid_rank.get(closing.pid)
            )
            if rank is not None:
                builder(rank).peer_evidence.append(
                    (closing.source, f"{closing.signal}_from_launcher")
                )
        kernel_kills.extend(facts.kernel_oom_kills)
    for error_file in error_files:
        rank = _rank_of_failure(error_file.failure)
        builder(rank).failures.append(error_file.failure)
        quoted = error_file.oom_event
        if quoted is not None and not any(
            seen.message.text == quoted.message.text for seen in builder(rank).ooms
        ):
            # the error file repeats the OOM its rank printed; keep it only when it was not seen
            builder(rank).ooms.append(quoted)
    for capture in captures:
        _add_capture(builder(capture.rank), capture, pid_rank, builders.get(None))
    for kill in kernel_kills:
        if kill.pid in pid_rank:
            builder(pid_rank[kill.pid]).kills.append(kill)

    single_process = (
        set(builders) == {None}
        and len(captures) <= 1
        and not any(facts.ranks_seen for facts in logs)
        and not any(facts.world_size is not None and facts.world_size.value != 1 for facts in logs)
    )
    if single_process:
        # No launcher, no rank anywhere: the one process there was is rank 0.
        only = builders.pop(None)
        only.rank = 0
        only.attributed = bool(only.ooms or only.exceptions or only.failures or only.kills)
        builders[0] = only
    statuses = {rank: _status(b) for rank, b in builders.items()}
    # Unranked OOMs go to the single rank that failed on its own, if exactly one did.
    unranked = builders.get(None)
    own = [r for r, s in statuses.items() if r is not None and s.own_failure]
    if unranked is not None and unranked.ooms and len(own) == 1 and not builders[own[0]].ooms:
        target = builders[own[0]]
        target.ooms.extend(unranked.ooms)
        target.attributed = True
        unranked.ooms.clear()
        statuses[own[0]] = _status(target)
        statuses[None] = _status(unranked)
    ranks = tuple(
        status
        for _, status in sorted(statuses.items(), key=lambda item: (item[0] is None, item[0] or 0))
        if status.outcome != "unknown" or status.oom_events or status.failures
    )
    first, basis, same_time = _first_failed([s for s in ranks if s.own_failure], builders)
    exits = tuple(e for facts in logs for e in facts.launcher_exits)
    timed_out = sorted(
        {
            p.source.rank
            for facts in logs
            for p in facts.peer_failures
            if p.kind == "watchdog_timeout" and p.source.rank is not None
        }
    )
    seen = {rank for facts in logs for rank in facts.ranks_seen}
    stragglers = sorted(seen - set(timed_out)) if timed_out and first is None else []
    # the rank the others waited for was torn down with them, but it is the suspect, not a
    # victim; output that names no rank is no rank at all
    victims = tuple(
        s.rank
        for s in ranks
        if s.died_because_of_peer and s.rank is not None and s.rank not in stragglers
    )
    return RankPicture(
        ranks,
        first,
        basis,
        victims,
        tuple(timed_out),
        tuple(stragglers),
        exits,
        unranked_run=single_process,
        same_time=same_time,
    )


def _message_key(event: OomEvent) -> str:
    return " ".join(event.message.text.split())[:300]


def _add_capture(
    b: _Builder,
    capture: RankCapture,
    pid_rank: dict[int, int | None],
    unranked: _Builder | None,
) -> None:
    """What the capture of this rank recorded, unless its log already said it.  The log's
    copy of an OOM stays the cited one; the capture adds its rank and time when the log had
    none."""
    if capture.pid is not None:
        pid_rank.setdefault(capture.pid, capture.rank)
    for event in capture.oom_events:
        key = _message_key(event)
        same = [i for i, e in enumerate(b.ooms) if _message_key(e) == key]
        if same:
            logged = b.ooms[same[0]]
            if logged.timestamp is None and event.timestamp is not None:
                b.ooms[same[0]] = replace(
                    logged, timestamp=event.timestamp, timestamp_exact=event.timestamp_exact
                )
            continue
        loose = (
            []
            if unranked is None
            else [i for i, e in enumerate(unranked.ooms) if _message_key(e) == key]
        )
        if loose and unranked is not None:
            logged = unranked.ooms.pop(loose[0])
            b.ooms.append(
                replace(
                    logged,
                    source=replace(logged.source, rank=capture.rank),
                    phase_source=None
                    if logged.phase_source is None
                    else replace(logged.phase_source, rank=capture.rank),
                    timestamp=logged.timestamp or event.timestamp,
                    timestamp_exact=logged.timestamp_exact
                    if logged.timestamp
                    else event.timestamp_exact,
                )
            )
            b.attributed = True
        else:
            b.ooms.append(event)
    known = {(e.exception_class, " ".join(e.text.split())[:300]) for e in b.exceptions}
    b.exceptions.extend(
        e
        for e in capture.exceptions
        if (e.exception_class, " ".join(e.text.split())[:300]) not in known
    )
    if capture.killed_for_memory:
        b.captured_kill = capture


def _earliest(
    times: Iterable[tuple[datetime | None, SourceRef]],
) -> tuple[datetime | None, SourceRef | None]:
    known = [(t, ref) for t, ref in times if t is not None]
    if known:
        return min(known, key=lambda item: item[0])
    refs = [ref for _, ref in times]
    return None, (refs[0] if refs else None)


def _status(b: _Builder) -> RankStatus:
    own_exceptions = [e for e in b.exceptions if not e.peer_failure]
    peer_exceptions = [e for e in b.exceptions if e.peer_failure]
    bad_failures = [
        f
        for f in b.failures
        if f.signal not in _PEER_SIGNALS and (f.exitcode or 0) != 0 or f.origin == "error_file"
    ]
    peer_failures = [f for f in b.failures if f.signal in _PEER_SIGNALS]
    exitcode = next((f.exitcode for f in bad_failures if f.exitcode is not None), None)
    signal = next((f.signal for f in bad_failures if f.signal is not None), None)
    if exitcode is None and peer_failures:
        exitcode, signal = peer_failures[0].exitcode, peer_failures[0].signal
    aborted_by_watchdog = signal == "SIGABRT" and bool(peer_exceptions or b.peer_evidence)
    if b.ooms:
        outcome = "oom"
    elif b.kills or b.captured_kill is not None:
        outcome = "host_oom_kill"
    elif own_exceptions:
        outcome = "exception"
    elif bad_failures and not aborted_by_watchdog:
        outcome = "signal" if signal is not None else "exit_code"
    elif peer_failures or peer_exceptions or b.peer_evidence or aborted_by_watchdog:
        outcome = "peer_failure"
    else:
        outcome = "unknown"
    own_failure = outcome in ("oom", "host_oom_kill", "exception", "signal", "exit_code")
    evidence_times: list[tuple[datetime | None, SourceRef]] = []
    if own_failure:
        evidence_times += [(e.timestamp, e.source) for e in b.ooms]
        evidence_times += [(e.timestamp, e.source) for e in own_exceptions]
        evidence_times += [(f.timestamp, f.source) for f in bad_failures]
        evidence_times += [(k.timestamp, k.source) for k in b.kills]
        if b.captured_kill is not None and b.captured_kill.gone is not None:
            gone = b.captured_kill.gone
            evidence_times.append((gone.timestamp, gone.source))
    first_time, first_source = _earliest(evidence_times)
    peer_text = None
    if not own_failure:
        if peer_failures:
            failure = peer_failures[0]
            peer_text = f"{failure.signal} from the launcher ({failure.source.describe()})"
        elif b.peer_evidence:
            ref, kind = b.peer_evidence[0]
            peer_text = f"{kind} ({ref.describe()})"
        elif peer_exceptions:
            peer_text = (
                f"{peer_exceptions[0].exception_class} ({peer_exceptions[0].source.describe()})"
            )
    return RankStatus(
        rank=b.rank,
        outcome=outcome,
        own_failure=own_failure,
        died_because_of_peer=outcome == "peer_failure",
        peer_evidence=peer_text,
        first_time=first_time,
        first_source=first_source,
        exitcode=exitcode,
        signal=signal,
        oom_events=tuple(b.ooms),
        exceptions=tuple(b.exceptions),
        failures=tuple(b.failures),
        kernel_kills=tuple(b.kills),
        attributed=b.attributed,
        captured_kill=b.captured_kill,
    )


def _first_failed(
    own: list[RankStatus], builders: dict[int | None, _Builder]
) -> tuple[RankStatus | None, str | None, tuple[int, ...]]:
    """The first failed rank, how that was decided, and the ranks that failed at the very
    same earliest time when there are several (time cannot order them: the other bases do)."""
    if not own:
        return None, None, ()
    if len(own) == 1:
        return own[0], "only_one", ()
    same_time: tuple[int, ...] = ()
    if all(s.first_time is not None for s in own):
        earliest = min(s.first_time or datetime.min for s in own)
        tied = [s for s in own if s.first_time == earliest]
        if len(tied) == 1:
            return tied[0], "timestamp", ()
        own = tied
        same_time = tuple(sorted(s.rank for s in tied if s.rank is not None))
    roots = [s for s in own if any(f.root_cause for f in builders[s.rank].failures)]
    if len(roots) == 1:
        return roots[0], "root_cause", same_time
    paths = {s.first_source.path for s in own if s.first_source is not None}
    if len(paths) == 1:
        first = min(own, key=lambda s: (s.first_source.line or 0) if s.first_source else 0)
        return first, "line_order", same_time
    timed = [s for s in own if s.first_time is not None]
    if timed and not same_time:
        return min(timed, key=lambda s: s.first_time or datetime.min), "timestamp", ()
    return own[0], None if same_time else "line_order", same_time
