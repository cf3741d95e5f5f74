"""What ``oomlens.cli.main`` sets up for the process before any command runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_THREADS_AFTER_NUMPY = """
import os
from oomlens import cli
try:
    cli.main(["--version"])
except SystemExit:
    pass
import numpy
print(len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS"))
"""


def _threads_after_numpy(**env: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _THREADS_AFTER_NUMPY],
        env=environment | env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return done.stdout.split()[-2:]  # after what --version printed


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted in /proc")
def test_numpy_starts_no_thread_per_core_under_the_cli() -> None:
    # OpenBLAS would start one per core (spinning: 2.3 s of CPU on 16 cores); on one core
    # it starts none either way, so this holds there without telling anything
    assert _threads_after_numpy() == ["1", "1"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted in /proc")
def test_a_blas_thread_count_of_the_users_own_is_kept() -> None:
    threads, setting = _threads_after_numpy(OPENBLAS_NUM_THREADS="2")
    assert setting == "2"
    assert int(threads) == (2 if (os.cpu_count() or 1) >= 2 else 1)
