"""Reading progress of large logs goes to stderr when stderr is a terminal, never otherwise,
and never into the report (``--format json`` on stdout stays one JSON document)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.ingest.log._mixed_logs import mixed_log

ROOT = Path(__file__).resolve().parents[2]
# the log counts as large (progress, workers) whatever its size; --jobs 2 as on a training node
RUN = """
import sys
from oomlens.ingest.log import batches
batches.PARALLEL_MIN_BYTES = 0
from oomlens.cli import main
main(["analyze", sys.argv[1], "--format", "json", "--jobs", "2"])
"""


def _analyze(log: Path, stderr_on_terminal: bool) -> tuple[dict[str, object], bytes]:
    """The JSON report on stdout and what went to stderr."""
    if not stderr_on_terminal:
        done = subprocess.run(
            [sys.executable, "-c", RUN, str(log)], capture_output=True, cwd=ROOT, timeout=120
        )
        return json.loads(done.stdout), done.stderr
    primary, secondary = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", RUN, str(log)],
            stdout=subprocess.PIPE,
            stderr=secondary,
            cwd=ROOT,
        )
        os.close(secondary)
        stdout, _ = process.communicate(timeout=120)
        seen = b""
        while True:
            try:
                piece = os.read(primary, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not piece:
                break
            seen += piece
    finally:
        os.close(primary)
    return json.loads(stdout), seen


def test_progress_only_on_a_terminal_and_never_in_the_report(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(mixed_log(5, ranks=8, steps=200, odd=0.02))

    on_terminal, shown = _analyze(log, stderr_on_terminal=True)
    assert b"oomlens: reading" in shown and b"100% of" in shown
    assert b"\r" in shown and b"\n" not in shown.replace(b"\r\n", b"")  # one line, rewritten

    piped, stderr = _analyze(log, stderr_on_terminal=False)
    assert b"reading" not in stderr and b"%" not in stderr
    # the same report either way: progress touches no output
    assert json.dumps(on_terminal, sort_keys=True) == json.dumps(piped, sort_keys=True)
