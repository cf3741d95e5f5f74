"""The worker pool: every task gets an outcome, whatever a task does to its process."""

from __future__ import annotations

import os
import time

import pytest

from oomlens.triage import pool as pool_module
from oomlens.triage.pool import TaskPool, WorkerStartError
from tests.triage import _tasks


def _outcomes(function, tasks, **kwargs):  # type: ignore[no-untyped-def]
    with TaskPool(function, **kwargs) as pool:
        return dict(pool.run(tasks))


def test_every_task_returns_its_value() -> None:
    outcomes = _outcomes(_tasks.square, range(20), jobs=2, timeout=30)
    assert {task: o.value for task, o in outcomes.items()} == {i: i * i for i in range(20)}
    assert all(o.failure is None for o in outcomes.values())


def test_tasks_run_in_several_processes() -> None:
    outcomes = _outcomes(_tasks.pid, range(6), jobs=2, timeout=30)
    pids = {o.value for o in outcomes.values()}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_a_hanging_task_is_stopped_at_its_deadline_and_the_others_finish() -> None:
    started = time.monotonic()
    outcomes = _outcomes(_tasks.sleep_or_square, [1, -1, 2, 3, 4], jobs=2, timeout=1.0)
    elapsed = time.monotonic() - started
    assert outcomes[-1].failure == "analysis took longer than 1 s and was stopped"
    assert {t: o.value for t, o in outcomes.items() if t >= 0} == {1: 1, 2: 4, 3: 9, 4: 16}
    assert elapsed < 10


def test_a_killed_worker_fails_its_task_only() -> None:
    outcomes = _outcomes(_tasks.die_or_square, [1, -1, 2, -2, 3], jobs=2, timeout=30)
    assert outcomes[-1].failure is not None
    assert "killed by SIGKILL" in outcomes[-1].failure
    assert "killed by SIGKILL" in (outcomes[-2].failure or "")
    assert {t: o.value for t, o in outcomes.items() if t >= 0} == {1: 1, 2: 4, 3: 9}


def test_an_exception_fails_its_task_only() -> None:
    outcomes = _outcomes(_tasks.fail_or_square, [-5, 2], jobs=1, timeout=30)
    assert outcomes[-5].failure == "internal error: ValueError: bad value -5"
    assert outcomes[2].value == 4


def test_the_memory_limit_turns_a_huge_allocation_into_a_failure() -> None:
    outcomes = _outcomes(_tasks.allocate, [4096, 1], jobs=1, timeout=30, memory_limit=2 * 1024**3)
    assert outcomes[4096].failure == "ran out of memory (the --max-memory limit)"
    assert outcomes[1].value == 1024 * 1024


def test_a_worker_that_cannot_start_stops_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN workers that die before taking any task (a broken installation, say)
    monkeypatch.setattr(pool_module, "_worker_main", lambda *args: os._exit(3))
    # THEN the batch stops with one clear error instead of failing every run
    with pytest.raises(WorkerStartError, match="exit code 3"):
        _outcomes(_tasks.square, range(5), jobs=2, timeout=30)


def test_no_worker_outlives_the_pool() -> None:
    with TaskPool(_tasks.sleep_or_square, jobs=2, timeout=60) as pool:
        results = pool.run([1, -1, -2])
        first = next(results)
        assert first[1].value == 1
        workers = [w.process for w in pool._workers]
    assert workers and not any(p.is_alive() for p in workers)
