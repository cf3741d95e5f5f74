"""The run's derived facts (``oomlens.derive.run``): the limit the log's OOM message printed
for a process reaches the replay of that process's snapshot.

On the corpus' ``activation_memory`` run (a 16 GiB memory fraction, recorded from the process
start) the trace alone brackets the fraction to +-32 MiB, and expandable segments replayed under
the middle of that bracket run out by 2 MiB: no forecast.  The OOM message prints
``16.00 GiB allowed`` (+-5.12 MiB); under it the replay fits with 14 MiB to spare, more than the
figure's rounding: a forecast.  The expected figures come from the case's ``case.json``
(measured on the GPU), not from oomlens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.whatif import replay_verdict
from oomlens.derive.run import logged_limit
from oomlens.facts.log import OomEvent
from oomlens.facts.snapshot import DeviceAnalysis
from oomlens.facts.whatif import ReplayVerdict
from oomlens.ingest import kinds
from oomlens.ingest.snapshot import load_snapshot
from oomlens.session import gather_facts
from oomlens.units import printed_size_error
from tests._corpus import case_dir

MiB = 1024**2


def measured(case: str, rank: int) -> dict[str, Any]:
    """The OOM message of ``rank`` as the corpus recorded it on the GPU."""
    data = json.loads((case_dir(case) / "case.json").read_text())
    message: dict[str, Any] = data["measured"]["oom_messages_by_rank"][str(rank)]
    return message


def replays(paths: list[Path]) -> dict[int, DeviceAnalysis]:
    """The analysed device of each snapshot among ``paths``' facts, by the snapshot's rank."""
    facts = gather_facts(paths)
    found = {}
    for snapshot, device in facts.snapshot_devices():
        if device.replay is not None:
            assert snapshot.source.rank is not None
            found[snapshot.source.rank] = device
    return found


def oom_events(case: str) -> tuple[OomEvent, ...]:
    return gather_facts([case_dir(case) / "train.log"]).oom_events()


def verdict(device: DeviceAnalysis) -> ReplayVerdict:
    assert device.replay is not None
    return device.replay


def test_the_snapshot_alone_cannot_tell_whether_expandable_segments_fit() -> None:
    alone = replays(sorted(case_dir("activation_memory").glob("snapshot_rank*.pickle")))
    assert sorted(alone) == [0, 1]
    for device in alone.values():
        replay = verdict(device)
        assert not replay.trustworthy
        assert replay.limit is not None and replay.limit.source == "allowed"
        assert replay.limit.uncertainty > 20 * MiB
        assert "within the limit's uncertainty" in replay.reason


@pytest.mark.parametrize("rank", [0, 1])
def test_the_logs_allowed_figure_turns_the_replay_into_a_forecast(rank: int) -> None:
    message = measured("activation_memory", rank)
    with_log = replays([case_dir("activation_memory")])
    replay = verdict(with_log[rank])
    assert replay.trustworthy, replay.reason
    assert replay.outcome == "fits" and replay.headroom_bytes is not None
    limit = replay.limit
    assert limit is not None and limit.source == "log" and limit.fraction
    assert limit.bytes is not None
    # The printed figure, to within its rounding, which is all the uncertainty left.
    assert limit.uncertainty <= printed_size_error(message["allowed"])
    assert abs(limit.bytes - message["allowed"]) <= limit.uncertainty
    assert replay.headroom_bytes > limit.uncertainty
    # Each rank's snapshot takes its own rank's message.
    assert "train.log:" in replay.limit_basis and f"(rank {rank})" in replay.limit_basis


def test_a_message_of_another_rank_or_device_gives_no_limit() -> None:
    events = oom_events("activation_memory")
    own = logged_limit(events, 1, 1)
    assert own is not None and own.source.rank == 1 and own.fraction
    assert own.bytes == measured("activation_memory", 1)["allowed"]
    assert logged_limit(events, 1, 0) is None  # rank 1 ran on device 1
    assert logged_limit(events, 7, 0) is None  # no message of rank 7, none without a rank


def test_a_full_device_is_what_pytorch_reserved_plus_the_free_memory() -> None:
    # other_process: another process filled the card; no memory fraction was set.
    message = measured("other_process", 0)
    logged = logged_limit(oom_events("other_process"), 0, 0)
    assert logged is not None and not logged.fraction
    reserved = message["allocated_by_pytorch"] + message["reserved_unallocated"]
    assert abs(logged.bytes - (reserved + message["free"])) <= logged.error
    # The trace's own figure (reserved + the device's free memory, exact) agrees and stands.
    trace_only = replays(sorted(case_dir("other_process").glob("snapshot_rank*.pickle")))
    with_log = replays([case_dir("other_process")])
    exact, narrowed = verdict(trace_only[0]).limit, verdict(with_log[0]).limit
    assert exact is not None and exact.source == "capacity" and exact.uncertainty == 0
    assert exact.bytes is not None
    assert narrowed == exact
    assert abs(logged.bytes - exact.bytes) <= logged.error


def test_a_limit_the_trace_contradicts_is_not_used() -> None:
    # accumulation_derived_micro ran under 12 GiB: not the activation run's 16 GiB.
    other = logged_limit(oom_events("accumulation_derived_micro"), 0, 0)
    assert other is not None and other.bytes == measured("accumulation_derived_micro", 0)["allowed"]
    snapshot = load_snapshot(case_dir("activation_memory") / "snapshot_rank0.pickle")
    replay = replay_verdict(snapshot, 0, "expandable_segments:True", logged=other)
    assert replay is not None and replay.limit is not None
    assert replay.limit.source == "allowed" and not replay.trustworthy
    assert "which the trace contradicts: not used" in replay.limit_basis


def test_the_logs_are_read_before_the_snapshots() -> None:
    # Digest hands a snapshot the OOM messages of the logs and error files read before it.
    order = [kind.id for kind in kinds.KINDS]
    assert order.index("training_log") < order.index("snapshot_pickle")
    assert order.index("elastic_error") < order.index("snapshot_pickle")


@pytest.mark.parametrize(
    ("printed", "error"),
    [
        (512, 0),
        (1023, 0),
        (1024, 6),  # "1024 bytes" or "1.00 KiB"
        (1025, 6),
        (2 * MiB, 5243),
        (1024 * MiB, 5368710),
        (16 * 1024 * MiB, 5368710),
    ],
)
def test_a_printed_size_is_off_by_at_most_half_its_last_digit(printed: int, error: int) -> None:
    assert printed_size_error(printed) == error
