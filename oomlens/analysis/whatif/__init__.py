"""What-if: replay a snapshot's recorded allocations under another allocator setting.

A snapshot recorded with memory history holds the sequence of requests and frees that led to
its OOM.  Fed to a model of torch's caching allocator (:mod:`.allocator_model`) under another
``PYTORCH_CUDA_ALLOC_CONF`` (:mod:`.alloc_conf`) or another memory limit, it tells whether the
run would have survived and with how much room.

Entry points:

* :func:`run_whatif(snapshot, settings, device=, allowed=) <run_whatif>` ->
  :class:`~oomlens.facts.whatif.WhatIf`: rewind the snapshot to the start of its trace
  (:mod:`.rewind`), self-check the model against the recording (:mod:`.selfcheck`), and replay
  each setting (:mod:`.replay`);
* :func:`default_ladder(recorded) <default_ladder>`: the settings tried when none are given;
* :func:`replay_verdict(snapshot, device, change) <replay_verdict>` ->
  :class:`~oomlens.facts.whatif.ReplayVerdict`: the verdict on one fix, for ``analyze``;
* :func:`with_replays(snapshot, analysis, logged) <with_replays>`: the snapshot's allocator
  analysis with that verdict on expandable segments for each device that ran out with memory
  reserved but unallocated (``oomlens.derive.run`` calls it as it digests a snapshot, with
  the limit the log's OOM message printed for the same process when there is one).

Raises :class:`~oomlens.errors.InputError` when the snapshot has no allocation history to
replay, or a trace entry is malformed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from oomlens.analysis.whatif.alloc_conf import (
    AllocConf,
    AllocConfError,
    parse_alloc_conf,
    recorded_conf,
)
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit
from oomlens.analysis.whatif.limits import InferredLimit, infer_limit, narrow
from oomlens.analysis.whatif.replay import (
    InconsistentTraceError,
    ReplayRun,
    external_releases,
    replay,
)
from oomlens.analysis.whatif.rewind import StartState, rewind
from oomlens.analysis.whatif.selfcheck import self_check
from oomlens.errors import InputError
from oomlens.facts.snapshot import DeviceAnalysis, HistoryMode, Snapshot, SnapshotAnalysis
from oomlens.facts.whatif import (
    COVERS_UP_TO_OOM,
    COVERS_WHOLE_RUN,
    LoggedLimit,
    MemoryLimit,
    Prediction,
    ReplayResult,
    ReplayVerdict,
    SelfCheck,
    TraceCoverage,
    WhatIf,
)
from oomlens.units import format_size

__all__ = [
    "AllocConf",
    "AllocConfError",
    "InconsistentTraceError",
    "default_ladder",
    "parse_alloc_conf",
    "replay_verdict",
    "run_whatif",
    "with_replays",
]

REPLAYED_FIX = "expandable_segments:True"
"""The allocator change ``analyze`` replays for a device that ran out fragmented."""
REPLAY_MAX_ENTRIES = 2_000_000
"""``analyze`` replays no longer trace (the replay's time grows with the trace's length)."""

LADDER = (
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:256",
    "max_split_size_mb:1024",
    "garbage_collection_threshold:0.6",
)
"""The changes tried when no setting is given, each on top of the recorded setting."""

_TRACE_KEYS = ("action", "size", "stream")
_REPLAYED_ACTIONS = frozenset(
    {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
    }
)


def default_ladder(recorded: AllocConf) -> list[AllocConf]:
    """:data:`LADDER`, each change applied on top of ``recorded`` (later keys win, as in
    torch); changes that leave the recorded setting as it was are dropped."""
    settings = []
    for change in LADDER:
        base = recorded.canonical()
        combined = f"{base},{change}" if base else change
        conf = parse_alloc_conf(combined)
        if conf.canonical() != recorded.canonical():
            settings.append(conf.with_text(conf.canonical()))
    return settings


def choose_device(snapshot: Snapshot, device: int | None) -> int:
    """``device``, checked; else the device whose trace has an OOM, else the busiest one."""
    traces = snapshot.raw.device_traces
    where = snapshot.source.path
    if snapshot.history is not HistoryMode.ALLOC_HISTORY:
        raise InputError(
            where,
            "the snapshot holds no allocation history to replay",
            "record with torch.cuda.memory._record_memory_history(enabled='all', "
            "max_entries=<enough for the whole run>) before the first CUDA allocation",
        )
    if device is not None:
        if device < 0 or device >= len(traces) or not _has_events(traces[device]):
            raise InputError(where, f"device {device} has no recorded allocations")
        return device
    with_oom = [
        index
        for index, trace in enumerate(traces)
        if any(type(entry) is dict and entry.get("action") == "oom" for entry in trace)
    ]
    if with_oom:
        return with_oom[0]
    return max(range(len(traces)), key=lambda index: len(traces[index]))


def _has_events(trace: list[Any]) -> bool:
    return any(entry.get("action") != "snapshot" for entry in trace)


def _checked_trace(where: str, device: int, trace: list[Any]) -> None:
    """Every entry the replay reads must have the types torch writes (other actions, such as
    ``snapshot`` markers and annotations, are passed over)."""
    for index, entry in enumerate(trace):
        action = entry.get("action")
        if action not in _REPLAYED_ACTIONS:
            continue
        for key in _TRACE_KEYS:
            value = entry.get(key)
            expected = str if key == "action" else int
            if type(value) is not expected:
                raise InputError(
                    where,
                    f"device_traces[{device}][{index}] ({action}) has no valid {key!r}",
                    "the trace is damaged",
                )
        if action != "oom" and type(entry.get("addr")) is not int:
            raise InputError(
                where, f"device_traces[{device}][{index}] ({action}) has no valid 'addr'"
            )


class _Context:
    """What every replay of one snapshot device shares."""

    def __init__(self, snapshot: Snapshot, device: int, logged: LoggedLimit | None = None) -> None:
        self.snapshot = snapshot
        self.device = device
        self.trace: list[Any] = snapshot.raw.device_traces[device]
        _checked_trace(snapshot.source.path, device, self.trace)
        self.conf, self.notes = recorded_conf(snapshot.allocator_settings)
        self.releases = external_releases(self.trace)
        arithmetic = CachingAllocatorModel(self.conf, Limit())
        self.start: StartState = rewind(
            snapshot.raw.segments,
            self.trace,
            device,
            round_size=arithmetic.round_size,
            max_split_size=self.conf.max_split_size,
        )
        self.inferred: InferredLimit = narrow(
            infer_limit(
                self.trace,
                self.start.reserved,
                request_segment=lambda size: arithmetic.allocation_size(
                    arithmetic.round_size(size)
                ),
                gc_threshold=self.conf.garbage_collection_threshold,
                releases=self.releases,
            ),
            logged,
        )
        self.recorded_limit = _memory_limit(self.inferred)
        self.check, self.check_run = self_check(
            self.trace, self.start, self.conf, _model_limit(self.recorded_limit), self.releases
        )
        last = [entry["action"] for entry in self.trace if entry["action"] != "snapshot"]
        self.ends_at_oom = bool(last) and last[-1] == "oom"

    def coverage(self) -> TraceCoverage:
        start = self.start
        return TraceCoverage(
            entries=len(self.trace),
            from_process_start=start.empty,
            reserved_at_start=start.reserved,
            live_at_start=start.live_bytes,
            live_blocks_at_start=start.live_blocks,
            inferred_block_sizes=start.inferred_sizes,
            unplaced_blocks=start.unplaced,
            ends_at_oom=self.ends_at_oom,
        )

    def predict(self, conf: AllocConf, limit: MemoryLimit, *, baseline: bool) -> Prediction:
        """Replay ``conf`` under ``limit``.  The recorded setting under the recorded limit is
        the recording itself: its start is the recorded one, and it is as good as the
        self-check."""
        model_limit = _model_limit(limit)
        run = replay(self.trace, self.start, conf, model_limit, releases=self.releases)
        result = _result(run, limit)
        reproduction = baseline and limit == self.recorded_limit
        packed: ReplayResult | None = None
        if not self.start.empty and not reproduction:
            packed_run = replay(
                self.trace, self.start, conf, model_limit, packed=True, releases=self.releases
            )
            packed = _result(packed_run, limit)
        notes = []
        conclusive = self.check.passed
        if not self.check.passed:
            notes.append("the self-check failed: the model does not reproduce this recording")
        if packed is not None and packed.outcome != result.outcome:
            conclusive = False
            notes.append(
                f"{result.outcome} with the memory held at the trace's start laid out as "
                f"recorded, {packed.outcome} with it allocated afresh under this setting: "
                "the part of the run before the recording decides"
            )
        if reproduction:
            pass
        elif limit.bytes is None:
            conclusive = False
            notes.append("no limit known: pass --allowed to predict against one")
        else:
            margin = result.headroom_bytes if result.outcome == "fits" else result.shortfall_bytes
            # An exact limit decides even with nothing to spare (torch refuses only above it).
            uncertain = limit.uncertainty > 0 and margin is not None
            if margin is not None and (margin < 0 or uncertain and margin <= limit.uncertainty):
                conclusive = False
                notes.append(
                    f"the margin ({format_size(margin)}) is within the limit's uncertainty "
                    f"(+-{format_size(limit.uncertainty)})"
                )
        if run.continued_after_oom:
            notes.append(
                "the recording goes on after an OOM the program caught; the replay follows "
                "what the recorded run did next"
            )
        if run.unknown_frees:
            notes.append(f"{run.unknown_frees} frees of blocks the rewind did not know")
        covers = COVERS_WHOLE_RUN
        if self.ends_at_oom and result.outcome == "fits":
            covers = COVERS_UP_TO_OOM
        return Prediction(
            alloc_conf=conf.text,
            baseline=baseline,
            limit=limit,
            result=result,
            covers=covers,
            packed_start=packed,
            conclusive=conclusive,
            notes=tuple(notes),
        )


def _memory_limit(inferred: InferredLimit) -> MemoryLimit:
    if inferred.value is None:
        return MemoryLimit(None, "none", 0, fraction=False)
    fraction = inferred.kind == "allowed"
    source = "log" if inferred.from_log else inferred.kind
    return MemoryLimit(inferred.value, source, inferred.uncertainty, fraction=fraction)


def _model_limit(limit: MemoryLimit) -> Limit:
    if limit.bytes is None:
        return Limit()
    if limit.fraction:
        return Limit(allowed=limit.bytes)
    return Limit(capacity=limit.bytes)


def _result(run: ReplayRun, limit: MemoryLimit) -> ReplayResult:
    headroom = None
    if run.outcome == "fits" and limit.bytes is not None:
        # A memory fraction is checked against the segment asked for, the device's memory
        # against the pages taken (with expandable segments the two differ).
        headroom = limit.bytes - (run.peak_checked if limit.fraction else run.peak_reserved)
    return ReplayResult(
        outcome=run.outcome,
        oom_event_index=run.oom_index,
        oom_request_bytes=run.oom_request,
        peak_reserved_bytes=run.peak_reserved,
        peak_allocated_bytes=run.peak_allocated,
        reserved_at_start_bytes=run.reserved_at_start,
        reserved_unallocated_at_recorded_oom_bytes=run.unallocated_at_recorded_oom,
        headroom_bytes=headroom,
        shortfall_bytes=run.shortfall if run.outcome == "oom" else None,
        live_too_large=run.live_too_large if run.outcome == "oom" else None,
    )


def run_whatif(
    snapshot: Snapshot,
    settings: Sequence[AllocConf] | None = None,
    *,
    device: int | None = None,
    allowed: int | None = None,
) -> WhatIf:
    """Replay ``snapshot``'s recorded allocations under each of ``settings``.

    ``settings`` default to the recorded setting plus :func:`default_ladder`; given ones are
    whole ``PYTORCH_CUDA_ALLOC_CONF`` values (torch's defaults for anything they leave out),
    replayed after the recorded setting itself.  ``allowed`` predicts under that memory limit
    (a per-process fraction of that many bytes, or a card of that size) instead of the one the
    recording shows.  ``device`` defaults to the one that ran out.
    """
    chosen = choose_device(snapshot, device)
    context = _Context(snapshot, chosen)
    limit = context.recorded_limit
    if allowed is not None:
        limit = MemoryLimit(allowed, "--allowed", 0, fraction=True)
    recorded_text = context.conf.canonical()
    if settings is None:
        settings = default_ladder(context.conf)
    predictions = [context.predict(replace(context.conf, text=recorded_text), limit, baseline=True)]
    seen = {recorded_text}
    for conf in settings:
        key = conf.canonical()
        if key in seen:
            continue
        seen.add(key)
        predictions.append(context.predict(conf, limit, baseline=False))
    recorded = _result(context.check_run, context.recorded_limit)
    return WhatIf(
        source=snapshot.source,
        device=chosen,
        recorded_alloc_conf=recorded_text,
        recorded_notes=context.notes,
        coverage=context.coverage(),
        recorded_limit=context.recorded_limit,
        recorded=recorded,
        self_check=context.check,
        predictions=tuple(predictions),
    )


def with_replays(
    snapshot: Snapshot,
    analysis: SnapshotAnalysis,
    logged: Callable[[int], LoggedLimit | None] = lambda device: None,
    *,
    change: str = REPLAYED_FIX,
    max_entries: int = REPLAY_MAX_ENTRIES,
) -> SnapshotAnalysis:
    """``analysis`` (of ``snapshot``) with :attr:`DeviceAnalysis.replay` set to the verdict on
    ``change`` for each device that ran out with memory reserved but unallocated (the
    fragmentation the fix is for) and whose trace has at most ``max_entries`` entries.
    ``logged(device)`` is the limit the log's OOM message printed for that device of this
    process, if any: it narrows the limit the trace shows (:func:`.limits.narrow`)."""
    devices = tuple(
        _with_replay(snapshot, device, logged(device.device), change, max_entries)
        for device in analysis.devices
    )
    if devices == analysis.devices:
        return analysis
    return replace(analysis, devices=devices)


def _with_replay(
    snapshot: Snapshot,
    device: DeviceAnalysis,
    logged: LoggedLimit | None,
    change: str,
    max_entries: int,
) -> DeviceAnalysis:
    traces = snapshot.raw.device_traces
    if (
        device.oom is None
        or device.history is not HistoryMode.ALLOC_HISTORY
        or device.state.reserved_unallocated_bytes <= 0
        or device.device >= len(traces)
        or len(traces[device.device]) > max_entries
    ):
        return device
    try:
        verdict = replay_verdict(snapshot, device.device, change, logged=logged)
    except (InputError, InconsistentTraceError):
        return device  # a damaged trace: no replay, the rest of the analysis stands
    return device if verdict is None else replace(device, replay=verdict)


def replay_verdict(
    snapshot: Snapshot,
    device: int,
    change: str,
    *,
    allowed: int | None = None,
    logged: LoggedLimit | None = None,
) -> ReplayVerdict | None:
    """The replay's verdict on applying ``change`` (e.g. ``expandable_segments:True``) on top
    of the recorded setting of ``device``; None when the snapshot has no history to replay or
    the change leaves the setting as it was.  ``allowed`` replays under that limit instead
    of the recorded one; ``logged`` is the limit the log printed for this process."""
    try:
        chosen = choose_device(snapshot, device)
    except InputError:
        return None
    context = _Context(snapshot, chosen, logged)
    base = context.conf.canonical()
    conf = parse_alloc_conf(f"{base},{change}" if base else change)
    if conf.canonical() == base:
        return None
    limit = context.recorded_limit
    if allowed is not None:
        limit = MemoryLimit(allowed, "--allowed", 0, fraction=True)
    prediction = context.predict(conf.with_text(conf.canonical()), limit, baseline=False)
    basis = "--allowed" if allowed is not None else context.inferred.basis
    return verdict_of(prediction, context.check, whole_run=context.start.empty, basis=basis)


def verdict_of(
    prediction: Prediction, check: SelfCheck, *, whole_run: bool, basis: str = ""
) -> ReplayVerdict:
    """A prediction summed up for the rules; ``basis`` says where its limit comes from."""
    result = prediction.result
    if prediction.conclusive:
        reason = "self-check passed; " + (
            "the trace covers the whole run"
            if whole_run
            else "both layouts of the memory held before the trace agree"
        )
    elif not check.passed:
        reason = f"self-check failed ({check.first_mismatch})"
    else:
        reason = "; ".join(prediction.notes) or "inconclusive"
    return ReplayVerdict(
        alloc_conf=prediction.alloc_conf,
        outcome=result.outcome,
        trustworthy=prediction.conclusive,
        headroom_bytes=result.headroom_bytes,
        live_too_large=result.live_too_large,
        covers=prediction.covers,
        reason=reason,
        limit=prediction.limit if prediction.limit.bytes is not None else None,
        limit_basis=basis,
    )
