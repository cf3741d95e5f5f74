"""Run ``python -m oomlens`` with its standard output on a pseudo-terminal of a given size, as
a user at a terminal runs it (``subprocess`` with ``stdout=PIPE`` is a pipe, not a terminal)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Mapping
from pathlib import Path


def on_terminal(
    args: list[str], columns: int, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str]:
    """``(exit code, what the terminal showed)`` for ``oomlens ARGS`` on a ``columns``-wide
    terminal; ``COLUMNS`` is left out of the environment unless ``env`` sets it."""
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    environment.update(env or {})
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    attributes = termios.tcgetattr(follower)
    attributes[1] &= ~termios.ONLCR  # "\n" as the program wrote it, not "\r\n"
    termios.tcsetattr(follower, termios.TCSANOW, attributes)
    process = subprocess.Popen(
        [sys.executable, "-m", "oomlens", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=environment,
        cwd=cwd,
    )
    os.close(follower)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the program closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return process.wait(timeout=120), shown.decode("utf-8")
