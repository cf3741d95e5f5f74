"""The watcher that records how a rank disappeared, and a real kernel OOM kill under a cgroup
memory limit (as root, where the cgroup's memory controller can be written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from oomlens.capture.probes import Cgroup
from oomlens.capture.sentinel import dmesg_line, main, parse_kmsg
from oomlens.report import Verdict
from oomlens.session import analyze
from tests.capture._run import TRAIN, clean_env, kinds, wait_for


def test_kmsg_records_become_dmesg_lines() -> None:
    record = parse_kmsg(
        b"3,1709,2119214525,-;Memory cgroup out of memory: Killed process 24068 (python) "
        b"total-vm:1185676kB, anon-rss:606180kB, file-rss:79348kB, shmem-rss:0kB\n"
        b" SUBSYSTEM=memory\n"
    )
    assert record is not None
    usec, message = record
    assert dmesg_line(usec, message) == (
        "[ 2119.214525] Memory cgroup out of memory: Killed process 24068 (python) "
        "total-vm:1185676kB, anon-rss:606180kB, file-rss:79348kB, shmem-rss:0kB"
    )
    assert parse_kmsg(b"no record here") is None
    assert parse_kmsg(b"6,1,notanumber,-;text") is None


def test_the_watcher_records_a_disappearance(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    events = tmp_path / "rank0.events.jsonl"
    events.write_text('{"oomlens_capture":1,"file":"events"}\n')
    main(
        [
            "--pid",
            str(child.pid),
            "--events",
            str(events),
            "--kernel",
            str(tmp_path / "k.log"),
            "--foreground",
        ]
    )
    child.wait()
    gone = json.loads(events.read_text().splitlines()[-1])
    assert gone["kind"] == "gone" and gone["pid"] == child.pid
    assert not (tmp_path / "k.log").exists()  # nothing about it in the kernel log


def _memory_cgroup(name: str) -> Path | None:
    own = Cgroup.of()
    if os.geteuid() != 0 or own is None:
        return None
    root = Path("/sys/fs/cgroup/memory") if own.version == 1 else Path("/sys/fs/cgroup")
    path = root / name
    try:
        path.mkdir()
        limit = "memory.limit_in_bytes" if own.version == 1 else "memory.max"
        (path / limit).write_text(str(400 * 2**20))
        if own.version == 2:
            (path / "memory.swap.max").write_text("0")
    except OSError:
        if path.exists():
            path.rmdir()
        return None
    return path


def test_a_rank_killed_by_the_kernel_for_memory_is_diagnosed_from_its_capture(
    tmp_path: Path,
) -> None:
    cgroup = _memory_cgroup(f"oomlens-test-{uuid.uuid4().hex[:8]}")
    if cgroup is None:
        pytest.skip("needs root and a writable memory cgroup controller")
    try:
        env = clean_env(
            OOMLENS_CAPTURE_DIR=str(tmp_path / "cap"),
            OOMLENS_CAPTURE_RUN="job",
            OOMLENS_CAPTURE_INTERVAL="0.25",
        )
        command = (
            f"echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -m oomlens.capture "
            f"{TRAIN} --steps 100000 --hold-mb 8"
        )
        result = subprocess.run(
            ["bash", "-c", command],
            env=env,
            cwd=tmp_path,
            timeout=240,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == -9 or result.returncode == 137, result.stderr[-2000:]
        events = tmp_path / "cap" / "job" / "rank0.events.jsonl"
        assert wait_for(lambda: "gone" in kinds(events))
        report = analyze([tmp_path / "cap" / "job"])
    finally:
        wait_for(lambda: not (cgroup / "cgroup.procs").read_text().strip(), 10)
        cgroup.rmdir()
    assert report.verdict is Verdict.HOST_OOM
    (capture,) = report.facts.captures
    assert capture.killed_for_memory and capture.gone is not None
    assert capture.gone.oom_kills == 1
    assert report.top is not None and report.top.id == "host_oom_killed"
    assert report.top.confidence >= 0.75
    assert not report.missing  # nothing left to capture by hand
    if capture.gone.kernel_lines:  # the kernel log was readable: its kill line is cited
        assert report.facts.kernel_oom_kills()[0].pid == capture.pid
