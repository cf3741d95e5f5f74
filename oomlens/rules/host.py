"""Host memory: the kernel's OOM killer, the scheduler's memory enforcement, host allocation
failures, and /dev/shm exhaustion.

A rank killed by the OOM killer leaves no Python traceback: only the launcher's "exit code -9"
or "Signal 9 (SIGKILL)", and the kernel's own log lines on the node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.rules._common import CAPTURE_KERNEL, kernel_kill_evidence, oom_evidence
from oomlens.rules.base import clamp
from oomlens.rules.thresholds import Thresholds


class HostOomRule:
    id: ClassVar[str] = "host_oom_killed"
    title: ClassVar[str] = "Host memory ran out"
    explanation: ClassVar[str] = (
        "When the node (or the job's cgroup) runs out of RAM the kernel kills the process "
        "using the most: a training rank. It dies with SIGKILL, prints nothing, and the "
        "launcher reports exit code -9 (137 from a shell) and kills the other ranks. Common "
        "causes: every rank materializing the full model on the CPU (no zero.Init), ZeRO "
        "offload buffers, DataLoader workers copying the dataset, pinned memory."
    )

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
                confidence = max(confidence, 0.8)
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
        if not confidence:
            return
        missing = () if facts.kernel_oom_kills() else (CAPTURE_KERNEL,)
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.CRITICAL,
            confidence=clamp(confidence),
            summary=(
                "the kernel killed a rank for lack of host memory"
                if facts.kernel_oom_kills()
                else "a rank was killed without a GPU error: most likely host memory ran out"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Give the job more host memory, or run fewer ranks per node.",
                    command="sbatch --mem=<more> (or --mem-per-gpu) / --ntasks-per-node=<fewer>",
                    cost="hardware or throughput",
                ),
                Fix(
                    "Cut what each rank holds on the CPU: build large models under "
                    "deepspeed.zero.Init (or from_pretrained with low_cpu_mem_usage), use fewer "
                    "DataLoader workers, and avoid copying the dataset into every worker.",
                    cost="code change",
                ),
            ),
            missing=missing,
        )


class SharedMemoryRule:
    id: ClassVar[str] = "shm_exhausted"
    title: ClassVar[str] = "Shared memory (/dev/shm) exhausted"
    explanation: ClassVar[str] = (
        "DataLoader workers pass batches through shared memory, and NCCL uses it for "
        "intra-node transport. Containers often mount a small /dev/shm (Docker's default is 64 "
        "MB); when it fills, the process dies of SIGBUS ('Bus error', exit -7) or DataLoader "
        "reports insufficient shared memory."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        lines = [
            line
            for log in facts.logs
            for line in log.fatal_signals
            if line.kind in (FatalSignalKind.SIGBUS, FatalSignalKind.SHM_EXHAUSTED)
        ]
        if not lines:
            return
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=0.8
            if any(line.kind is FatalSignalKind.SHM_EXHAUSTED for line in lines)
            else 0.6,
            summary="a process ran out of shared memory (/dev/shm)",
            evidence=tuple(
                Evidence(EvidenceKind.LOG, line.text, line.source) for line in lines[:3]
            ),
            fixes=(
                Fix(
                    "Give the container a larger /dev/shm, or use fewer DataLoader workers.",
                    command="docker run --shm-size=16g ... / DataLoader(num_workers=...)",
                    cost="none",
                ),
            ),
        )
