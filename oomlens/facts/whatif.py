"""Facts of a what-if replay: a recorded allocation history fed to a model of PyTorch's caching
allocator under other settings (:mod:`oomlens.analysis.whatif`).

Sizes are bytes.  Event indices are positions in the device's trace (``device_traces[d]``);
``-1`` means before its first event (the memory already in use when the recording began did not
fit under the setting).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.facts import SourceRef

COVERS_WHOLE_RUN = "whole run"
COVERS_UP_TO_OOM = "up to the recorded OOM"


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """The limit a replay runs under.

    ``source``: ``--allowed`` (given), ``allowed`` (a memory fraction, inferred from the trace
    to within ``uncertainty`` bytes either way), ``capacity`` (the device's capacity at the
    recorded OOM: reserved + its free memory, exact), ``log`` (the OOM message's figure for
    this process, as printed, narrowed by what the trace shows: see :class:`LoggedLimit`), or
    ``none`` (the recording never hit a limit: the replay runs without one).  ``fraction`` says
    whether a per-process memory fraction is in force (torch runs
    ``garbage_collection_threshold`` only then).
    """

    bytes: int | None
    source: str
    uncertainty: int
    fraction: bool


@dataclass(frozen=True, slots=True)
class LoggedLimit:
    """The limit the OOM message in the log printed for the process a snapshot recorded.

    ``fraction`` True: the message's ``X allowed`` (a per-process memory fraction was set);
    False: no fraction was set (a 2.1+ message prints ``allowed`` whenever one is), so the
    limit was the device's memory: PyTorch's reserved bytes + the device's free memory at the
    OOM.  ``bytes`` is the figure as printed, ``error`` the most the printed figures (two
    decimals of GiB or MiB) can be off by.  ``source`` is the message's place in the log.
    """

    bytes: int
    error: int
    fraction: bool
    source: SourceRef


@dataclass(frozen=True, slots=True)
class TraceCoverage:
    """How much of the run the recording holds.

    ``from_process_start`` is True when nothing was reserved before the first event (the trace
    reaches back to the process start, or to a moment when the allocator held nothing).
    Otherwise ``reserved_at_start`` / ``live_at_start`` are what the allocator held then, as
    rewound from the final segments; ``inferred_block_sizes`` counts blocks in use at the start
    whose size had to be inferred, ``unplaced_blocks`` those no segment could hold (a rewind
    the trace does not explain).  ``ends_at_oom``: the last event is an OOM (the run died
    there, as far as the recording tells).
    """

    entries: int
    from_process_start: bool
    reserved_at_start: int
    live_at_start: int
    live_blocks_at_start: int
    inferred_block_sizes: int
    unplaced_blocks: int
    ends_at_oom: bool


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """The recording replayed under its own setting and limit, compared with what it shows.

    ``passed`` only when every segment event (allocation, free, map, unmap: kind, address and
    size), the reserved bytes after every request that changed them, every block address and
    every OOM agree.  ``first_mismatch`` says where they first did not.
    """

    passed: bool
    segment_events: int
    segment_events_matched: int
    reserved_checks: int
    reserved_matched: int
    allocations: int
    addresses_matched: int
    recorded_ooms: tuple[int, ...]
    replayed_ooms: tuple[int, ...]
    first_mismatch: str | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One replay's outcome and figures.

    ``outcome`` is ``oom`` when the model runs out at a request the recording served, or at the
    recording's final OOM; else ``fits``.  ``oom_request_bytes`` is that request as the trace
    records it.  ``reserved_unallocated_at_recorded_oom_bytes``: reserved minus allocated once
    the request the recording failed on was handled (the OOM message's "reserved by PyTorch but
    unallocated" when it fails again).  ``headroom_bytes``, when it fits (None without a
    limit): how far the limit could come down with the run still going exactly as replayed --
    limit - peak reserved, except under a memory fraction with expandable segments, where the
    fraction is checked against reserved + the segment asked for rather than the pages mapped
    (reserved may end up to a page above the fraction): limit - the highest such check.
    ``shortfall_bytes`` = reserved + the segment asked for - limit at
    the OOM; ``live_too_large``: at the OOM the bytes in use plus the request alone exceed the
    limit (no setting of the allocator can help).
    """

    outcome: str
    oom_event_index: int | None
    oom_request_bytes: int | None
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    reserved_at_start_bytes: int
    reserved_unallocated_at_recorded_oom_bytes: int | None
    headroom_bytes: int | None
    shortfall_bytes: int | None
    live_too_large: bool | None


@dataclass(frozen=True, slots=True)
class Prediction:
    """One setting replayed.

    ``alloc_conf`` is the ``PYTORCH_CUDA_ALLOC_CONF`` value replayed ('' for torch's defaults),
    ``baseline`` True for the recorded setting itself.  ``covers`` is
    :data:`COVERS_WHOLE_RUN`, or :data:`COVERS_UP_TO_OOM` when the recording ends at its OOM
    and this setting survives it (what the run would have done next is not recorded).
    ``packed_start`` is the outcome when the memory in use at a mid-run start is allocated
    afresh under this setting instead of kept where the recording shows it (None when the
    trace reaches the process start).  ``conclusive`` is True only when the self-check passed,
    both starts agree, and the margin (head-room or shortfall) exceeds the limit's uncertainty:
    only then is the prediction a forecast.
    """

    alloc_conf: str
    baseline: bool
    limit: MemoryLimit
    result: ReplayResult
    covers: str
    packed_start: ReplayResult | None
    conclusive: bool
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WhatIf:
    """A snapshot's recording and the settings replayed on it (one device)."""

    source: SourceRef
    device: int
    recorded_alloc_conf: str
    recorded_notes: tuple[str, ...]
    coverage: TraceCoverage
    recorded_limit: MemoryLimit
    recorded: ReplayResult
    self_check: SelfCheck
    predictions: tuple[Prediction, ...]


@dataclass(frozen=True, slots=True)
class ReplayVerdict:
    """What a replay says about one fix, for the rules (``oomlens analyze``).

    ``trustworthy`` when the prediction is conclusive (see :class:`Prediction`); ``reason``
    says why not otherwise.  ``headroom_bytes`` is set when it fits; ``live_too_large`` when
    it runs out because the memory in use plus the request exceed the limit.
    """

    alloc_conf: str
    outcome: str
    trustworthy: bool
    headroom_bytes: int | None
    live_too_large: bool | None
    covers: str
    reason: str
    limit: MemoryLimit | None = None
    """The limit replayed (None: none known)."""
    limit_basis: str = ""
    """Where that limit comes from, in words (the trace, or the log's OOM message)."""
