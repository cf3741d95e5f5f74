"""Host memory: the kernel's and the capture's evidence of an OOM kill, and pinned pages."""

from __future__ import annotations

from oomlens.diagnosis import Evidence, EvidenceKind
from oomlens.facts.capture import RankCapture
from oomlens.facts.run import RunFacts
from oomlens.rules.common.evidence import captured_kill_evidence, kernel_kill_evidence
from oomlens.rules.common.model_states import model_overflow


def host_kill_evidence(facts: RunFacts) -> tuple[list[Evidence], float, int | None]:
    """Evidence that host memory ran out, a confidence for it, and the pinned bytes the kernel
    saw (shmem-rss) per killed process."""
    evidence: list[Evidence] = []
    confidence = 0.0
    shmem: int | None = None
    kills = facts.kernel_oom_kills()
    for kill in kills[:2]:
        evidence.append(
            kernel_kill_evidence(kill, "page-locked (pinned) host buffers are counted as shmem-rss")
        )
        if kill.shmem_rss:
            shmem = max(shmem or 0, kill.shmem_rss)
    for capture in facts.captured_kills()[:2]:
        evidence.append(
            captured_kill_evidence(
                capture, "page-locked (pinned) host buffers count as shared resident memory"
            )
        )
        pinned = captured_pinned_bytes(capture)
        if pinned:
            shmem = max(shmem or 0, pinned)
    if kills or facts.captured_kills():
        confidence = 0.75
    killed_at = facts.sigkilled_at()
    if killed_at is not None:
        evidence.append(
            Evidence(
                EvidenceKind.LOG,
                f"a rank was killed with SIGKILL ({killed_at})",
                None,
                "what the OOM killer does; no Python traceback is left",
            )
        )
        confidence = max(confidence, 0.5)
    return evidence, confidence, shmem


def host_kill_seen(facts: RunFacts) -> bool:
    """The kernel's log or a capture's cgroup counters show an OOM kill."""
    return bool(facts.kernel_oom_kills() or facts.captured_kills())


def captured_pinned_bytes(capture: RankCapture) -> int | None:
    """The most shared (pinned) resident memory a captured rank held."""
    host = capture.host_memory
    if host is None or host.rss_shmem is None:
        return None
    return int(host.rss_shmem.maximum)


def host_overflow_evidence(facts: RunFacts) -> tuple[Evidence, int] | None:
    """The ZeRO memory model's host account, when it exceeds the node's memory: what the
    config's offload, its pinned buffers and the ranks of one node need at their peak, against
    the host memory given (``--host-memory``, a log's line), with the bytes it needs.  None
    when the model or the host's size is unknown, or the account fits (the model counts
    DeepSpeed's buffers only: data loaders and copies of the dataset come on top, so a fit
    rules nothing out)."""
    found = model_overflow(facts, "host")
    return (found[0], found[1].required_bytes) if found is not None else None
