"""The self-check that makes a replay trustworthy: the recording, replayed under the setting
and limit it was made with, must come out as the recording shows.

Compared, request by request (:func:`oomlens.analysis.whatif.replay.replay` in checking
mode): every segment the allocator allocated, freed, mapped or unmapped (kind, address, size,
in order), the reserved bytes after each request that changed them, the address of every block
handed out, and the OOMs (the model must run out at the very requests the recording ran out on,
and at no other).  New segments take the recorded addresses (the driver's choice, which no model
can predict); everything else is the model's own decision.  A prediction made from a recording
whose self-check fails is reported as such, never as a forecast.
"""

from __future__ import annotations

from typing import Any

from oomlens.analysis.whatif.alloc_conf import AllocConf
from oomlens.analysis.whatif.allocator_model import Limit
from oomlens.analysis.whatif.replay import ReplayRun, replay
from oomlens.analysis.whatif.rewind import StartState
from oomlens.facts.whatif import SelfCheck


def self_check(
    trace: list[Any],
    start: StartState,
    conf: AllocConf,
    limit: Limit,
    releases: dict[int, int] | None = None,
) -> tuple[SelfCheck, ReplayRun]:
    """Replay ``trace`` under the recorded ``conf`` and ``limit`` and compare; see the module
    docstring.  Returns the verdict and the run (its figures are the recording's own)."""
    run = replay(trace, start, conf, limit, check=True, releases=releases)
    agreement = run.agreement
    assert agreement is not None
    recorded_ooms = tuple(index for index, entry in enumerate(trace) if entry["action"] == "oom")
    replayed = list(run.recorded_ooms_replayed)
    if run.oom_index is not None and run.oom_index not in replayed:
        replayed.append(run.oom_index)
    first = agreement.first_mismatch
    stopped_early = run.oom_index is not None and run.oom_index not in recorded_ooms
    if start.unplaced and first is None:
        first = f"{start.unplaced} blocks in use at the start fit in no segment the rewind found"
    if run.unknown_frees and first is None:
        first = f"{run.unknown_frees} frees of blocks the rewind did not know"
    if tuple(replayed) != recorded_ooms and first is None:
        first = f"the recording runs out at events {list(recorded_ooms)}, the model at {replayed}"
    passed = (
        first is None
        and not stopped_early
        and agreement.segment_matched == agreement.segment_events
        and agreement.addresses_matched == agreement.allocations
        and agreement.reserved_matched == agreement.reserved_checks
    )
    return (
        SelfCheck(
            passed=passed,
            segment_events=agreement.segment_events,
            segment_events_matched=agreement.segment_matched,
            reserved_checks=agreement.reserved_checks,
            reserved_matched=agreement.reserved_matched,
            allocations=agreement.allocations,
            addresses_matched=agreement.addresses_matched,
            recorded_ooms=recorded_ooms,
            replayed_ooms=tuple(replayed),
            first_mismatch=first,
        ),
        run,
    )
