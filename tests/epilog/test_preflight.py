"""``oomlens epilog --check``'s installation checks: the spool, and oomlens run as a job's user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from oomlens.epilog.preflight import check_runs_as_user, check_spool, first_blocked_path
from oomlens.epilog.settings import EpilogSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")


def test_a_missing_spool_is_created_and_checked(tmp_path: Path) -> None:
    spool = tmp_path / "var" / "spool" / "oomlens"
    finding = check_spool(replace(EpilogSettings(), spool_dir=spool))
    assert finding.ok and spool.is_dir() and "is writable" in finding.what
    assert list(spool.iterdir()) == []  # the probe file is gone


def test_a_spool_writable_by_others_is_a_problem(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    finding = check_spool(replace(EpilogSettings(), spool_dir=spool))
    assert not finding.ok and "writable by group or others" in finding.what


def test_the_first_closed_directory_on_the_way_is_named() -> None:
    base = Path(tempfile.mkdtemp(prefix="oomlens-preflight-"))  # pytest's tmp_path is private
    try:
        base.chmod(0o755)
        home = base / "root-like"
        interpreter = home / ".pyenv" / "bin" / "python3"
        interpreter.parent.mkdir(parents=True)
        interpreter.write_text("")
        interpreter.chmod(0o755)
        home.chmod(0o700)
        assert first_blocked_path([str(interpreter)]) == str(home)
        home.chmod(0o755)
        assert first_blocked_path([str(interpreter)]) is None
        interpreter.chmod(0o700)
        assert first_blocked_path([str(interpreter)]) == str(interpreter)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_running_as_nobody_agrees_with_the_paths_permissions() -> None:
    # Whether nobody can run this interpreter depends on where it lives (a pyenv under a 0700
    # /root cannot be run: the case this check exists for); the check must say which.
    executable = os.path.realpath(sys.executable)
    blocked = first_blocked_path([executable, str(REPO_ROOT / "oomlens")])
    finding = check_runs_as_user("nobody")
    if blocked is None:
        assert finding.ok, finding.what
    else:
        assert not finding.ok and blocked in finding.what
        assert "/usr/bin/python3 -m venv" in finding.what


@needs_root
def test_an_unknown_user_to_test_with_is_a_problem() -> None:
    finding = check_runs_as_user("no-such-user-oomlens")
    assert not finding.ok and "--as-user" in finding.what


def test_check_exits_2_when_the_spool_is_unusable(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    done = subprocess.run(
        [sys.executable, "-m", "oomlens", "epilog", "--check", "--settings",
         str(tmp_path / "none.toml"), "--spool", str(spool), "--as-user", "root"],
        env={"PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "# PROBLEM: spool:" in done.stderr and "writable by group or others" in done.stderr
