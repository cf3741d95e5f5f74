"""Session fixture: one real SLURM cluster, with oomlens as its Epilog, for all SLURM tests.

Skipped with the reason when it cannot run here (not root, no slurm and no apt-get); under CI
(``CI=true``) that is a failure instead, because CI must run these tests.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import (
    REPO_ROOT,
    SlurmCluster,
    ensure_test_user,
    install_packages,
    remove_test_user,
    why_not_runnable,
)

TIMINGS: dict[str, float | str] = {}
"""Seconds of each bring-up step (printed at the end of the session)."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.write_line(
            "real SLURM: " + ", ".join(
                f"{key} {value:.2f} s" if isinstance(value, float) else f"{key} {value}"
                for key, value in TIMINGS.items()
            )
        )  # fmt: skip


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = why_not_runnable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the real-SLURM tests: {reason}")
        pytest.skip(reason)
    TIMINGS["install"] = install_packages()
    uid, _gid, created_user = ensure_test_user()
    base = Path(tempfile.mkdtemp(prefix="oomlens-slurm-", dir="/tmp"))
    base.chmod(0o755)
    launcher = base / "bin" / "oomlens"
    launcher.parent.mkdir()
    # The Epilog runs this checkout's oomlens (first on sys.path) with the tests' interpreter.
    python_path = f"{REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"
    launcher.write_text(
        f'#!/bin/sh\nPYTHONPATH={python_path} exec {sys.executable} -m oomlens "$@"\n'
    )
    launcher.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    cluster = SlurmCluster(base, launcher, uid)
    try:
        TIMINGS["bring_up"] = cluster.start()
        yield cluster
    finally:
        stopped = time.monotonic()
        cluster.stop()
        TIMINGS["teardown"] = time.monotonic() - stopped
        if created_user:
            remove_test_user()
        if os.environ.get("OOMLENS_KEEP_SLURM_BASE"):
            TIMINGS["kept_base"] = str(base)
        else:
            shutil.rmtree(base, ignore_errors=True)
