"""Every snapshot of the real crash corpus (``fixtures/crash_logs/<case>/snapshot_rank*.pickle``)
loads, analyzes, and agrees with what torch itself wrote next to it.

The corpus runs dump the snapshot from an OOM observer (``_scenarios/memdebug.py``), which also
prints ``[memdebug] OOM on cuda:D (tried A bytes, F bytes free): dumped allocator snapshot to
.../snapshot_rankR.pickle``: the allocator's own ``alloc_size`` and ``device_free`` for that
very OOM.  The OOM message in the same log gives the "reserved by PyTorch but unallocated"
figure, which must match the snapshot's segments once the retry has released whole segments.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.allocator import analyze_snapshot
from oomlens.facts.snapshot import HistoryMode
from oomlens.ingest.snapshot import load_snapshot
from oomlens.ingest.snapshot.unpickler import restricted_load
from oomlens.units import parse_size

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "crash_logs"
SNAPSHOTS = sorted(CORPUS.glob("*/snapshot_rank*.pickle"))

pytestmark = pytest.mark.skipif(not SNAPSHOTS, reason="the crash corpus has no snapshots yet")

_MEMDEBUG = re.compile(
    r"\[memdebug\] OOM on cuda:(\d+) \(tried (\d+) bytes, (\d+) bytes free\): "
    r"dumped allocator snapshot to \S*?(snapshot_rank\d+\.pickle)"
)
_SIZE = r"(\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB))"
_MESSAGE = re.compile(
    r"Tried to allocate "
    + _SIZE
    + r"\. GPU (\d+) has a total capacity of "
    + _SIZE
    + r" of which "
    + _SIZE
    + r" is free\..*?Of the allocated memory "
    + _SIZE
    + r" is allocated by PyTorch, (?:with "
    + _SIZE
    + r" allocated in private pools \(e\.g\., CUDA "
    r"Graphs\), )?and " + _SIZE + r" is reserved by PyTorch but unallocated"
)
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:")


def _ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _rank(path: Path) -> int:
    match = re.search(r"rank(\d+)", path.name)
    assert match
    return int(match.group(1))


def _log_lines(case: Path) -> list[str]:
    """The case's logs: train.log and the per-rank logs some launchers write beside it."""
    lines: list[str] = []
    for log in sorted(case.glob("**/*.log")):
        if log.name != "kernel.log":
            lines.extend(log.read_text(errors="replace").splitlines())
    return lines


def _tolerance(text: str) -> int:
    """Half a unit of the last printed digit: format_size prints two decimals."""
    unit = text.split()[-1]
    return {
        "bytes": 1,
        "KiB": 6 * 2**10 // 1000,
        "MiB": 6 * 2**20 // 1000,
        "GiB": 6 * 2**30 // 1000,
    }[unit]


@pytest.mark.parametrize("path", SNAPSHOTS, ids=_ids)
def test_corpus_snapshot_is_consistent(path: Path) -> None:
    raw: Any = restricted_load(path).data
    analysis = analyze_snapshot(load_snapshot(path))

    assert analysis.source.rank == _rank(path)
    assert analysis.devices
    for device in analysis.devices:
        segments = [s for s in raw["segments"] if s["device"] == device.device]
        assert device.state.reserved_bytes == sum(s["total_size"] for s in segments)
        assert device.state.allocated_bytes == sum(s["allocated_size"] for s in segments)
        assert device.state.active_bytes == sum(s["active_size"] for s in segments)
        assert device.state.requested_bytes == sum(s["requested_size"] for s in segments)
        assert sum(item.bytes for item in device.live_by_category) == device.state.active_bytes
        if device.history is HistoryMode.ALLOC_HISTORY:
            timeline = device.timeline
            assert timeline is not None
            assert timeline.end.active_bytes == device.state.active_bytes
            assert timeline.baseline_reserved_bytes >= 0
            assert device.growth is not None and device.growth.start.active_bytes >= 0


@pytest.mark.parametrize("path", SNAPSHOTS, ids=_ids)
def test_corpus_snapshot_matches_the_case_manifest(path: Path) -> None:
    manifest = json.loads((path.parent / "case.json").read_text())
    measured = next(s for s in manifest["measured"]["snapshots"] if s["file"] == path.name)

    snapshot = load_snapshot(path)
    analysis = analyze_snapshot(snapshot)

    assert snapshot.segment_count == measured["segments"]
    assert [len(trace) for trace in snapshot.raw.device_traces] == measured["trace_entries"]
    assert (
        sum(device.state.reserved_bytes for device in analysis.devices)
        == measured["reserved_bytes"]
    )
    assert (
        sum(device.state.allocated_bytes for device in analysis.devices)
        == measured["allocated_bytes"]
    )
    assert snapshot.allocator_settings is not None
    assert snapshot.allocator_settings.raw_config == measured["allocator_settings"]
    ooms = [device.oom for device in analysis.devices if device.oom is not None]
    assert len(ooms) == 1
    assert ooms[0].request_bytes == measured["oom_entry"]["size"]
    assert ooms[0].device_free_bytes == measured["oom_entry"]["device_free"]


@pytest.mark.parametrize("path", SNAPSHOTS, ids=_ids)
def test_corpus_oom_matches_the_observer_and_the_message(path: Path) -> None:
    lines = _log_lines(path.parent)
    observed = [m for m in map(_MEMDEBUG.search, lines) if m and m.group(4) == path.name]
    if not observed:
        pytest.skip("the log has no [memdebug] line for this snapshot")
    device_index, tried, free = (int(observed[0].group(i)) for i in (1, 2, 3))

    analysis = analyze_snapshot(load_snapshot(path))
    device = analysis.device(device_index)
    assert device is not None and device.oom is not None

    # THEN the oom entry is the failure the observer saw, and the snapshot shows its state
    assert device.oom.alloc_size_bytes == tried
    assert device.oom.device_free_bytes == free
    assert device.oom.snapshot_at_oom

    # AND the OOM message of the same rank agrees with the segments
    rank = _rank(path)
    messages = []
    for line in lines:
        prefix = _RANK_PREFIX.match(line)
        if prefix and int(prefix.group(1)) != rank:
            continue
        found = _MESSAGE.search(line)
        if found:
            messages.append(found)
    if not messages:
        pytest.skip("the log holds no complete OOM message for this rank")
    state = device.state
    for message in messages:
        unallocated = message.group(7)
        if abs(parse_size(unallocated) - state.reserved_unallocated_bytes) <= _tolerance(
            unallocated
        ):
            allocated = message.group(5)
            assert abs(
                parse_size(allocated) - (state.allocated_bytes + state.private_pool_free_bytes)
            ) <= _tolerance(allocated)
            return
    pytest.fail(
        f"no OOM message of rank {rank} says {state.reserved_unallocated_bytes} bytes are reserved "
        f"but unallocated: {[m.group(7) for m in messages]}"
    )


# ---- what the facts say about cases whose cause is known (case.json "expected") ------------

GiB = 1024**3


def _device(case: str, rank: int = 0) -> Any:
    path = CORPUS / case / f"snapshot_rank{rank}.pickle"
    if not path.exists():
        pytest.skip(f"{case} is not in the corpus")
    analysis = analyze_snapshot(load_snapshot(path))
    (device,) = analysis.devices
    return device


def test_fragmentation_case() -> None:
    device = _device("fragmentation")
    state, oom = device.state, device.oom

    # 3.02 GiB free inside segments pinned by live blocks; none of it in one piece big enough.
    assert state.unreleasable_free_bytes > 0.4 * state.reserved_bytes
    assert oom.free_bytes > 50 * oom.request_bytes
    assert not oom.fits_largest_free_block
    # The survivors that pin the segments: one site, many blocks of one size.
    kept = max(device.live_by_site, key=lambda item: item.common_size_blocks)
    assert kept.common_size_blocks >= 100 and kept.site.is_user_code


def test_memory_leak_case_shows_the_pile_up_of_kept_logits() -> None:
    device = _device("memory_leak")

    # 33 steps of logits, one 62.5 MiB block each, all allocated by the model's forward.
    piled = max(device.live_by_site, key=lambda item: item.common_size_blocks * item.common_size)
    assert piled.common_size_blocks >= 30
    assert piled.common_size_blocks * piled.common_size >= 1.5 * GiB
    assert piled.site.name == "forward"
    assert device.leak is None  # the 2000-event history is shorter than one step


def test_prefetch_overshoot_case_is_full_of_gathered_parameters() -> None:
    device = _device("prefetch_overshoot")

    top = device.live_by_category[0]
    assert top.category.value == "zero3_gathered_params"
    assert top.bytes > 0.5 * device.state.allocated_bytes
    assert "all-gather" in top.evidence


def test_model_states_case_is_model_states() -> None:
    device = _device("model_states_too_large")

    model_states = {"optimizer_state", "gradients", "zero_buckets", "parameters"}
    held = sum(
        item.bytes for item in device.live_by_category if item.category.value in model_states
    )
    assert held > 0.95 * device.state.allocated_bytes


def test_activation_memory_case_is_activations() -> None:
    device = _device("activation_memory")

    top = device.live_by_category[0]
    assert top.category.value == "activations"
    assert top.bytes > 0.9 * device.state.active_bytes
    assert device.oom.category.value == "activations"


def test_other_process_case_leaves_the_device_almost_no_free_memory() -> None:
    device = _device("other_process")

    # This process reserved 13 GiB of a 140 GiB card, yet the driver had almost nothing free.
    assert device.state.reserved_bytes < 16 * GiB
    assert device.oom.device_free_bytes < 1 * GiB
