"""glibc's allocator held steady for the log reader's pass: what the pass frees is kept, not
faulted in again; one arena for its threads; given back when the last pass leaves."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from oomlens.ingest.log import batches, heap, read_log
from oomlens.ingest.log import reader as reader_module

ROOT = Path(__file__).resolve().parents[3]
needs_glibc = pytest.mark.skipif(heap._libc() is None, reason="glibc's mallopt")

_FAULTS = textwrap.dedent(
    """
    import resource, sys, threading
    from oomlens.ingest.log import heap

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    parts = [bytes([n]) * (1 << 20) for n in range(8)]

    def join_batches():  # as a scanning thread joins a batch's blocks, again and again
        for _ in range(20):
            joined = b"".join(parts)
            del joined

    def measured():
        join_batches()
        before = faults()
        thread = threading.Thread(target=join_batches)
        thread.start()
        thread.join()
        join_batches()
        return faults() - before

    if sys.argv[1] == "steady":
        with heap.steady_heap():
            print(measured())
    else:
        print(measured())
    """
)


def _printed(script: str, *args: str) -> list[str]:
    """What ``script`` printed, run in a fresh process (glibc's settings are per process)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.split()


def _faults(mode: str) -> int:
    return int(_printed(_FAULTS, mode)[0])


@needs_glibc
def test_batches_joined_in_a_new_thread_are_not_faulted_in_again() -> None:
    # a batch of 8 MiB is 2,048 pages: glibc's defaults fault a thread's first ones in (an
    # arena of its own); held steady, the thread reuses what the main thread freed
    assert _faults("default") >= 1024
    assert _faults("steady") < 256


_RSS = textwrap.dedent(
    """
    import sys
    from oomlens.ingest.log import heap

    def rss_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    def allocate_and_free():  # 48 MiB in buffers of 4 MiB, freed top first
        buffers = [bytearray(4 << 20) for _ in range(12)]
        for buffer in buffers:
            buffer[::4096] = b"x" * len(buffer[::4096])
        while buffers:
            buffers.pop()

    base = rss_mib()
    with heap.steady_heap():
        with heap.steady_heap():  # a second pass, in another thread say
            pass
        allocate_and_free()  # the first pass is still on: what it frees is kept
        kept = rss_mib() - base
    print(kept, rss_mib() - base)
    """
)


@needs_glibc
def test_what_a_pass_frees_is_kept_until_the_last_pass_leaves() -> None:
    kept, after = (float(x) for x in _printed(_RSS))
    assert kept >= 40, "freed while a pass was on: kept for the next batch"
    assert after <= 8, "the last pass left: given back"


def test_without_glibc_the_pass_runs_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_libc", lambda: None)
    with heap.steady_heap():
        assert heap._holders == 0


@contextmanager
def _recording(entered: list[str]) -> Iterator[None]:
    entered.append("pass")
    yield


def test_a_log_is_read_with_the_heap_steady_and_a_paste_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered: list[str] = []
    monkeypatch.setattr(heap, "steady_heap", lambda: _recording(entered))
    log = tmp_path / "train.log"
    log.write_text("[rank0]: step 1\n" * 1000)
    read_log(log)
    assert entered == [], "a paste is read line by line: nothing to hold"
    monkeypatch.setattr(reader_module, "LINE_BY_LINE_BYTES", 0)
    for jobs in (1, 2):
        monkeypatch.setattr(batches, "PARALLEL_MIN_BYTES", 0)
        read_log(log, jobs=jobs)
    assert entered == ["pass", "pass"]
