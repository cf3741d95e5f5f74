"""A FIFO, a device or a socket wherever a path enters the command line: refused before it is
opened, in one line that says what it is, with a documented exit code; never a block."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._corpus import case_dir

CASE = case_dir("other_process")


def run(*args: str | os.PathLike[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,  # opening a FIFO blocks until a writer comes: a timeout here is the bug
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "train.log"
    os.mkfifo(path)
    return path


# (command line with {} for the special file, exit code, words the one line must hold)
ENTRIES = [
    (["analyze", "{}"], 3, "named pipe"),
    (["analyze", CASE, "--config", "{}"], 0, "named pipe"),
    (["analyze", CASE, "--thresholds", "{}"], 2, "named pipe"),
    (["check", "{}"], 4, "named pipe"),
    (["triage", "{}", "--no-store"], 2, "named pipe"),
    (["triage", CASE, "--store", "{}", "-q"], 2, "named pipe"),
    (["triage", CASE, "--config", "{}", "--no-store", "-q"], 2, "named pipe"),
    (["triage", "merge", "{}", "-o", "merged.csv"], 3, "named pipe"),
    (["epilog", "--check", "--settings", "{}"], 2, "named pipe"),
]


@pytest.mark.parametrize(("argv", "code", "words"), ENTRIES, ids=lambda v: str(v)[:40])
def test_a_fifo_is_refused_before_it_is_opened(
    fifo: Path, tmp_path: Path, argv: list[object], code: int, words: str
) -> None:
    args = [str(fifo) if a == "{}" else a for a in argv]
    result = run(*args, cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == code, result.stderr
    if code == 0:
        # the analysis goes on without it, and says why it was left out
        assert "named pipe" in result.stdout and str(fifo) in result.stdout
    else:
        line = result.stderr.strip().splitlines()[-1]
        assert str(fifo) in line and words in line, result.stderr


@pytest.mark.parametrize("command", ["analyze", "check"])
def test_a_device_is_not_a_regular_file_not_an_empty_one(tmp_path: Path, command: str) -> None:
    result = run(command, "/dev/zero", cwd=tmp_path)
    assert result.returncode == (3 if command == "analyze" else 4)
    assert "character device" in result.stderr and "empty" not in result.stderr
    assert "larger than" not in result.stderr


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        result = run("analyze", path, cwd=tmp_path)
    assert result.returncode == 3 and "socket" in result.stderr
