"""The result of an analysis: the verdict, the ranked diagnoses, and the facts behind them.

Renderers read only a ``Report``.  The verdict is decided from facts alone (what happened:
a GPU OOM, a host OOM kill, a rejected config, another failure, nothing), the diagnoses say
why, most likely first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from oomlens import __version__
from oomlens.facts.capture import CaptureEnd
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Diagnosis

SCHEMA_VERSION = "1.0"


class Verdict(StrEnum):
    GPU_OOM = "gpu_oom"
    """The GPU (or another accelerator) ran out of memory."""
    HOST_OOM = "host_oom"
    """Host RAM ran out: the kernel or the scheduler killed a rank, or a host allocation failed."""
    CONFIG_ERROR = "config_error"
    """The job was rejected by its own configuration before or while starting."""
    OTHER_FAILURE = "other_failure"
    """The run failed for a reason other than memory."""
    NO_FAILURE = "no_failure"
    """The inputs show no failure."""
    UNKNOWN = "unknown"
    """The inputs cannot tell (nothing readable, or a log cut before any sign)."""


@dataclass(frozen=True, slots=True)
class Report:
    verdict: Verdict
    verdict_reason: str
    """One sentence: what decided the verdict."""
    diagnoses: tuple[Diagnosis, ...]
    """Most likely first."""
    facts: RunFacts
    missing: tuple[str, ...]
    """What to capture next time, across all diagnoses (deduplicated)."""
    oomlens_version: str = __version__

    @property
    def top(self) -> Diagnosis | None:
        return self.diagnoses[0] if self.diagnoses else None


def decide_verdict(facts: RunFacts) -> tuple[Verdict, str]:
    """The verdict and the sentence that justifies it, from facts alone."""
    gpu = facts.gpu_oom_events()
    if gpu:
        first = facts.first_gpu_oom() or gpu[0]
        where = first.source.describe()
        certain = any(e.message.certain for e in gpu)
        word = "out of memory" if certain else "probably out of memory (details lost)"
        return Verdict.GPU_OOM, f"GPU {word}: {first.message.kind.value} error at {where}"
    snapshot_ooms = [d for _, d in facts.snapshot_devices() if d.oom is not None]
    if snapshot_ooms:
        return Verdict.GPU_OOM, (
            f"the allocator snapshot records an out-of-memory on device {snapshot_ooms[0].device}"
        )
    host_events = [e for e in facts.oom_events() if e.message.kind is OomKind.HOST]
    kills = facts.kernel_oom_kills()
    slurm_kills = [k for log in facts.logs for k in log.slurm_oom_kills]
    if kills:
        kill = kills[0]
        scope = "its memory cgroup limit" if kill.cgroup else "the machine's memory"
        return Verdict.HOST_OOM, (
            f"the kernel OOM killer killed {kill.process_name} (pid {kill.pid}) for exceeding "
            f"{scope} ({kill.source.describe()})"
        )
    if slurm_kills:
        return (
            Verdict.HOST_OOM,
            f"the scheduler reported an OOM kill ({slurm_kills[0].source.describe()})",
        )
    captured = facts.captured_kills()
    if captured:
        killed = captured[0]
        gone = killed.gone
        assert gone is not None
        who = f"rank {killed.rank}" if killed.rank is not None else "a process"
        return Verdict.HOST_OOM, (
            f"{who} (pid {killed.pid}) disappeared without a word while its cgroup counted "
            f"{gone.oom_kills} OOM kill(s) (memory.events, {gone.source.describe()})"
        )
    if host_events:
        return Verdict.HOST_OOM, f"a host allocation failed ({host_events[0].source.describe()})"
    sigkilled = facts.sigkilled_at()
    if sigkilled is not None:
        return Verdict.HOST_OOM, (
            f"a rank was killed with SIGKILL and no GPU error was printed ({sigkilled}); "
            "on a training node that is almost always the kernel's OOM killer"
        )
    for log in facts.logs:
        if log.batch_assertions:
            return Verdict.CONFIG_ERROR, (
                f"DeepSpeed rejected the batch settings "
                f"({log.batch_assertions[0].source.describe()})"
            )
        if log.config_errors:
            return Verdict.CONFIG_ERROR, (
                f"DeepSpeed rejected the config ({log.config_errors[0].source.describe()})"
            )
    if facts.has_failure_evidence():
        failed = facts.ranks.first_failed
        if failed is not None and failed.first_source is not None:
            return Verdict.OTHER_FAILURE, (
                f"rank {failed.rank} failed ({failed.outcome}) at "
                f"{failed.first_source.describe()}, with no memory error"
            )
        return Verdict.OTHER_FAILURE, "the run failed with no memory error"
    vanished = [c for c in facts.captures if c.end in (CaptureEnd.KILLED, CaptureEnd.VANISHED)]
    if vanished:
        quiet = vanished[0]
        last = quiet.last_record
        return Verdict.UNKNOWN, (
            f"rank {quiet.rank} ended without an exit record ({quiet.end.value}, last record "
            f"{last.isoformat(sep=' ', timespec='seconds') if last else '?'}): killed by a "
            "signal, or still running when the capture was read"
        )
    if facts.captures and not facts.logs:
        return Verdict.NO_FAILURE, "every captured rank exited with status 0"
    readable_logs = [log for log in facts.logs if log.lines]
    if readable_logs:
        if any(log.ended_in_traceback for log in readable_logs):
            return Verdict.UNKNOWN, "the log ends inside a traceback: it was cut mid-crash"
        return Verdict.NO_FAILURE, "no error, kill or failed exit in the inputs"
    if facts.snapshots:
        return Verdict.UNKNOWN, "the snapshot records no out-of-memory and there is no log"
    return Verdict.UNKNOWN, "no readable training log"
