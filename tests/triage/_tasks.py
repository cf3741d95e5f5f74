"""Task functions for the worker-pool tests; module-level so that worker processes can run them."""

from __future__ import annotations

import os
import signal
import time


def square(value: int) -> int:
    return value * value


def sleep_or_square(value: int) -> int:
    """Hangs (far past any test deadline) for a negative value."""
    if value < 0:
        time.sleep(3600)
    return value * value


def die_or_square(value: int) -> int:
    """The worker process is killed outright for a negative value (as the OOM killer does)."""
    if value < 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return value * value


def fail_or_square(value: int) -> int:
    if value < 0:
        raise ValueError(f"bad value {value}")
    return value * value


def allocate(megabytes: int) -> int:
    block = bytearray(megabytes * 1024 * 1024)
    return len(block)


def pid(_: object) -> int:
    return os.getpid()


def hang_on_nccl(task: object) -> object:
    """The real analysis, except that it hangs for the nccl_timeout case (``b`` in the test)."""
    from oomlens.triage.worker import AnalysisTask, analyze_task

    assert isinstance(task, AnalysisTask)
    if any(path.endswith("/b") for path in task.inputs):
        time.sleep(3600)
    return analyze_task(task)
