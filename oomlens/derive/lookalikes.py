"""Memory-looking failures that a bug caused.

A kernel that indexes out of range trips a device-side assert and poisons the CUDA context:
the next cuBLAS or cuDNN call then fails with ``CUBLAS_STATUS_NOT_INITIALIZED``,
``CUBLAS_STATUS_ALLOC_FAILED`` or ``CUDNN_STATUS_INTERNAL_ERROR``, statuses that also mean an
allocation failure.  The same run run on the CPU (or with ``CUDA_LAUNCH_BLOCKING=1``) says
``IndexError: index out of range in self``.  When the inputs show such a bug next to a library
status error, the status error is its consequence, not an out-of-memory.

``library_failure_explained(logs, events)`` finds the bug that explains every library OOM
status of ``events``, if there is one.

Some failures print no exception of their own, only a library's or the driver's line, and say
on that line that memory was not the problem: torch's ``CUDA initialization: <driver error> ...
Setting the available devices to be zero`` warning (the driver or the device is in a bad
state: every later CUDA call fails, whatever memory there is), DeepSpeed's cuBLAS wrappers'
``!!!! kernel execution error. (m: M, n: N, k: K, error: S)`` with a status that is not an
allocation failure (``CUBLAS_STATUS_EXECUTION_FAILED`` = 13: the kernel ran and failed, e.g. on
the wrong device).  ``non_memory_failure_lines(logs)`` finds them in the lines kept at a log's
end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from oomlens.facts import SourceRef
from oomlens.facts.log import ExceptionEvent, LogFacts, OomEvent, OomKind
from oomlens.facts.signals import BugEvidence, FailureLine

LIBRARY_STATUSES = frozenset({OomKind.CUBLAS, OomKind.CUDNN, OomKind.CUSOLVER})
"""Library status errors that an allocation failure and a poisoned context both produce."""

_BUG = re.compile(
    r"device-side assert|index out of range|index \S{1,40} is out of bounds|"
    r"illegal memory access|Assertion `[^`]{1,200}` failed|out of bounds",
    re.IGNORECASE,
)
_BUG_CLASSES = frozenset({"IndexError"})


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


_CUDA_INIT = re.compile(
    r"CUDA initialization: (?P<what>.{1,200}?)(?: - this may be due to|\. Setting|\Z)",
)
_CUDA_INIT_ZERO = re.compile(r"Setting the available devices to be zero")
_CUBLAS_EXEC = re.compile(
    r"!!!! kernel execution error\. \((?:batch: \d{1,9}, )?m: \d{1,9}, n: \d{1,9}, "
    r"k: \d{1,9}, error: (?P<status>\d{1,3})\)"
)
_CUBLAS_NOT_MEMORY = {
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
}
"""cuBLAS statuses that are not an allocation failure (``CUBLAS_STATUS_ALLOC_FAILED`` is 3;
``NOT_INITIALIZED`` (1) is left out: a handle that cannot be created for lack of memory says it
too)."""


def non_memory_failure_lines(logs: Sequence[LogFacts]) -> list[FailureLine]:
    """The lines kept at each log's end that report a CUDA initialization failure or a cuBLAS
    kernel that failed to execute with a status other than an allocation failure (see the
    module docstring), first one per kind and log, in log order."""
    found: list[FailureLine] = []
    for log in logs:
        init = cublas = False
        for number, text in log.tail:
            source = SourceRef(log.path, number, log.layout_rank)
            if not init and _CUDA_INIT_ZERO.search(text):
                match = _CUDA_INIT.search(text)
                if match is not None and "out of memory" not in match.group("what").lower():
                    init = True
                    found.append(
                        FailureLine(
                            text.strip()[:400],
                            source,
                            "CUDA could not initialize (" + match.group("what").strip() + "): "
                            "torch sees no GPU at all; a driver or device state problem",
                        )
                    )
            failed = None if cublas else _CUBLAS_EXEC.search(text)
            name = _CUBLAS_NOT_MEMORY.get(int(failed.group("status"))) if failed else None
            if failed is not None and name is not None:
                cublas = True
                found.append(
                    FailureLine(
                        text.strip()[:400],
                        source,
                        f"a cuBLAS kernel failed to run: status {failed.group('status')} is "
                        f"{name}, not an allocation failure",
                    )
                )
    return found
