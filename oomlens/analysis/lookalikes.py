"""Memory-looking failures that a bug caused.

A kernel that indexes out of range trips a device-side assert and poisons the CUDA context:
the next cuBLAS or cuDNN call then fails with ``CUBLAS_STATUS_NOT_INITIALIZED``,
``CUBLAS_STATUS_ALLOC_FAILED`` or ``CUDNN_STATUS_INTERNAL_ERROR``, statuses that also mean an
allocation failure.  The same run run on the CPU (or with ``CUDA_LAUNCH_BLOCKING=1``) says
``IndexError: index out of range in self``.  When the inputs show such a bug next to a library
status error, the status error is its consequence, not an out-of-memory.

``library_failure_explained(logs, events)`` finds the bug that explains every library OOM
status of ``events``, if there is one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from oomlens.facts import SourceRef
from oomlens.facts.log import ExceptionEvent, LogFacts, OomEvent, OomKind

LIBRARY_STATUSES = frozenset({OomKind.CUBLAS, OomKind.CUDNN, OomKind.CUSOLVER})
"""Library status errors that an allocation failure and a poisoned context both produce."""

_BUG = re.compile(
    r"device-side assert|index out of range|index \S{1,40} is out of bounds|"
    r"illegal memory access|Assertion `[^`]{1,200}` failed|out of bounds",
    re.IGNORECASE,
)
_BUG_CLASSES = frozenset({"IndexError"})


@dataclass(frozen=True, slots=True)
class BugEvidence:
    """What says the failure was a bug: the exception (or line) and where."""

    text: str
    source: SourceRef


def _is_bug(exception: ExceptionEvent) -> bool:
    name = exception.exception_class.rsplit(".", 1)[-1]
    return name in _BUG_CLASSES or bool(_BUG.search(exception.text))


def bug_evidence(logs: Sequence[LogFacts]) -> BugEvidence | None:
    """The first exception (or line kept at the log's end) that names an indexing bug or a
    device-side assert."""
    for log in logs:
        for exception in log.exceptions:
            if _is_bug(exception):
                return BugEvidence(exception.text[:400], exception.source)
        for number, text in log.tail:
            if _BUG.search(text):
                return BugEvidence(text[:400], SourceRef(log.path, number, log.layout_rank))
    return None


def library_failure_explained(
    logs: Sequence[LogFacts], events: Sequence[OomEvent]
) -> BugEvidence | None:
    """The bug that explains ``events`` when every one of them is a cuBLAS/cuDNN/cuSOLVER
    status (none a caching-allocator or driver OOM); None otherwise."""
    if not events or any(e.message.kind not in LIBRARY_STATUSES for e in events):
        return None
    return bug_evidence(logs)
