"""Allocator fragmentation: memory PyTorch reserved but could not hand out when the OOM hit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import PurePath
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_count, in_bytes
from oomlens.facts import SourceRef
from oomlens.facts.log import OomKind, OomMessage
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.facts.whatif import COVERS_UP_TO_OOM, ReplayVerdict
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_SNAPSHOT
from oomlens.rules.common.evidence import oom_evidence, oom_figures, size, snapshot_evidence
from oomlens.rules.common.message import allocator_oom, message_balance
from oomlens.rules.common.model_states import (
    SnapshotOom,
    model_overflow,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.common.timeline import first_step_optimizer_oom, optimizer_state_init
from oomlens.rules.thresholds import Thresholds

REPLAY_FROM_START = (
    "memory history from the process start, so that the what-if replay can decide whether "
    "expandable segments would have fitted: torch.cuda.memory._record_memory_history("
    "max_entries=<enough for the whole run>) before the first CUDA allocation (then "
    "oomlens whatif SNAPSHOT)"
)


def _trimmed_history(facts: RunFacts, snapshot: SourceRef | None) -> str | None:
    """The capture's words on why ``snapshot``'s history starts mid-run, when it dropped the
    oldest entries itself (the snapshot over its disk budget): then the missing history is the
    capture's setting to raise, not a recording to start by hand."""
    if snapshot is None:
        return None
    name = PurePath(snapshot.path).name
    for capture in facts.captures:
        for oom in capture.ooms:
            if oom.snapshot is not None and PurePath(oom.snapshot).name == name and oom.trace_kept:
                kept = ", ".join(f"{n:,}" for n in oom.trace_kept)
                return (
                    "the allocation history from the process start, so that the what-if replay "
                    "can decide whether expandable segments would have fitted: the capture kept "
                    f"only the last {kept} trace entries to fit its snapshot budget; raise "
                    "OOMLENS_CAPTURE_MAX_MB (--max-mb, 20 by default) and, for long runs, "
                    "OOMLENS_CAPTURE_MAX_ENTRIES (then oomlens whatif SNAPSHOT)"
                )
    return None


def replay_outcome(verdict: ReplayVerdict) -> str:
    """``replayed: fits with 1.30 GiB to spare`` / ``replayed: still runs out ...``."""
    if verdict.outcome == "fits":
        text = "replayed: fits"
        if verdict.headroom_bytes is not None:
            text += f" with {size(verdict.headroom_bytes)} to spare"
        if verdict.covers == COVERS_UP_TO_OOM:
            text += " (up to the point where the run died)"
        return text
    if verdict.live_too_large:
        return "replayed: still runs out — the live memory itself is too large"
    return "replayed: still runs out"


def replay_evidence(verdict: ReplayVerdict | None, source: SourceRef | None) -> list[Evidence]:
    """What the replay of the fix says, when it is a forecast (self-checked, conclusive)."""
    if verdict is None or not verdict.trustworthy:
        return []
    return [
        Evidence(
            EvidenceKind.DERIVED,
            f"{verdict.alloc_conf}: {replay_outcome(verdict)}",
            source,
            "the recorded allocations replayed through a model of the caching allocator that "
            "reproduces the recording exactly"
            + (f" (limit: {verdict.limit_basis})" if verdict.limit_basis else ""),
            supports=verdict.outcome == "fits",
        )
    ]


_BEFORE_EXPANDABLE = frozenset({"cached", "reserved", "thc"})
"""OOM message formats of torch builds before 2.1, which have no expandable segments (an
unknown option there stops the job at startup)."""


def torch_before_expandable(message: OomMessage) -> str | None:
    """What the message's format says of a torch build without expandable segments: None
    when it has them (or the format does not tell), else the alternative that build has."""
    if message.message_format not in _BEFORE_EXPANDABLE:
        return None
    if "max_split_size_mb" in message.text:
        return "max_split_size_mb"  # 1.10 to 2.0 print it as their own hint
    return "upgrade"


def fragmentation_fixes(
    stuck: int,
    expandable_on: bool,
    replay: ReplayVerdict | None = None,
    old_torch: str | None = None,
) -> tuple[Fix, ...]:
    """The fixes for fragmentation, never proposing expandable segments when already on, nor
    when a trustworthy replay shows they would not have helped, nor to a torch build before
    2.1 (``old_torch``, from ``torch_before_expandable``)."""
    fixes = []
    useless = replay is not None and replay.trustworthy and replay.outcome == "oom"
    if old_torch is not None and not useless:
        if old_torch == "max_split_size_mb":
            fixes.append(
                Fix(
                    "Keep the allocator from splitting large cached blocks for small requests "
                    "(this torch's own hint; from torch 2.1 on, expandable_segments:True does "
                    "better).",
                    environment={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
                    cost="a few percent slower allocations",
                )
            )
        else:
            fixes.append(
                Fix(
                    "This torch predates the allocator's fragmentation settings "
                    "(max_split_size_mb came in 1.10, expandable_segments in 2.1): upgrade "
                    "torch, or call torch.cuda.empty_cache() between phases that allocate "
                    "different sizes.",
                    cost="an upgrade, or a code change",
                )
            )
    elif not expandable_on and not useless:
        summary = (
            "Let the allocator map memory in pages inside growing segments, so free space "
            "need not be contiguous."
        )
        if replay is not None and replay.trustworthy:
            summary += f" ({replay_outcome(replay)})"
        fixes.append(
            Fix(
                summary,
                environment={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                predicted_saving_bytes=stuck,
                cost="none measurable in most training; incompatible with some CUDA-graph setups",
            )
        )
    else:
        fixes.append(
            Fix(
                "Keep big long-lived tensors from being carved out of short-lived blocks: "
                "allocate persistent buffers once, early, and make request sizes repeat (pad "
                "variable lengths to a few bucket sizes).",
                cost="code change",
            )
        )
    fixes.append(
        Fix(
            "Stop keeping small tensors alive across iterations (lists of per-step outputs on "
            "the GPU pin the segments they were carved from); move them to the CPU or keep "
            "Python numbers.",
            cost="code change",
        )
    )
    return tuple(fixes)


SPEC = RuleSpec(
    id="fragmentation",
    title="Allocator fragmentation",
    severity=Severity.HIGH,
    explanation=(
        "PyTorch's caching allocator keeps freed blocks inside the segments it got from the "
        "driver. A segment can only be returned when every block in it is free, so one live "
        "tensor keeps the whole segment reserved. When many segments each hold a little live "
        "memory and a lot of free space, a new request can find no free block large enough "
        "and no room for a new segment: the run dies with plenty of memory 'reserved but "
        "unallocated'. Expandable segments map memory in pages inside one growing virtual "
        "range, so free space no longer has to be contiguous in separate segments."
    ),
    verify=(
        "with the environment line in place, a repeat of this OOM would show little or no memory "
        "'reserved by PyTorch but unallocated'; "
        "torch.cuda.memory_stats()['inactive_split_bytes.all.current'] stays small through "
        "training."
    ),
    thresholds=(
        "fragmentation_min_unallocated_bytes",
        "fragmentation_min_unallocated_fraction",
        "other_process_self_match_bytes",
    ),
    precedence=10,
)


class FragmentationRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for snapshot_oom in snapshot_ooms(facts):
            yield from self._from_snapshot(facts, snapshot_oom, thresholds)
        event = allocator_oom(facts)
        if event is None:
            yield from self._from_summary(facts, thresholds)
            return
        if event.message.kind is not OomKind.ALLOCATOR:
            return
        n = event.message
        b = message_balance(n, thresholds)
        if b.unallocated is None or not n.limit or n.tried_to_allocate is None:
            return  # a limit of 0 is no limit torch prints: nothing to measure against
        if b.oversized:
            return  # no cache layout serves a request larger than the card
        stuck = b.unallocated
        big_enough = stuck >= max(
            thresholds.fragmentation_min_unallocated_bytes,
            thresholds.fragmentation_min_unallocated_fraction * n.limit,
        )
        if not big_enough:
            return
        evidence = [
            oom_evidence(
                event,
                f"{size(stuck)} reserved but unallocated ({stuck / n.limit:.0%} of the "
                f"{size(n.limit)} {n.limit_name}) while only {size(n.tried_to_allocate)} was "
                "requested",
            )
        ]
        confidence = 0.3
        could_hold = n.tried_to_allocate <= stuck
        allocated = b.allocated
        need_fits = allocated is not None and allocated + n.tried_to_allocate <= n.limit
        if could_hold and need_fits:
            # The message's arithmetic alone: one signal, medium; a snapshot of the blocks
            # (below) makes it decisive.
            confidence = 0.55
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"allocated {size(allocated)} + requested {size(n.tried_to_allocate)} = "
                    f"{size((allocated or 0) + n.tried_to_allocate)} <= {n.limit_name} "
                    f"{size(n.limit)}",
                    note=(
                        "the live tensors plus the request fit: the memory was there, not "
                        "contiguous"
                    ),
                )
            )
        figures = oom_figures(n)
        expandable_on = False
        replay: ReplayVerdict | None = None
        located = facts.snapshot_for(event)
        if located is not None:
            snapshot, device = located
            replay = device.replay
            state = device.state
            settings = snapshot.allocator_settings
            expandable_on = bool(settings is not None and settings.expandable_segments)
            figures.update(
                unreleasable_free_bytes=in_bytes(state.unreleasable_free_bytes),
                unreleasable_segments=a_count(state.unreleasable_segments),
                largest_free_block=in_bytes(state.largest_free_block),
            )
            oom = device.oom
            if oom is not None and oom.snapshot_at_oom and not oom.fits_largest_free_block:
                # Decisive: the blocks themselves show no free piece the request fits in
                # (0.55 + 0.3 keeps the 0.85 this signal had before the message-only reading
                # was lowered for pastes).
                confidence += 0.3
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"device {device.device}: {size(state.unreleasable_free_bytes)} free "
                        f"inside "
                        f"{state.unreleasable_segments} segments that still hold a live block; the "
                        f"largest free block usable for the request is "
                        f"{size(oom.largest_free_block)}, "
                        f"the request needed {size(oom.alloc_size_bytes)}",
                        "the snapshot at the OOM shows the free memory split into blocks too small",
                    )
                )
            elif oom is not None and oom.snapshot_at_oom and oom.fits_largest_free_block:
                confidence -= 0.25
                evidence.append(
                    snapshot_evidence(
                        snapshot,
                        f"a free block of {size(oom.largest_free_block)} could have held the "
                        f"request",
                        "a big enough free block existed, so contiguity was not the problem",
                        supports=False,
                    )
                )
        # When the model states alone cannot fit, fragmentation only decides *when* it dies.
        if first_step_optimizer_oom(facts, event) or optimizer_state_init(event):
            confidence = min(confidence, 0.35)
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"the failing allocation creates optimizer state ({event.phase_evidence})",
                    event.phase_source or event.source,
                    "states that are being created for the first time must fit whole; a "
                    "defragmented "
                    "allocator would fail at the next state tensor",
                    supports=False,
                )
            )
        overflow = model_overflow(facts)
        if overflow is not None:
            confidence = min(confidence, 0.3)
            evidence.append(
                replace(
                    overflow[0],
                    note="the config cannot fit whatever the allocator does",
                    supports=False,
                )
            )
        if expandable_on:
            evidence.append(
                snapshot_evidence(
                    located[0] if located else facts.snapshots[0],
                    "allocator settings: expandable_segments is already on",
                    "the usual fix is already in force",
                )
            )
        source = located[0].source if located is not None else None
        confidence, replayed, missing = _weigh_replay(replay, confidence, source)
        trimmed = _trimmed_history(facts, source) if missing == (REPLAY_FROM_START,) else None
        if trimmed is not None:
            missing = (trimmed,)
        evidence.extend(replayed)
        fixes = fragmentation_fixes(stuck, expandable_on, replay, torch_before_expandable(n))
        if located is None:
            missing = (CAPTURE_SNAPSHOT,)
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"{size(stuck)} of GPU memory was reserved by PyTorch but unusable when a "
                f"{size(n.tried_to_allocate)} request failed (allocated "
                f"{size(n.allocated_by_pytorch)} of "
                f"{size(n.limit)} {n.limit_name})"
            ),
            evidence=tuple(evidence),
            fixes=fixes,
            missing=missing,
            rank=event.rank,
            figures=figures,
        )

    def _from_summary(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        """``torch.cuda.memory_summary()`` printed after an OOM, without the message: reserved
        memory far above the peak of live tensors is the cache holding memory it cannot use."""
        for log in facts.logs:
            for summary in log.allocator_summaries:
                peak = summary.allocated_peak
                reserved = summary.reserved_peak or summary.reserved_current
                if not summary.ooms or peak is None or reserved is None:
                    continue
                stuck = reserved - peak
                if reserved < 2 * peak or stuck < thresholds.fragmentation_min_unallocated_bytes:
                    continue
                yield SPEC.diagnose(
                    confidence=0.5,
                    summary=(
                        f"the allocator reserved {size(reserved)} while its live tensors never "
                        f"exceeded {size(peak)}: {size(stuck)} of cache it could not use"
                    ),
                    evidence=(
                        Evidence(
                            EvidenceKind.LOG,
                            f"memory_summary: CUDA OOMs {summary.ooms}, cudaMalloc retries "
                            f"{summary.malloc_retries}; allocated peak {size(peak)}, reserved "
                            f"{size(reserved)}",
                            summary.source,
                            "reserved at least twice the peak of live memory, and an OOM: "
                            "free memory split into blocks too small to reuse",
                        ),
                    ),
                    fixes=fragmentation_fixes(stuck, False),
                    missing=(
                        "the OOM message itself (what was requested, how much was free)",
                        CAPTURE_SNAPSHOT,
                    ),
                    figures={
                        "allocated_peak": in_bytes(peak),
                        "reserved": in_bytes(reserved),
                    },
                )
                return

    def _from_snapshot(
        self, facts: RunFacts, s: SnapshotOom, thresholds: Thresholds
    ) -> Iterator[Diagnosis]:
        """A snapshot without its log: the stuck bytes and the failing request are in it."""
        state, oom = s.device.state, s.device.oom
        if oom is None or not oom.snapshot_at_oom:
            return
        stuck = s.reserved_unallocated
        if stuck < max(
            thresholds.fragmentation_min_unallocated_bytes,
            thresholds.fragmentation_min_unallocated_fraction * s.limit,
        ):
            return
        if oom.fits_largest_free_block or s.request > state.unreleasable_free_bytes:
            return
        confidence = 0.7
        evidence = [
            snapshot_oom_evidence(s, "stuck free memory larger than the failing request"),
            snapshot_evidence(
                s.snapshot,
                f"{size(state.unreleasable_free_bytes)} free inside {state.unreleasable_segments} "
                f"segments that still hold a live block; largest usable free block "
                f"{size(oom.largest_free_block)}",
                "the free memory is split into blocks too small for the request",
            ),
        ]
        if oom.category is MemoryCategory.OPTIMIZER_STATE:
            confidence = 0.35
            evidence.append(
                snapshot_evidence(
                    s.snapshot,
                    "the failing request creates optimizer state",
                    "states created for the first time must fit whole",
                    supports=False,
                )
            )
        settings = s.snapshot.allocator_settings
        expandable_on = bool(settings is not None and settings.expandable_segments)
        replay = s.device.replay
        confidence, replayed, missing = _weigh_replay(replay, confidence, s.snapshot.source)
        trimmed = (
            _trimmed_history(facts, s.snapshot.source) if missing == (REPLAY_FROM_START,) else None
        )
        if trimmed is not None:
            missing = (trimmed,)
        evidence.extend(replayed)
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"{size(stuck)} of GPU memory was reserved by PyTorch but unusable when a "
                f"{size(s.request)} request failed ({size(s.allocated)} allocated)"
            ),
            evidence=tuple(evidence),
            fixes=fragmentation_fixes(stuck, expandable_on, replay),
            missing=("the job's log with the OOM message (card capacity and limit)", *missing),
            rank=s.snapshot.source.rank,
            figures={
                "tried_to_allocate": in_bytes(s.request),
                "reserved_unallocated": in_bytes(stuck),
                "allocated_by_pytorch": in_bytes(s.allocated),
                "largest_free_block": in_bytes(oom.largest_free_block),
            },
        )


def _weigh_replay(
    replay: ReplayVerdict | None, confidence: float, source: SourceRef | None
) -> tuple[float, list[Evidence], tuple[str, ...]]:
    """Confidence, evidence and missing evidence from the replay of expandable segments: a
    forecast that it fits confirms fragmentation, one that it still runs out weakens it."""
    if replay is None:
        return confidence, [], ()
    if not replay.trustworthy:
        return confidence, [], (REPLAY_FROM_START,)
    cited = replay_evidence(replay, source)
    if replay.outcome == "fits":
        return confidence + 0.1, cited, ()
    return confidence - 0.25, cited, ()


RULE = FragmentationRule()
