"""Host memory ran out: the kernel's OOM killer, the scheduler's memory enforcement, or a host
allocation failure.  A rank killed by the OOM killer leaves no Python traceback: only the
launcher's "exit code -9" or "Signal 9 (SIGKILL)", and the kernel's own log lines on the node."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_KERNEL
from oomlens.rules.common.evidence import (
    captured_kill_evidence,
    kernel_kill_evidence,
    oom_evidence,
    size,
)
from oomlens.rules.common.host import host_kill_seen, host_overflow_evidence
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="host_oom_killed",
    title="Host memory ran out",
    severity=Severity.CRITICAL,
    explanation=(
        "When the node (or the job's cgroup) runs out of RAM the kernel kills the process "
        "using the most: a training rank. It dies with SIGKILL, prints nothing, and the "
        "launcher reports exit code -9 (137 from a shell) and kills the other ranks. Common "
        "causes: every rank materializing the full model on the CPU (no zero.Init), ZeRO "
        "offload buffers, DataLoader workers copying the dataset, pinned memory."
    ),
    verify=(
        "the node's kernel log shows no 'Killed process' line for the job and the job's cgroup "
        "memory.events no new oom_kill; keep MaxRSS (sacct) well below the limit."
    ),
    thresholds=("host_memory_pressure_fraction",),
    precedence=120,
)


class HostOomRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        if facts.gpu_oom_events():
            return
        evidence: list[Evidence] = []
        confidence = 0.0
        for kill in facts.kernel_oom_kills()[:3]:
            evidence.append(
                kernel_kill_evidence(kill, "the kernel's OOM killer chose this process")
            )
            # General host OOM: specific rules (pinned offload, checkpoint gather) rank above.
            confidence = 0.75
        for capture in facts.captured_kills()[:3]:
            evidence.append(
                captured_kill_evidence(capture, "what the kernel's OOM killer leaves (captured)")
            )
            confidence = 0.75
        for log in facts.logs:
            for slurm in log.slurm_oom_kills[:2]:
                evidence.append(
                    Evidence(
                        EvidenceKind.LOG,
                        f"the scheduler detected an oom-kill event (step {slurm.step_id})",
                        slurm.source,
                    )
                )
                confidence = max(confidence, 0.75)
        for event in facts.oom_events():
            if event.message.kind is OomKind.HOST:
                evidence.append(oom_evidence(event, "a host allocation failed"))
                # Host RAM ran out for certain; that it is the run's memory and not one
                # oversized tensor (a batch, a dataset copy) the message alone cannot say.
                confidence = max(confidence, 0.8 if facts.kernel_oom_kills() else 0.55)
        named = {d.signal for d in facts.signals.signal_deaths}
        if not confidence and (not named or "SIGKILL" in named):
            # (a death the launcher names SIGSEGV, SIGBUS or SIGABRT was not the OOM killer's)
            silent = facts.signals.silent_death
            if silent is not None:
                # A worker died without a word and the launcher tore down the rest: a signal,
                # most often the OOM killer's; host memory near full before it says so.
                confidence = 0.35
                evidence.append(
                    Evidence(
                        EvidenceKind.LOG,
                        silent.text,
                        silent.source,
                        "the launcher killed the other workers after one died without printing "
                        "an error: a signal, most often the kernel's OOM killer",
                    )
                )
                pressure = facts.signals.host_pressure
                if (
                    pressure is not None
                    and pressure.cpu_percent is not None
                    and pressure.cpu_percent >= 100 * thresholds.host_memory_pressure_fraction
                ):
                    confidence = 0.6
                    evidence.append(
                        Evidence(
                            EvidenceKind.LOG,
                            f"CPU Virtual Memory: used = {size(pressure.cpu_used)}, percent = "
                            f"{pressure.cpu_percent}%",
                            pressure.source,
                            "the node's memory was nearly full just before",
                        )
                    )
        killed = facts.sigkilled_at()
        if killed is not None:
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"killed with SIGKILL ({killed})",
                    None,
                    "the OOM killer's signal; a scheduler's time limit or a "
                    "user's kill -9 look the same",
                )
            )
            confidence = max(confidence, 0.5)
        overflow = host_overflow_evidence(facts)
        if confidence and overflow is not None:
            # a silent death is the OOM killer's when the config alone needs more host
            # memory than the node has
            evidence.append(overflow[0])
            confidence = min(0.95, max(confidence, 0.6) + 0.1)
        if not confidence:
            return
        missing = () if host_kill_seen(facts) else (CAPTURE_KERNEL,)
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                "the kernel killed a rank for lack of host memory"
                if host_kill_seen(facts)
                else "a host allocation failed: host memory ran out"
                if any(e.message.kind is OomKind.HOST for e in facts.oom_events())
                else "a rank was killed without a GPU error: most likely host memory ran out"
            ),
            evidence=tuple(evidence),
            fixes=(
                _more_memory(overflow[1] if overflow is not None else None),
                Fix(
                    "Cut what each rank holds on the CPU: build large models under "
                    "deepspeed.zero.Init (or from_pretrained with low_cpu_mem_usage), use fewer "
                    "DataLoader workers, and avoid copying the dataset into every worker.",
                    cost="code change",
                ),
            ),
            missing=missing,
        )


def _more_memory(needed: int | None) -> Fix:
    """More host memory: with the ZeRO memory model's figure and a 10% margin when there is
    one (Slurm's ``--mem`` takes whole gibibytes with ``G``)."""
    if needed is None:
        return Fix(
            "Give the job more host memory, or run fewer ranks per node.",
            command="sbatch --mem=<more> (or --mem-per-gpu) / --ntasks-per-node=<fewer>",
            cost="hardware or throughput",
        )
    gib = math.ceil(needed * 1.1 / 1024**3)
    return Fix(
        f"Give the job at least {gib} GiB of host memory per node: the ZeRO memory model's "
        f"{size(needed)} with a 10% margin (data loaders and other host buffers come on top), "
        "or run fewer ranks per node.",
        command=f"sbatch --mem={gib}G (per node)",
        arguments={"--mem": f"{gib}G"},
        cost="hardware or throughput",
    )


RULE = HostOomRule()
