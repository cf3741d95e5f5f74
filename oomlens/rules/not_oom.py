"""When the run failed for something other than memory: the failure that came first, and which
ranks only died because a peer did."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.log import ExceptionEvent
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import BugEvidence
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import as_printed, exception_line, quote
from oomlens.rules.thresholds import Thresholds

_HINTS = (
    (
        "device-side assert",
        "Rerun with CUDA_LAUNCH_BLOCKING=1 to see the failing kernel; an "
        "index out of range (labels >= vocabulary size, a padding id) is the usual cause.",
    ),
    (
        "illegal memory access",
        "Rerun with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer; an "
        "out-of-bounds kernel or a race, not a lack of memory.",
    ),
    (
        "Watchdog caught collective operation timeout",
        "One rank did not reach the collective in "
        "time: look at what the straggler was doing (stuck I/O, a rank-dependent code path, a "
        "crashed peer); TORCH_NCCL_TRACE_BUFFER_SIZE and py-spy dump help.",
    ),
    ("NCCL", "Check the network and NCCL_DEBUG=INFO output on every node."),
)


_KNOWN_LOOKALIKES = re.compile(
    r"device-side assert|illegal memory access|invalid device function|driver on your system "
    r"is too old|no kernel image is available|Watchdog caught|NCCL error|unhandled system "
    r"error|CUDA initialization|Segmentation fault|index out of range",
    re.IGNORECASE,
)
_SPEAKS_OF_MEMORY = re.compile(
    r"out of mem|OutOfMem|\bmemory\b|No space left on device|Cannot allocate|alloc(?:ation|ator)? "
    r"fail|shared memory|pin memory",
    re.IGNORECASE,
)


def _weigh(exception: ExceptionEvent) -> tuple[float, str]:
    """How much a rank's own exception says the failure was not about memory."""
    text = exception_line(exception)
    if _KNOWN_LOOKALIKES.search(text):
        return 0.85, "a failure known to look like an out-of-memory without being one"
    if _SPEAKS_OF_MEMORY.search(text):
        return 0.3, "the failure's own words are about memory: another rule may say more"
    if exception.traceback is not None and exception.traceback.frames:
        return 0.85, "the first failure of a rank on its own, with its traceback"
    return 0.5, "an error with nothing around it to place it"


SPEC = RuleSpec(
    id="not_oom",
    title="The run failed, but not for lack of memory",
    severity=Severity.HIGH,
    explanation=(
        "No allocator, driver or host out-of-memory error and no OOM kill appear in the "
        "inputs: the failure is something else. oomlens names the first failure it can see "
        "and the ranks that only died because of it (peers torn down by the launcher, "
        "collectives that timed out waiting)."
    ),
    verify=(
        "this is not a memory problem: fix the first failure named above; the ranks that only "
        "died because a peer did need no change."
    ),
    precedence=140,
)


class NotOomRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        bug = facts.signals.library_bug
        if bug is not None:
            yield self._poisoned(facts, bug)
            return
        if (
            facts.oom_events()
            or facts.kernel_oom_kills()
            or facts.captured_kills()
            or facts.sigkilled_at()
        ):
            return
        if any(log.batch_assertions or log.config_errors for log in facts.logs):
            return
        if facts.signals.shm_denied is None and any(
            line.kind is FatalSignalKind.SHM_EXHAUSTED
            for log in facts.logs
            for line in log.fatal_signals
        ):
            return  # shared memory ran out, in so many words: a host memory failure

        if facts.signals.config_rejections:
            return  # a refused configuration: the config rules name it
        said = facts.signals.non_memory_lines
        if not facts.has_failure_evidence() and not said:
            return
        picture = facts.ranks
        evidence: list[Evidence] = []
        confidence = 0.0
        headline = "the run failed without any memory error"
        # An exception whose traceback stops before its message says nothing of what it was;
        # torchrun's ChildFailedError only sums up the ranks' failures: it is none of them.
        own = [
            e
            for e in facts.exceptions()
            if not e.peer_failure
            and e.text.strip()
            and not (e.traceback is not None and e.traceback.cut)
            and not e.exception_class.endswith("ChildFailedError")
        ]
        if own:
            first = own[0]
            placed = (
                [e for e in picture.first_failed.exceptions if e in own]
                if (picture.first_failed is not None)
                else []
            )
            if placed:
                first = placed[0]
            confidence, why = _weigh(first)
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    quote(exception_line(first)),
                    first.source,
                    why,
                    verbatim=as_printed(first),
                )
            )
            headline = (
                f"{first.exception_class} on rank {first.source.rank}"
                if first.source.rank is not None
                else first.exception_class
            )
        timeouts = [
            p for log in facts.logs for p in log.peer_failures if p.kind == "watchdog_timeout"
        ]
        if timeouts:
            evidence.insert(  # what failed first, before the launcher's summing up
                0,
                Evidence(
                    EvidenceKind.LOG,
                    quote(timeouts[0].text),
                    timeouts[0].source,
                    "a collective timed out: a peer never joined",
                    verbatim=True,
                ),
            )
            if picture.suspected_stragglers:
                stragglers = ", ".join(str(r) for r in picture.suspected_stragglers)
                evidence.append(
                    Evidence(
                        EvidenceKind.DERIVED,
                        f"rank(s) {stragglers} did not time out: the others were waiting for them",
                        None,
                    )
                )
                headline = f"a collective timed out waiting for rank(s) {stragglers}"
            else:
                headline = "a collective operation timed out"
            confidence = max(confidence, 0.8)
        if picture.peer_victims:
            victims = ", ".join("?" if r is None else str(r) for r in picture.peer_victims)
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"rank(s) {victims} only died because a "
                    "peer did (SIGTERM from the launcher or a broken collective)",
                    None,
                )
            )
        crashes = [d for d in facts.signals.signal_deaths if d.signal in ("SIGSEGV", "SIGABRT")]
        if crashes and not confidence:
            confidence = 0.6
            headline = f"a process died of {crashes[0].signal}"
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    quote(crashes[0].text),
                    crashes[0].source,
                    "a crash in native code or an abort, not a lack of memory",
                )
            )
        # torch's "Signal 15 (SIGTERM) received" of a worker the launcher stopped is no error
        told = [
            f
            for log in facts.logs
            for f in log.process_failures
            if f.message and f.signal != "SIGTERM"
        ]
        if told and not confidence:
            failure = told[0]
            confidence = 0.7
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    quote(f"exit code {failure.exitcode} {failure.signal or ''} {failure.message}"),
                    failure.source,
                    "the launcher's record of the worker's error",
                )
            )
        if said:
            # The failing component's own line says what failed, and that it was not memory:
            # worth a named cause even when the exception itself was cut off.
            evidence.extend(
                Evidence(EvidenceKind.LOG, quote(line.text), line.source, line.why, verbatim=True)
                for line in said
            )
            if confidence < 0.6:
                confidence = 0.6
                headline = said[0].why.split(":", 1)[0]
        if not confidence:
            return  # only exit codes: a failure, but nothing says what it was
        text = " ".join(e.text for e in evidence)
        fixes = tuple(Fix(hint, cost="debugging") for key, hint in _HINTS if key in text)[:2]
        yield SPEC.diagnose(
            confidence=confidence,
            summary=headline,
            evidence=tuple(evidence),
            fixes=fixes,
            rank=picture.first_failed.rank if picture.first_failed else None,
        )

    @staticmethod
    def _poisoned(facts: RunFacts, bug: BugEvidence) -> Diagnosis:
        status = facts.gpu_oom_events()[0]
        return SPEC.diagnose(
            confidence=0.75,
            summary="an indexing bug (or device-side assert) broke the CUDA context; the "
            f"{status.message.kind.value} status error that looks like memory followed from it",
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    quote(bug.text),
                    bug.source,
                    "an out-of-range index or a failed kernel assertion",
                    verbatim=True,
                ),
                Evidence(
                    EvidenceKind.LOG,
                    quote(status.message.text),
                    status.source,
                    "a library status that a poisoned context produces as readily as a full card",
                    supports=False,
                    verbatim=True,
                ),
            ),
            fixes=(
                Fix(
                    "Find the index that is out of range (token ids >= the vocabulary or "
                    "position ids >= max positions, labels >= the number of classes): run once "
                    "on the CPU or with CUDA_LAUNCH_BLOCKING=1 to get the failing line.",
                    command="CUDA_LAUNCH_BLOCKING=1 python ...",
                    cost="debugging",
                ),
            ),
            rank=status.rank,
        )


RULE = NotOomRule()
