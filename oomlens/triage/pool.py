"""Worker processes that each run one task at a time, with a deadline per task.

``concurrent.futures.ProcessPoolExecutor`` cannot stop a task that hangs, and a worker that dies
breaks the whole executor.  Here the parent watches every worker: one that overruns its task's
deadline is killed and replaced, one that dies (killed by the kernel's OOM killer, a crash in C
code) is replaced, and in both cases that task alone gets a failure while the others go on.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

from oomlens.errors import OomlensError

Task = TypeVar("Task")
_READY = "ready"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What became of one task: its return value, or why there is none."""

    value: Any = None
    failure: str | None = None
    """None when the task returned; else what went wrong, in a sentence."""


def _context() -> multiprocessing.context.BaseContext:
    # fork starts a worker in milliseconds and re-imports nothing (spawn and forkserver
    # re-run the caller's main script, which breaks callers without a __main__ guard); it is
    # only unsafe with other threads running, which then get forkserver (spawn if absent).
    # On Linux only: there the kernel kills a worker whose parent died (_die_with_parent); a
    # forked worker also holds its siblings' pipe ends, so it would not see the parent go.
    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class WorkerStartError(OomlensError):
    """A worker process died before it could take any task: nothing would be analyzed."""


def _die_with_parent(parent: int | None) -> None:
    """Have the kernel kill this worker when the parent dies (Linux), so that a parent killed
    with SIGKILL leaves no worker analyzing on, unsupervised and without its deadline."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the worker ends at its next read instead
        return
    if parent is not None and os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _worker_main(
    conn: Connection,
    function: Callable[[Any], Any],
    memory_limit: int | None,
    parent: int | None,
) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt does
    if memory_limit is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    try:
        conn.send(_READY)
    except OSError:
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, task = message
        reply: tuple[int, Any, str | None]
        try:
            reply = (task_id, function(task), None)
        except MemoryError:
            reply = (task_id, None, "ran out of memory (the --max-memory limit)")
        except Exception as exc:  # a bug in the task function: that task fails, not the batch
            reply = (task_id, None, f"internal error: {type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


@dataclass(slots=True)
class _Worker:
    process: BaseProcess
    conn: Connection
    task_id: int | None = None
    deadline: float = 0.0
    ready: bool = False
    """Whether the worker said it started; one that dies before is a broken setup."""


class TaskPool(Generic[Task]):
    """Run ``function(task)`` in ``jobs`` worker processes; use as a context manager.

    ``function`` must be picklable (a module-level function) and so must tasks and results.
    ``timeout`` bounds each task's wall time, ``memory_limit`` each worker's address space
    (bytes, via ``RLIMIT_AS``).
    """

    def __init__(
        self,
        function: Callable[[Task], Any],
        *,
        jobs: int,
        timeout: float | None,
        memory_limit: int | None = None,
    ) -> None:
        if jobs < 1:
            raise ValueError("jobs must be at least 1")
        self._function = function
        self._jobs = jobs
        self._timeout = timeout
        self._memory_limit = memory_limit
        self._context = _context()
        self._workers: list[_Worker] = []

    def __enter__(self) -> TaskPool[Task]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_worker(self) -> _Worker:
        parent = None  # a forkserver or spawn child's parent is not this process
        if self._context.get_start_method() == "fork":
            parent = os.getpid()
            # The parent's objects (a warmed-up torch is millions of them) would otherwise be
            # walked by every full collection in every worker, copying their pages on write.
            gc.freeze()
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child_end, self._function, self._memory_limit, parent),
            daemon=True,
        )
        process.start()
        child_end.close()
        worker = _Worker(process, parent_end)
        self._workers.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()
        self._workers.remove(worker)

    def run(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, TaskOutcome]]:
        """Yield ``(task, outcome)`` as each task ends, in completion order."""
        pending: deque[tuple[int, Task]] = deque(enumerate(tasks))
        running: dict[int, Task] = {}
        while pending or running:
            while pending and len(running) < self._jobs:
                worker = next((w for w in self._workers if w.task_id is None), None)
                if worker is None:
                    worker = self._start_worker()
                task_id, task = pending.popleft()
                worker.task_id = task_id
                worker.deadline = (
                    time.monotonic() + self._timeout if self._timeout is not None else float("inf")
                )
                running[task_id] = task
                worker.conn.send((task_id, task))
            busy = [w for w in self._workers if w.task_id is not None]
            next_deadline = min(w.deadline for w in busy)
            wait_for = max(0.0, next_deadline - time.monotonic())
            ready = wait(
                [w.conn for w in busy] + [w.process.sentinel for w in busy],
                timeout=None if wait_for == float("inf") else wait_for,
            )
            for worker in busy:
                outcome: TaskOutcome | None = None
                if worker.conn in ready or worker.process.sentinel in ready:
                    outcome = self._collect(worker)
                elif time.monotonic() >= worker.deadline:
                    outcome = TaskOutcome(
                        failure=f"analysis took longer than {self._timeout:g} s and was stopped"
                    )
                    self._retire(worker)
                if outcome is None:
                    continue
                finished = worker.task_id
                assert finished is not None
                worker.task_id = None
                yield running.pop(finished), outcome

    def _collect(self, worker: _Worker) -> TaskOutcome | None:
        """The outcome of the worker's task, or None while it is still running."""
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message == _READY:
                    worker.ready = True
                    continue
                _, value, failure = message
                return TaskOutcome(value, failure)
        except (EOFError, OSError):
            pass  # the worker is gone
        else:
            if worker.process.exitcode is None:
                return None
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        self._retire(worker)
        if not worker.ready:
            raise WorkerStartError(
                f"a worker process could not start (exit code {code}); if you call"
                " oomlens.triage from a script, guard its entry point with"
                " if __name__ == '__main__':"
            )
        if code is not None and code < 0:
            try:
                cause = signal.Signals(-code).name
            except ValueError:
                cause = f"signal {-code}"
            why = f"the analysis process was killed by {cause}"
            if -code == signal.SIGKILL:
                why += " (out of memory?)"
            return TaskOutcome(failure=why)
        return TaskOutcome(failure=f"the analysis process exited unexpectedly (code {code})")

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones are killed."""
        for worker in list(self._workers):
            if worker.task_id is None:
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
        deadline = time.monotonic() + 2.0
        for worker in list(self._workers):
            if worker.task_id is None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._retire(worker)


def default_jobs() -> int:
    """The number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
