"""Snapshots that cost far more than their size, and snapshot paths that are not files.

Issue 12 (fuzzing): pickle memoization lets a few hundred KB list one segment 100,000 times
(10^8 blocks to walk); a gzip stream or a run of one-byte opcodes makes gigabytes from a few
MB.  Each must end quickly, in bounded memory, in one error line naming the file, what is
wrong and what to do.  The hostile pickles are built here by code from a real snapshot or
opcode by opcode; memory is measured in a fresh process (``ru_maxrss``).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from oomlens.errors import InputError, ResourceLimitError
from oomlens.ingest.snapshot import SnapshotLimits, load_snapshot
from tests.assets.snapshots import make_variants as variants

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def _dump(tmp_path: Path, data: object, name: str = "crafted.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def _one_line(error: BaseException, path: Path) -> str:
    text = str(error)
    assert text.startswith(f"{path}: ")
    assert "\n" not in text
    return text


_MEASURE = """
import json, resource, sys
from oomlens.errors import InputError
from oomlens.ingest.snapshot import load_snapshot
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_snapshot(sys.argv[1])
    outcome = "loaded"
except InputError as error:
    outcome = f"{type(error).__name__}: {error}"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "grown_mib": (peak - before) / 1024}))
"""


def _load_in_fresh_process(path: Path) -> tuple[str, float]:
    """(the error or 'loaded', how far the peak RSS rose during the load, MiB)."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["outcome"], result["grown_mib"]


# ---- walks bounded by what they visit (issue 12 item 4) -----------------------------------


@pytest.fixture
def real() -> dict[str, Any]:
    data = variants.load_real("stacks_all")
    assert isinstance(data, dict)
    return data


def _thousand_block_segment(real: dict[str, Any]) -> dict[str, Any]:
    segment = dict(real["segments"][0])
    block = segment["blocks"][0]
    segment["blocks"] = [dict(block, address=block["address"] + i * 512) for i in range(1000)]
    return segment


def test_one_segment_memoized_100000_times_is_refused_at_once(
    real: dict[str, Any], tmp_path: Path
) -> None:
    # GIVEN a ~300 KB pickle whose segment list names one 1,000-block segment 100,000 times
    real["segments"] = [_thousand_block_segment(real)] * 100_000
    path = _dump(tmp_path, real)
    assert path.stat().st_size < 400_000

    # WHEN
    start = time.monotonic()
    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    # THEN refused before walking 10^8 blocks
    assert time.monotonic() - start < 5.0
    text = _one_line(caught.value, path)
    assert "segments[1] is the very same object as segments[0] (99,999 such repeats)" in text
    assert "crafted or corrupt" in text


def test_segments_sharing_one_blocks_list_are_refused(real: dict[str, Any], tmp_path: Path) -> None:
    shared = _thousand_block_segment(real)
    real["segments"] = [dict(shared, address=i << 30) for i in range(5_000)]
    path = _dump(tmp_path, real)

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    text = _one_line(caught.value, path)
    assert "the blocks list of segment 1 is the very same object as the blocks list of" in text


def test_one_trace_memoized_for_many_devices_is_refused(
    real: dict[str, Any], tmp_path: Path
) -> None:
    real["device_traces"] = [real["device_traces"][0]] * 10_000
    path = _dump(tmp_path, real)

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    assert "device_traces[1] is the very same object as device_traces[0]" in _one_line(
        caught.value, path
    )


def test_a_history_list_shared_by_every_block_is_checked_once(
    real: dict[str, Any], tmp_path: Path
) -> None:
    # GIVEN the torch 2.0 layout, every block pointing at one 100,000-record history list
    legacy = variants.to_torch20(real)
    history = [legacy["segments"][0]["blocks"][0]["history"][0]] * 100_000
    segment = legacy["segments"][0]
    block = dict(segment["blocks"][0], history=history)
    segment["blocks"] = [dict(block) for _ in range(10_000)]
    segment["total_size"] = block["size"] * len(segment["blocks"])
    path = _dump(tmp_path, legacy)

    # WHEN
    start = time.monotonic()
    snapshot = load_snapshot(path)

    # THEN plain (if odd) data: it loads, without checking 10^9 history records
    assert time.monotonic() - start < 5.0
    assert snapshot.block_count == sum(len(s["blocks"]) for s in legacy["segments"])


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        (SnapshotLimits(max_blocks=25), "holds 26 blocks, over the limit of 25"),
        (SnapshotLimits(max_trace_entries=180), "holds 181 trace entries, over the limit of 180"),
    ],
)
def test_walk_budget_counts_blocks_and_trace_entries(limits: SnapshotLimits, problem: str) -> None:
    path = variants.REAL["stacks_all"]

    with pytest.raises(ResourceLimitError) as caught:
        load_snapshot(path, limits=limits)

    text = _one_line(caught.value, path)
    assert problem in text
    assert "raise SnapshotLimits.max_" in text


# ---- what the unpickler may build (issue 12 item 5) --------------------------------------


def test_ten_megabytes_of_empty_set_opcodes_stop_within_a_few_megabytes(tmp_path: Path) -> None:
    # GIVEN PROTO 4, MARK, 10 million EMPTY_SET, LIST, STOP: one 216-byte set per byte of file
    path = tmp_path / "sets.pickle"
    path.write_bytes(b"\x80\x04(" + b"\x8f" * 10_000_000 + b"l.")

    # WHEN loaded in a fresh process
    outcome, grown_mib = _load_in_fresh_process(path)

    # THEN refused for what it builds, long before 2 GB
    assert outcome.startswith(f"ResourceLimitError: {path}: the pickle builds ")
    assert "lists, dicts, tuples or sets" in outcome
    assert grown_mib < 150, grown_mib


def _gzip_bomb(path: Path, item_bytes: int, items: int) -> Path:
    """A gzip stream of ``items`` zero-filled ``bytes`` objects, written as concatenated gzip
    members (one item, compressed once, repeated): small on disk whatever it inflates to."""
    item = b"\x8e" + struct.pack("<Q", item_bytes) + b"\0" * item_bytes  # BINBYTES8
    member = gzip.compress(item, compresslevel=9)
    with open(path, "wb") as out:
        out.write(gzip.compress(b"\x80\x04("))  # PROTO 4, MARK
        for _ in range(items):
            out.write(member)
        out.write(gzip.compress(b"l."))  # LIST, STOP
    return path


@pytest.mark.parametrize(
    ("item_bytes", "items"),
    [(MiB, 1900), (200 * 1024, 9_500)],
    ids=["1.9GB-in-1MiB-items", "1.9GB-in-200KiB-items"],
)
def test_gzip_bomb_stops_within_a_few_megabytes(
    item_bytes: int, items: int, tmp_path: Path
) -> None:
    # GIVEN a ~2 MB gzip file inflating to about 1.9 GB of bytes objects
    path = _gzip_bomb(tmp_path / "bomb.pickle.gz", item_bytes, items)
    assert path.stat().st_size < 3 * MiB

    outcome, grown_mib = _load_in_fresh_process(path)

    assert outcome.startswith(f"ResourceLimitError: {path}: the gzip stream inflates "), outcome
    assert "compression bomb" in outcome
    assert grown_mib < 100, grown_mib


def test_total_of_large_strings_is_capped(tmp_path: Path) -> None:
    path = _dump(tmp_path, {"segments": [str(i) * 1_000_000 for i in range(1, 6)]})

    with pytest.raises(ResourceLimitError) as caught:
        load_snapshot(path, limits=SnapshotLimits(max_string_bytes=3 * MiB))

    assert "more than 3.00 MiB of strings or bytes in items over 256.00 KiB" in _one_line(
        caught.value, path
    )


def test_memory_per_byte_of_pickle_is_capped(tmp_path: Path) -> None:
    # One million distinct two-character strings: 4 bytes of pickle each, ~60 bytes of memory.
    path = tmp_path / "strings.pickle"
    path.write_bytes(b"\x80\x04(" + b"\x8c\x02ab" * 1_000_000 + b"l.")
    limits = SnapshotLimits(memory_allowance_bytes=4 * MiB, available_memory_fraction=None)

    with pytest.raises(ResourceLimitError) as caught:
        load_snapshot(path, limits=limits)

    assert "more than 12x (a real snapshot takes 4x to 6x)" in _one_line(caught.value, path)


def test_real_snapshots_stay_well_inside_the_build_limits() -> None:
    # Every real snapshot (the corpus, the samples) loads with no container allowance at all
    # and one container per 30 bytes: four times stricter than the default density.
    strict = SnapshotLimits(max_containers=0, bytes_per_container=30)
    paths = sorted((ROOT / "fixtures" / "crash_logs").glob("*/snapshot_rank*.pickle"))
    paths += sorted(variants.REAL.values())

    for path in paths:
        assert load_snapshot(path, limits=strict).block_count > 0, path
        if path.stat().st_size > 50_000:
            # and the count is real: one per 200 bytes is more than any of them builds (below
            # a few thousand containers the interpreter's free lists hide some from the count)
            with pytest.raises(ResourceLimitError, match="lists, dicts, tuples or sets"):
                load_snapshot(
                    path, limits=SnapshotLimits(max_containers=0, bytes_per_container=200)
                )


# ---- paths that are not regular files -----------------------------------------------------


def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "snapshot.pickle"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_snapshot(fifo)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # opening blocked: give it a writer so that the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_snapshot blocked opening a FIFO")

    assert len(outcome) == 1 and type(outcome[0]) is InputError
    text = _one_line(outcome[0], fifo)
    assert "is a named pipe (FIFO), not a snapshot file" in text
    assert "save the snapshot to a file first" in text


def test_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_snapshot("/dev/zero")

    assert "/dev/zero: is a character device, not a snapshot file" in str(caught.value)


# ---- the command line ---------------------------------------------------------------------


def test_cli_gives_one_line_and_the_documented_exit_code(
    real: dict[str, Any], tmp_path: Path
) -> None:
    real["segments"] = [_thousand_block_segment(real)] * 100_000
    repeated = _dump(tmp_path, real, "repeated.pickle")
    sets = tmp_path / "sets.pickle"
    sets.write_bytes(b"\x80\x04(" + b"\x8f" * 3_000_000 + b"l.")

    for path in (repeated, sets):
        done = subprocess.run(
            [sys.executable, "-m", "oomlens", "analyze", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )

        assert done.returncode == 3  # README: nothing could be read
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr
        assert str(path) in lines[0] and "crafted" in lines[0]
