"""contrib/slurm/oomlens-epilog.sh: exits 0 whatever oomlens does, and kills it at the limit."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "slurm" / "oomlens-epilog.sh"


def _fake_oomlens(tmp_path: Path, body: str) -> Path:
    """A stand-in for the oomlens console script: records its arguments, then runs ``body``."""
    path = tmp_path / "oomlens"
    path.write_text(
        "#!/bin/bash\n"
        f'echo "$@" > {tmp_path}/args\n'
        f'echo "$PATH" > {tmp_path}/path\n'
        f"echo $$ > {tmp_path}/pid\n"
        f"{body}\n"
    )
    path.chmod(0o755)
    return path


def _run_wrapper(
    tmp_path: Path, oomlens: Path, hard_limit: int = 5, **extra: str
) -> tuple[subprocess.Popen[bytes], float]:
    # slurmd's Epilog environment has no PATH, HOME or LANG.
    env = {
        "OOMLENS_EPILOG_BIN": str(oomlens),
        "OOMLENS_EPILOG_SETTINGS": str(tmp_path / "epilog.toml"),
        "OOMLENS_EPILOG_HARD_LIMIT": str(hard_limit),
        "SLURM_JOB_ID": "3",
        **extra,
    }
    started = time.monotonic()
    process = subprocess.Popen(["/bin/bash", str(SCRIPT)], env=env, cwd="/")
    return process, started


def _finish(process: subprocess.Popen[bytes], started: float) -> tuple[int, float]:
    status = process.wait(timeout=60)
    return status, time.monotonic() - started


def test_passes_settings_limit_and_spool_and_sets_path(tmp_path: Path) -> None:
    oomlens = _fake_oomlens(tmp_path, "exit 0")
    status, _ = _finish(*_run_wrapper(tmp_path, oomlens, 7, OOMLENS_EPILOG_SPOOL="/sp"))
    assert status == 0
    args = (tmp_path / "args").read_text().split()
    assert args == ["epilog", "--settings", str(tmp_path / "epilog.toml"), "--hard-limit", "7",
                    "--spool", "/sp"]  # fmt: skip
    assert "/usr/bin" in (tmp_path / "path").read_text().split(":")


@pytest.mark.parametrize(
    "body",
    [
        "exit 3",
        "kill -9 $$",
        "kill -SEGV $$",
        "echo 'garbage on stdout'; echo 'traceback' >&2; exit 1",
    ],
)
def test_exits_0_whatever_oomlens_does(tmp_path: Path, body: str) -> None:
    status, _ = _finish(*_run_wrapper(tmp_path, _fake_oomlens(tmp_path, body)))
    assert status == 0


def test_exits_0_when_oomlens_is_missing(tmp_path: Path) -> None:
    status, elapsed = _finish(*_run_wrapper(tmp_path, tmp_path / "not-installed"))
    assert status == 0 and elapsed < 2


def test_exits_0_when_oomlens_is_not_executable(tmp_path: Path) -> None:
    oomlens = _fake_oomlens(tmp_path, "exit 0")
    oomlens.chmod(0o644)
    status, _ = _finish(*_run_wrapper(tmp_path, oomlens))
    assert status == 0 and not (tmp_path / "args").exists()


def test_kills_a_hanging_oomlens_at_the_hard_limit(tmp_path: Path) -> None:
    # GIVEN an oomlens that never ends, and the child it started
    oomlens = _fake_oomlens(tmp_path, f"sleep 300 & echo $! > {tmp_path}/child; wait")
    # WHEN the wrapper runs with a 1 s hard limit
    status, elapsed = _finish(*_run_wrapper(tmp_path, oomlens, hard_limit=1))
    # THEN it exits 0 after about 1 s, and neither oomlens nor its child survive
    assert status == 0
    assert 0.9 < elapsed < 3
    for name in ("pid", "child"):
        pid = int((tmp_path / name).read_text())
        _wait_gone(pid)


def test_sigterm_from_slurmd_still_exits_0(tmp_path: Path) -> None:
    oomlens = _fake_oomlens(tmp_path, "sleep 30")
    process, started = _run_wrapper(tmp_path, oomlens, hard_limit=20)
    deadline = time.monotonic() + 10
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    status, elapsed = _finish(process, started)
    assert status == 0 and elapsed < 5
    _wait_gone(int((tmp_path / "pid").read_text()))


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} is still alive")
