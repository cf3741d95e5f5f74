"""The verdict: what happened to the run, decided from facts and derived signals alone.

The verdict is a declared, ordered table (``VERDICT_TABLE``): each row names a situation, the
verdict it means and how to say why; the first row whose reading holds decides.  The order is
the judgment: a library status error that a bug explains is not a GPU OOM even though it reads
like one, a failed pinned host allocation is host memory even though CUDA says "out of memory",
an OOM anywhere outranks the kills and exits it causes, a kill outranks the silent death it
leaves behind, and a log that merely stops proves nothing: "no failure" needs positive
evidence of a normal end (``Signals.normal_end``).  A row reads ``RunFacts`` (and its
``signals``) and the user's ``Thresholds``; none recomputes a signal.  ``failure_point`` then
says what died first as the verdict sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from oomlens.diagnosis import Verdict
from oomlens.facts.capture import CaptureEnd
from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import FailurePoint, Rejection
from oomlens.rules.thresholds import Thresholds

Reading = Callable[[RunFacts, Thresholds], str | None]
"""A row's reading of the run: the sentence that justifies its verdict when it holds, else
None."""


@dataclass(frozen=True, slots=True)
class VerdictRow:
    """One row of the verdict table."""

    name: str
    verdict: Verdict
    reading: Reading


def _library_bug(facts: RunFacts, _: Thresholds) -> str | None:
    bug = facts.signals.library_bug
    if bug is None:
        return None
    first = facts.gpu_oom_events()[0]
    return (
        f"a {first.message.kind.value} status error follows a bug ({bug.source.describe()}: "
        f"{' '.join(bug.text.split())[:120]}): a poisoned CUDA context, not a lack of memory"
    )


def _pinned_host(facts: RunFacts, _: Thresholds) -> str | None:
    pinned = facts.signals.pinned
    if pinned is None or any(e.message.kind is not OomKind.DRIVER for e in facts.gpu_oom_events()):
        return None
    if pinned.oom:
        return f"a pinned (page-locked) host allocation failed ({pinned.source.describe()})"
    return (
        f"the pin-memory thread failed ({pinned.source.describe()}): pinned host memory, "
        "most likely"
    )


def _gpu_oom(facts: RunFacts, _: Thresholds) -> str | None:
    gpu = facts.gpu_oom_events()
    if not gpu:
        return None
    first = facts.first_gpu_oom() or gpu[0]
    certain = any(e.message.certain for e in gpu)
    word = "out of memory" if certain else "probably out of memory (details lost)"
    return f"GPU {word}: {first.message.kind.value} error at {first.source.describe()}"


def _snapshot_oom(facts: RunFacts, _: Thresholds) -> str | None:
    devices = [d for _, d in facts.snapshot_devices() if d.oom is not None]
    if not devices:
        return None
    return f"the allocator snapshot records an out-of-memory on device {devices[0].device}"


def _summary_oom(facts: RunFacts, _: Thresholds) -> str | None:
    counted = facts.allocator_summary_ooms()
    if not counted:
        return None
    return (
        f"torch.cuda.memory_summary() counts {counted[0].ooms} CUDA OOM(s) "
        f"({counted[0].source.describe()})"
    )


def _kernel_kill(facts: RunFacts, _: Thresholds) -> str | None:
    kills = facts.kernel_oom_kills()
    if not kills:
        return None
    kill = kills[0]
    scope = "its memory cgroup limit" if kill.cgroup else "the machine's memory"
    return (
        f"the kernel OOM killer killed {kill.process_name} (pid {kill.pid}) for exceeding "
        f"{scope} ({kill.source.describe()})"
    )


def _scheduler_kill(facts: RunFacts, _: Thresholds) -> str | None:
    kills = [k for log in facts.logs for k in log.slurm_oom_kills]
    if not kills:
        return None
    return f"the scheduler reported an OOM kill ({kills[0].source.describe()})"


def _captured_kill(facts: RunFacts, _: Thresholds) -> str | None:
    captured = facts.captured_kills()
    if not captured or captured[0].gone is None:
        return None
    killed, gone = captured[0], captured[0].gone
    who = f"rank {killed.rank}" if killed.rank is not None else "a process"
    return (
        f"{who} (pid {killed.pid}) disappeared without a word while its cgroup counted "
        f"{gone.oom_kills} OOM kill(s) (memory.events, {gone.source.describe()})"
    )


def _host_allocation(facts: RunFacts, _: Thresholds) -> str | None:
    host = [e for e in facts.oom_events() if e.message.kind is OomKind.HOST]
    if not host:
        return None
    said = " ".join(host[0].message.text.split())[:160]
    return f"a host allocation failed ({host[0].source.describe()}: {said})"


def _sigkill(facts: RunFacts, _: Thresholds) -> str | None:
    sigkilled = facts.sigkilled_at()
    if sigkilled is None:
        return None
    return (
        f"a rank was killed with SIGKILL and no GPU error was printed ({sigkilled}); "
        "on a training node that is almost always the kernel's OOM killer"
    )


def _shared_memory(facts: RunFacts, _: Thresholds) -> str | None:
    if facts.signals.shm_denied is not None:
        return None
    shm = [
        line
        for log in facts.logs
        for line in log.fatal_signals
        if line.kind is FatalSignalKind.SHM_EXHAUSTED
    ]
    bus = [d for d in facts.signals.signal_deaths if d.signal == "SIGBUS"]
    if not (shm or bus):
        return None
    cited = shm[0].source if shm else bus[0].source
    where = cited.describe() if cited is not None else bus[0].text
    return f"shared memory (/dev/shm) ran out or could not be mapped ({where})"


def _silent_under_pressure(facts: RunFacts, thresholds: Thresholds) -> str | None:
    silent, pressure = facts.signals.silent_death, facts.signals.host_pressure
    if silent is None or pressure is None or pressure.cpu_percent is None:
        return None
    if pressure.cpu_percent < 100 * thresholds.host_memory_pressure_fraction:
        return None
    return (
        f"a worker died without printing an error ({silent.source.describe()}: "
        f"{silent.text}) while the node's memory was {pressure.cpu_percent}% used "
        f"({pressure.source.describe()})"
    )


def _silent(facts: RunFacts, _: Thresholds) -> str | None:
    silent = facts.signals.silent_death
    if silent is None:
        return None
    deaths = facts.signals.signal_deaths
    which = f"{deaths[0].signal} ({deaths[0].text})" if deaths else "the inputs do not say which"
    return (
        f"a worker died without printing an error ({silent.source.describe()}: "
        f"{silent.text}): a signal; {which}"
    )


def _deepspeed_refused(facts: RunFacts, _: Thresholds) -> str | None:
    for log in facts.logs:
        if log.batch_assertions:
            where = log.batch_assertions[0].source.describe()
            return f"DeepSpeed rejected the batch settings ({where})"
        if log.config_errors:
            return f"DeepSpeed rejected the config ({log.config_errors[0].source.describe()})"
    return None


def _refused_at_startup(facts: RunFacts, _: Thresholds) -> str | None:
    refused = facts.signals.config_rejections
    if not refused:
        return None
    first = refused[0]
    where = first.source.describe()
    if first.kind is Rejection.BATCH:
        return f"the batch settings were refused at startup ({where})"
    if first.kind is Rejection.SCHEMA:
        return f"the config was refused at startup ({where})"
    return (
        f"the framework would not run within its memory setting "
        f"{(first.keys or ('?',))[0]} ({where})"
    )


def _said_not_memory(facts: RunFacts, _: Thresholds) -> str | None:
    said = facts.signals.non_memory_lines
    if not said:
        return None
    return f"{said[0].why} ({said[0].source.describe()}), and no memory error anywhere"


def _only_cut_errors(facts: RunFacts, _: Thresholds) -> str | None:
    """The only failure the inputs show is an exception whose traceback was cut before its
    message: which error it was (an OOM or not) is not in the text."""
    exceptions = [e for e in facts.exceptions() if not e.peer_failure]
    if not exceptions or any(
        e.text.strip() and not (e.traceback is not None and e.traceback.cut) for e in exceptions
    ):
        return None
    if facts.oom_events() or facts.kernel_oom_kills():
        return None
    if any(
        log.process_failures or log.failure_summaries or log.fatal_signals or log.batch_assertions
        for log in facts.logs
    ):
        return None
    if any(e.return_code != 0 for e in facts.ranks.launcher_exits):
        return None
    return "a traceback stops before its error and nothing else failed: the text is cut mid-crash"


def _error_elsewhere(facts: RunFacts, _: Thresholds) -> str | None:
    unseen = facts.signals.unseen_errors
    if not unseen:
        return None
    first = unseen[0]
    who = f"rank {first.rank}" if first.rank is not None else "a worker"
    why = (
        "torchrun recorded no error file for it, so its traceback went only to its own stderr"
        if first.unrecorded
        else "its error was printed to its own stderr"
    )
    return (
        f"{who} exited with code {first.exitcode} ({first.source.describe()}) and {why}, "
        "which is not in the inputs: whether it ran out of memory is not known"
    )


def _collective_timeout(facts: RunFacts, _: Thresholds) -> str | None:
    if not facts.has_failure_evidence():
        return None
    timeouts = [p for log in facts.logs for p in log.peer_failures if p.kind == "watchdog_timeout"]
    if not timeouts:
        return None
    stragglers = facts.ranks.suspected_stragglers
    waiting = f", waiting for rank(s) {', '.join(str(r) for r in stragglers)}" if stragglers else ""
    return (
        f"a collective timed out ({timeouts[0].source.describe()}: NCCL's watchdog)"
        f"{waiting}; no memory error"
    )


def _rank_failed(facts: RunFacts, _: Thresholds) -> str | None:
    failed = facts.ranks.first_failed
    if failed is None or failed.first_source is None or not facts.has_failure_evidence():
        return None
    return (
        f"rank {failed.rank} failed ({failed.outcome}) at "
        f"{failed.first_source.describe()}, with no memory error"
    )


def _failed(facts: RunFacts, _: Thresholds) -> str | None:
    return "the run failed with no memory error" if facts.has_failure_evidence() else None


def _capture_vanished(facts: RunFacts, _: Thresholds) -> str | None:
    vanished = [c for c in facts.captures if c.end in (CaptureEnd.KILLED, CaptureEnd.VANISHED)]
    if not vanished:
        return None
    quiet = vanished[0]
    last = quiet.last_record
    return (
        f"rank {quiet.rank} ended without an exit record ({quiet.end.value}, last record "
        f"{last.isoformat(sep=' ', timespec='seconds') if last else '?'}): killed by a "
        "signal, or still running when the capture was read"
    )


def _captured_clean_exit(facts: RunFacts, _: Thresholds) -> str | None:
    if facts.captures and not facts.logs:
        return "every captured rank exited with status 0"
    return None


def _readable(facts: RunFacts) -> list[object]:
    return [log for log in facts.logs if log.lines]


def _log_ends_in_traceback(facts: RunFacts, _: Thresholds) -> str | None:
    if any(log.ended_in_traceback for log in facts.logs if log.lines):
        return "the log ends inside a traceback: it was cut mid-crash"
    return None


def _log_stream_cut(facts: RunFacts, _: Thresholds) -> str | None:
    """A compressed log whose stream stops early: what it read is kept, but its last lines
    (where a crash is written) may be what the cut lost, so its silence proves nothing."""
    for log in facts.logs:
        if log.lines and log.stream_cut:
            return (
                f"{log.path}: its {log.compression} stream stops early, so its last lines (where "
                "a crash is written) are lost"
            )
    return None


def _log_traceback_cut(facts: RunFacts, _: Thresholds) -> str | None:
    if any(log.tracebacks_cut for log in facts.logs if log.lines):
        return "a traceback stops before its error: the text is cut mid-crash"
    return None


def _no_normal_end(facts: RunFacts, _: Thresholds) -> str | None:
    if not _readable(facts) or facts.signals.normal_end is not None:
        return None
    if facts.last_step is not None:
        return (
            f"the log stops at step {facts.last_step} without an error or an end: "
            "a log that merely stops cannot say the run did not fail"
        )
    return (
        "no error in the inputs, but no normal end either (a launcher's exit 0, an "
        "end-of-training line, the last step of a known total): the text cannot say the run "
        "did not fail"
    )


def _oom_bare_before_end(facts: RunFacts, _: Thresholds) -> str | None:
    """An OOM taken for caught only because a normal end follows it, printed bare: no
    exception class (not Python's line of a raised error) and nothing around it that says a
    program handled it (no log record, no "retrying" before the message).  ``print(e)`` in a
    retry loop writes that, and so does a crash whose traceback the paste lost: the end may be
    the program's own after a retry, or another run's, written to the same file."""
    caught = [e for log in facts.logs if log.lines for e in log.caught_oom_events]
    bare = [e for e in caught if e.preamble is None and not e.message.exception_class]
    if not bare:
        return None
    return (
        f"an out-of-memory message at {bare[0].source.describe()} is printed bare (no "
        "exception class, no log record around it) and a normal end follows it: whether the "
        "program caught it and went on, or the end is another run's, the text cannot say"
    )


def _oom_caught(facts: RunFacts, _: Thresholds) -> str | None:
    caught = [e for log in facts.logs if log.lines for e in log.caught_oom_events]
    if not caught:
        return None
    return (
        f"{len(caught)} out-of-memory error(s) were caught by the program (first at "
        f"{caught[0].source.describe()}) and the run went on; no error, kill or failed "
        "exit after them"
    )


def _log_clean(facts: RunFacts, _: Thresholds) -> str | None:
    end = facts.signals.normal_end
    if not _readable(facts) or end is None:
        return None
    where = f" ({end.source.describe()})" if end.source is not None else ""
    return f"the run ended normally ({end.text[:120]}){where}; no error, kill or failed exit"


def _scheduler_cancelled(facts: RunFacts, _: Thresholds) -> str | None:
    end = facts.signals.scheduler_end
    if end is None:
        return None
    why = (
        f" because of {end.reason}"
        if end.reason
        else " (the line gives no reason: a user's scancel, or srun ending the step after "
        "a task failed)"
    )
    return f"the scheduler cancelled the job{why} ({end.source.describe()}); no memory error"


def _snapshot_only(facts: RunFacts, _: Thresholds) -> str | None:
    if not facts.snapshots:
        return None
    return "the snapshot records no out-of-memory and there is no log"


def _nothing_readable(facts: RunFacts, _: Thresholds) -> str | None:
    return "no readable training log"


VERDICT_TABLE: tuple[VerdictRow, ...] = (
    VerdictRow("library status error a bug explains", Verdict.OTHER_FAILURE, _library_bug),
    VerdictRow("pinned host allocation failed", Verdict.HOST_OOM, _pinned_host),
    VerdictRow("GPU out-of-memory error", Verdict.GPU_OOM, _gpu_oom),
    VerdictRow("snapshot records an OOM", Verdict.GPU_OOM, _snapshot_oom),
    VerdictRow("memory_summary counts an OOM", Verdict.GPU_OOM, _summary_oom),
    VerdictRow("kernel OOM kill", Verdict.HOST_OOM, _kernel_kill),
    VerdictRow("scheduler OOM kill", Verdict.HOST_OOM, _scheduler_kill),
    VerdictRow("captured process OOM-killed", Verdict.HOST_OOM, _captured_kill),
    VerdictRow("host allocation failed", Verdict.HOST_OOM, _host_allocation),
    VerdictRow("SIGKILL with no GPU error", Verdict.HOST_OOM, _sigkill),
    VerdictRow("shared memory ran out", Verdict.HOST_OOM, _shared_memory),
    VerdictRow("the scheduler cancelled the job", Verdict.OTHER_FAILURE, _scheduler_cancelled),
    VerdictRow("silent death under host memory pressure", Verdict.HOST_OOM, _silent_under_pressure),
    VerdictRow("silent death", Verdict.OTHER_FAILURE, _silent),
    VerdictRow("DeepSpeed rejected the config", Verdict.CONFIG_ERROR, _deepspeed_refused),
    VerdictRow("config refused at startup", Verdict.CONFIG_ERROR, _refused_at_startup),
    VerdictRow("a line says the failure was not memory", Verdict.OTHER_FAILURE, _said_not_memory),
    VerdictRow("only errors cut before their message", Verdict.UNKNOWN, _only_cut_errors),
    VerdictRow("a rank's error is not in the inputs", Verdict.UNKNOWN, _error_elsewhere),
    VerdictRow("collective timed out", Verdict.OTHER_FAILURE, _collective_timeout),
    VerdictRow("a rank failed", Verdict.OTHER_FAILURE, _rank_failed),
    VerdictRow("the run failed", Verdict.OTHER_FAILURE, _failed),
    VerdictRow("captured rank vanished", Verdict.UNKNOWN, _capture_vanished),
    VerdictRow("every captured rank exited 0", Verdict.NO_FAILURE, _captured_clean_exit),
    VerdictRow("log ends inside a traceback", Verdict.UNKNOWN, _log_ends_in_traceback),
    VerdictRow("a traceback is cut", Verdict.UNKNOWN, _log_traceback_cut),
    VerdictRow("a compressed log is cut", Verdict.UNKNOWN, _log_stream_cut),
    VerdictRow("a log that stops without a normal end", Verdict.UNKNOWN, _no_normal_end),
    VerdictRow("an OOM printed bare, then a normal end", Verdict.UNKNOWN, _oom_bare_before_end),
    VerdictRow("OOMs caught and the run went on", Verdict.NO_FAILURE, _oom_caught),
    VerdictRow("a log that ends normally, no failure", Verdict.NO_FAILURE, _log_clean),
    VerdictRow("a snapshot without an OOM, no log", Verdict.UNKNOWN, _snapshot_only),
    VerdictRow("nothing readable", Verdict.UNKNOWN, _nothing_readable),
)
"""The verdict's rows, in the order they are tried (see the module docstring).  The last row
always holds."""


def decide_verdict(facts: RunFacts, thresholds: Thresholds) -> tuple[Verdict, str]:
    """The verdict of the first row of ``VERDICT_TABLE`` whose reading holds, and its
    sentence."""
    for row in VERDICT_TABLE:
        reason = row.reading(facts, thresholds)
        if reason is not None:
            return row.verdict, reason
    raise AssertionError("the verdict table's last row always holds")


def failure_point(facts: RunFacts, verdict: Verdict) -> FailurePoint:
    """What died first as ``verdict`` sees it: the first GPU OOM of a GPU OOM, the first kernel
    OOM kill of a host OOM (derived once: ``RunFacts.signals``), else the rank that failed
    first."""
    signals = facts.signals
    if verdict is Verdict.GPU_OOM and signals.gpu_failure.event is not None:
        return signals.gpu_failure
    if verdict is Verdict.HOST_OOM and signals.host_failure.kill is not None:
        return signals.host_failure
    return signals.rank_failure
