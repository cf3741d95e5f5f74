"""The result of an analysis: the verdict, the ranked diagnoses, and the facts behind them.

Renderers read only a ``Report`` (or ``oomlens check``'s ``CheckReport``, ``oomlens whatif``'s
``WhatIfReport``), and the report's vocabulary (``Diagnosis``, ``Evidence``,
``Fix``, ``Severity``, re-exported here from ``oomlens.diagnosis``).  ``assemble(facts,
thresholds)`` makes one: the verdict is decided from facts alone (what happened: a GPU OOM, a
host OOM kill, a rejected config, another failure, nothing), the rules' diagnoses say why, most
likely first; when the inputs show a failure but no rule is reasonably sure why, the report says
so (``insufficient_evidence``) and what to capture next time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from oomlens import __version__
from oomlens.analysis.lookalikes import library_failure_explained, non_memory_failure_lines
from oomlens.analysis.pinned import pinned_failure
from oomlens.analysis.preflight import Preflight
from oomlens.analysis.rejections import Rejection, config_rejections
from oomlens.analysis.run import step_before
from oomlens.analysis.signals import (
    host_memory_pressure,
    shm_permission_denied,
    signal_deaths,
    silent_death,
)
from oomlens.diagnosis import (
    Diagnosis,
    Evidence,
    EvidenceKind,
    Figure,
    Fix,
    RuleDoc,
    Severity,
    Unit,
)
from oomlens.facts import SourceRef
from oomlens.facts.capture import CaptureEnd
from oomlens.facts.kernel import FatalSignalKind, KernelOomKill
from oomlens.facts.log import OomEvent, OomKind, StepSample
from oomlens.facts.ranks import RankStatus
from oomlens.facts.run import RunFacts
from oomlens.facts.whatif import WhatIf
from oomlens.rules._common import (
    CAPTURE_CONFIG,
    CAPTURE_KERNEL,
    CAPTURE_MEMORY_SERIES,
    CAPTURE_SNAPSHOT,
)
from oomlens.rules.base import RuleSpec
from oomlens.rules.engine import docs, evaluate
from oomlens.rules.thresholds import Thresholds

__all__ = [
    "CHECK_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "CheckReport",
    "Diagnosis",
    "Evidence",
    "EvidenceKind",
    "FailurePoint",
    "Figure",
    "Fix",
    "Report",
    "RuleDoc",
    "Severity",
    "Unit",
    "Verdict",
    "assemble",
    "decide_verdict",
]

SCHEMA_VERSION = "1.0"
"""Of the JSON report (README, "JSON schema"): keys are only added within a major version."""
CHECK_SCHEMA_VERSION = "1.0"
"""Of ``oomlens check``'s JSON, the same way."""


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
class FailurePoint:
    """What died first, as the verdict sees it: a GPU OOM (``event``), a kernel OOM kill
    (``kill``) or the rank that failed first (``status``), where and when, and the last
    training step printed before it."""

    event: OomEvent | None
    kill: KernelOomKill | None
    status: RankStatus | None
    source: SourceRef | None
    rank: int | None
    time: datetime | None
    time_exact: bool
    step: StepSample | None


def failure_point(facts: RunFacts, verdict: Verdict) -> FailurePoint:
    """The failure the report leads with (see ``FailurePoint``)."""
    event = facts.first_gpu_oom() if verdict is Verdict.GPU_OOM else None
    kills = facts.kernel_oom_kills() if verdict is Verdict.HOST_OOM else ()
    status = facts.ranks.first_failed
    source: SourceRef | None = None
    rank: int | None = None
    time: datetime | None = None
    exact = True
    kill: KernelOomKill | None = None
    if event is not None:
        source, rank, time, exact = event.source, event.rank, event.timestamp, event.timestamp_exact
        status = None
    elif kills:
        kill = kills[0]
        source, time = kill.source, kill.timestamp
        status = None
    elif status is not None:
        source, rank, time = status.first_source, status.rank, status.first_time
    if rank is None and facts.ranks.first_failed is not None:
        rank = facts.ranks.first_failed.rank
    return FailurePoint(
        event, kill, status, source, rank, time, exact, step_before(facts.logs, rank, source)
    )


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What ``oomlens check`` found about one ds_config (``oomlens.analysis.preflight``)."""

    document: ClassVar[str] = "check"
    preflight: Preflight
    oomlens_version: str = __version__


@dataclass(frozen=True, slots=True)
class WhatIfReport:
    """What ``oomlens whatif`` found: a snapshot's recording replayed under other allocator
    settings (``oomlens.analysis.whatif``)."""

    document: ClassVar[str] = "whatif"
    whatif: WhatIf
    oomlens_version: str = __version__


@dataclass(frozen=True, slots=True)
class Report:
    """What an analysis found: the verdict, the diagnoses, the facts behind them."""

    document: ClassVar[str] = "report"
    verdict: Verdict
    verdict_reason: str
    """One sentence: what decided the verdict."""
    diagnoses: tuple[Diagnosis, ...]
    """Most likely first."""
    facts: RunFacts
    missing: tuple[str, ...]
    """What to capture next time, across all diagnoses (deduplicated)."""
    failure: FailurePoint | None = None
    """What died first (None when nothing did)."""
    docs: Mapping[str, RuleDoc] = field(default_factory=dict)
    """What each diagnosis id of the report means (declared with its rule)."""
    oomlens_version: str = __version__

    @property
    def top(self) -> Diagnosis | None:
        return self.diagnoses[0] if self.diagnoses else None


def assemble(facts: RunFacts, thresholds: Thresholds) -> Report:
    """The report of ``facts``: the verdict, every rule's diagnoses (most likely first, after
    ``insufficient_evidence`` when no cause is sure enough), and what to capture next time."""
    diagnoses = evaluate(facts, thresholds)
    verdict, reason = decide_verdict(facts)
    undetermined = insufficient_evidence(facts, verdict, diagnoses)
    if undetermined is not None:
        diagnoses = _with_uncertainty(diagnoses, undetermined)
    missing = tuple(dict.fromkeys(m for d in diagnoses for m in d.missing))
    known = docs() | {INSUFFICIENT_EVIDENCE.id: INSUFFICIENT_EVIDENCE.doc}
    return Report(
        verdict=verdict,
        verdict_reason=reason,
        diagnoses=diagnoses,
        facts=facts,
        missing=missing,
        failure=failure_point(facts, verdict),
        docs={d.id: known[d.id] for d in diagnoses if d.id in known},
    )


def decide_verdict(facts: RunFacts) -> tuple[Verdict, str]:
    """The verdict and the sentence that justifies it, from facts alone."""
    gpu = facts.gpu_oom_events()
    bug = library_failure_explained(facts.logs, gpu)
    if bug is not None:
        return Verdict.OTHER_FAILURE, (
            f"a {gpu[0].message.kind.value} status error follows a bug ({bug.source.describe()}: "
            f"{' '.join(bug.text.split())[:120]}): a poisoned CUDA context, not a lack of memory"
        )
    pinned = pinned_failure(facts)
    if pinned is not None and all(e.message.kind is OomKind.DRIVER for e in gpu):
        return Verdict.HOST_OOM, (
            f"a pinned (page-locked) host allocation failed ({pinned.source.describe()})"
            if pinned.oom
            else f"the pin-memory thread failed ({pinned.source.describe()}): pinned host "
            "memory, most likely"
        )
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
    summary_ooms = facts.allocator_summary_ooms()
    if summary_ooms:
        counted = summary_ooms[0]
        return Verdict.GPU_OOM, (
            f"torch.cuda.memory_summary() counts {counted.ooms} CUDA OOM(s) "
            f"({counted.source.describe()})"
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
    deaths = signal_deaths(facts)
    shm = [
        line
        for log in facts.logs
        for line in log.fatal_signals
        if line.kind is FatalSignalKind.SHM_EXHAUSTED
    ]
    bus = [d for d in deaths if d.signal == "SIGBUS"]
    if (shm or bus) and shm_permission_denied(facts) is None:
        cited = shm[0].source if shm else bus[0].source
        where = cited.describe() if cited is not None else bus[0].text
        return (
            Verdict.HOST_OOM,
            f"shared memory (/dev/shm) ran out or could not be mapped ({where})",
        )
    silent = silent_death(facts)
    if silent is not None:
        pressure = host_memory_pressure(facts)
        if pressure is not None and (pressure.cpu_percent or 0) >= 100 * HOST_PRESSURE:
            return Verdict.HOST_OOM, (
                f"a worker died without printing an error ({silent.source.describe()}: "
                f"{silent.text}) while the node's memory was {pressure.cpu_percent}% used "
                f"({pressure.source.describe()})"
            )
        which = (
            f"{deaths[0].signal} ({deaths[0].text})" if deaths else "the inputs do not say which"
        )
        return Verdict.OTHER_FAILURE, (
            f"a worker died without printing an error ({silent.source.describe()}: "
            f"{silent.text}): a signal; {which}"
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
    refused = config_rejections(facts.logs)
    if refused:
        where = refused[0].source.describe()
        return Verdict.CONFIG_ERROR, {
            Rejection.BATCH: f"the batch settings were refused at startup ({where})",
            Rejection.SCHEMA: f"the config was refused at startup ({where})",
            Rejection.SETTING: f"the framework would not run within its memory setting "
            f"{(refused[0].keys or ('?',))[0]} ({where})",
        }[refused[0].kind]
    said = non_memory_failure_lines(facts.logs)
    if said:
        return Verdict.OTHER_FAILURE, (
            f"{said[0].why} ({said[0].source.describe()}), and no memory error anywhere"
        )
    if _only_cut_errors(facts):
        return Verdict.UNKNOWN, (
            "a traceback stops before its error and nothing else failed: the text is cut mid-crash"
        )
    if facts.has_failure_evidence():
        timeouts = [
            p for log in facts.logs for p in log.peer_failures if p.kind == "watchdog_timeout"
        ]
        if timeouts:
            stragglers = facts.ranks.suspected_stragglers
            return Verdict.OTHER_FAILURE, (
                f"a collective timed out ({timeouts[0].source.describe()}: NCCL's watchdog)"
                + (
                    f", waiting for rank(s) {', '.join(str(r) for r in stragglers)}"
                    if stragglers
                    else ""
                )
                + "; no memory error"
            )
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
        if any(log.tracebacks_cut for log in readable_logs):
            return Verdict.UNKNOWN, "a traceback stops before its error: the text is cut mid-crash"
        if not facts.shows_progress_or_end():
            return Verdict.UNKNOWN, (
                "no error in the inputs, but no training progress or normal end either: "
                "a window of a longer log cannot say the run did not fail"
            )
        caught = [e for log in readable_logs for e in log.caught_oom_events]
        if caught:
            return Verdict.NO_FAILURE, (
                f"{len(caught)} out-of-memory error(s) were caught by the program (first at "
                f"{caught[0].source.describe()}) and the run went on; no error, kill or failed "
                "exit after them"
            )
        return Verdict.NO_FAILURE, "no error, kill or failed exit in the inputs"
    if facts.snapshots:
        return Verdict.UNKNOWN, "the snapshot records no out-of-memory and there is no log"
    return Verdict.UNKNOWN, "no readable training log"


def _only_cut_errors(facts: RunFacts) -> bool:
    """The only failure the inputs show is an exception whose traceback was cut before its
    message: which error it was (an OOM or not) is not in the text."""
    exceptions = [e for e in facts.exceptions() if not e.peer_failure]
    if not exceptions or any(
        e.text.strip() and not (e.traceback is not None and e.traceback.cut) for e in exceptions
    ):
        return False
    if facts.oom_events() or facts.kernel_oom_kills():
        return False
    if any(
        log.process_failures or log.failure_summaries or log.fatal_signals or log.batch_assertions
        for log in facts.logs
    ):
        return False
    return not any(e.return_code != 0 for e in facts.ranks.launcher_exits)


# -- when no cause is sure enough: evidence or silence (a guess presented as a cause is worse)

HOST_PRESSURE = Thresholds().host_memory_pressure_fraction
"""The verdict's reading of a silent death under memory pressure (the rule's default)."""
SURE_ENOUGH = 0.5
"""A cause at this confidence or above is worth naming; below, the report says what is missing."""
_NOT_CAUSES = frozenset({"config_hazard", "internal_error"})
INSUFFICIENT_EVIDENCE = RuleSpec(
    id="insufficient_evidence",
    title="Not enough evidence to say why",
    severity=Severity.INFO,
    explanation="oomlens reports a cause only when the evidence supports it. Here the inputs "
    "show what failed but not why: no rule reached the confidence needed to name a cause. "
    "Guessing would send the reader after the wrong knob, so the report says what to capture "
    "instead.",
    verify="capture the items listed below on the next run (or reproduce the failure with them "
    "enabled) and run oomlens again on the run directory.",
)
"""Not a rule: what the report says when no rule is sure enough."""


def _is_cause(d: Diagnosis) -> bool:
    """A diagnosis that names why the run failed: not an internal error, and not a config
    hazard read from the config alone (one the failure itself names is a cause)."""
    if d.id not in _NOT_CAUSES:
        return True
    return d.id == "config_hazard" and any(e.kind is EvidenceKind.LOG for e in d.evidence)


def _with_uncertainty(
    diagnoses: Sequence[Diagnosis], undetermined: Diagnosis
) -> tuple[Diagnosis, ...]:
    """Where ``insufficient_evidence`` goes.  First only when nothing points anywhere (no
    cause at all).  When causes were found but none is sure enough, the best-supported one
    still comes first, at its own low confidence, carrying what to capture next time in its
    ``missing``; ``insufficient_evidence`` follows the causes (at no more than their
    confidence, so the list stays most likely first)."""
    causes = [d for d in diagnoses if _is_cause(d)]
    if not causes:
        return (undetermined, *diagnoses)
    best = causes[0]
    recipe = tuple(m for m in undetermined.missing if m not in best.missing)
    ordered = [replace(best, missing=(*best.missing, *recipe))]
    ordered += [d for d in diagnoses if d is not best]
    lowest = min(d.confidence for d in ordered)
    return (*ordered, replace(undetermined, confidence=min(lowest, undetermined.confidence)))


def insufficient_evidence(
    facts: RunFacts, verdict: Verdict, diagnoses: Sequence[Diagnosis]
) -> Diagnosis | None:
    """An ``insufficient_evidence`` diagnosis when ``verdict`` is a failure (or unknown) and no
    cause reaches ``SURE_ENOUGH``; None otherwise."""
    if verdict is Verdict.NO_FAILURE:
        return None
    if any(d.confidence >= SURE_ENOUGH and _is_cause(d) for d in diagnoses):
        return None
    missing: list[str] = []
    if verdict is Verdict.GPU_OOM or verdict is Verdict.UNKNOWN:
        if not facts.snapshots:
            missing.append(CAPTURE_SNAPSHOT)
        if not any(True for _ in facts.memory_series()):
            missing.append(CAPTURE_MEMORY_SERIES)
    if verdict is Verdict.HOST_OOM and not (facts.kernel_oom_kills() or facts.captured_kills()):
        missing.append(CAPTURE_KERNEL)
    if facts.config is None:
        missing.append(CAPTURE_CONFIG)
    if not facts.logs:
        missing.append("the job's combined stdout/stderr (every rank's)")
    cut = [log for log in facts.logs if log.ended_in_traceback or log.ended_mid_line]
    evidence = [
        Evidence(
            EvidenceKind.DERIVED,
            f"verdict {verdict.value}; no cause reaches {SURE_ENOUGH:.0%} confidence",
        )
    ]
    evidence += [Evidence(EvidenceKind.LOG, "the log ends mid-crash (cut)", None) for _ in cut[:1]]
    return INSUFFICIENT_EVIDENCE.diagnose(
        confidence=SURE_ENOUGH,
        summary="the inputs show what failed but not why; capture the items below next time",
        evidence=tuple(evidence),
        missing=tuple(missing),
    )
