"""Rules read off the caching allocator's own numbers: fragmentation, other processes on the
GPU, and memory this process holds outside PyTorch's allocator.

The OOM message alone separates these from a true capacity problem: "reserved by PyTorch but
unallocated" is memory the allocator holds but cannot hand out (at OOM time, after it has
released every whole free segment), "Process N has X memory in use" is somebody else's memory,
and "this process has X in use" minus what PyTorch reserved is the CUDA context, NCCL and other
libraries.  A snapshot then shows the stuck blocks themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import ClassVar

from oomlens.facts import SourceRef
from oomlens.facts.log import OomKind
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import MemoryCategory
from oomlens.facts.whatif import COVERS_UP_TO_OOM, ReplayVerdict
from oomlens.rules._common import (
    CAPTURE_SNAPSHOT,
    OomNumbers,
    SnapshotOom,
    allocator_oom,
    first_step_optimizer_oom,
    model_overflow,
    oom_evidence,
    oom_numbers,
    optimizer_state_init,
    size,
    snapshot_evidence,
    snapshot_oom_evidence,
    snapshot_ooms,
)
from oomlens.rules.base import Diagnosis, Evidence, EvidenceKind, Fix, Severity, clamp
from oomlens.rules.thresholds import Thresholds

REPLAY_FROM_START = (
    "memory history from the process start, so that the what-if replay can decide whether "
    "expandable segments would have fitted: torch.cuda.memory._record_memory_history("
    "max_entries=<enough for the whole run>) before the first CUDA allocation (then "
    "oomlens whatif SNAPSHOT)"
)


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
            "reproduces the recording exactly",
            supports=verdict.outcome == "fits",
        )
    ]


def fragmentation_fixes(
    stuck: int, expandable_on: bool, replay: ReplayVerdict | None = None
) -> tuple[Fix, ...]:
    """The fixes for fragmentation, never proposing expandable segments when already on, nor
    when a trustworthy replay shows they would not have helped."""
    fixes = []
    useless = replay is not None and replay.trustworthy and replay.outcome == "oom"
    if not expandable_on and not useless:
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


class FragmentationRule:
    id: ClassVar[str] = "fragmentation"
    title: ClassVar[str] = "Allocator fragmentation"
    explanation: ClassVar[str] = (
        "PyTorch's caching allocator keeps freed blocks inside the segments it got from the "
        "driver. A segment can only be returned when every block in it is free, so one live "
        "tensor keeps the whole segment reserved. When many segments each hold a little live "
        "memory and a lot of free space, a new request can find no free block large enough "
        "and no room for a new segment: the run dies with plenty of memory 'reserved but "
        "unallocated'. Expandable segments map memory in pages inside one growing virtual "
        "range, so free space no longer has to be contiguous in separate segments."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for snapshot_oom in snapshot_ooms(facts):
            yield from self._from_snapshot(snapshot_oom, thresholds)
        event = allocator_oom(facts)
        if event is None or event.message.kind is not OomKind.ALLOCATOR:
            return
        n = oom_numbers(event)
        if n.reserved_unallocated is None or n.limit is None or n.request is None:
            return
        stuck = n.reserved_unallocated
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
                f"{size(n.limit)} {n.limit_name}) while only {size(n.request)} was requested",
            )
        ]
        confidence = 0.3
        could_hold = n.request <= stuck
        need_fits = n.allocated is not None and n.allocated + n.request <= n.limit
        if could_hold and need_fits:
            confidence = 0.65
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"allocated {size(n.allocated)} + requested {size(n.request)} = "
                    f"{size((n.allocated or 0) + n.request)} <= {n.limit_name} {size(n.limit)}",
                    note=(
                        "the live tensors plus the request fit: the memory was there, not "
                        "contiguous"
                    ),
                )
            )
        figures = n.as_figures()
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
                unreleasable_free_bytes=state.unreleasable_free_bytes,
                unreleasable_segments=state.unreleasable_segments,
                largest_free_block=state.largest_free_block,
            )
            oom = device.oom
            if oom is not None and oom.snapshot_at_oom and not oom.fits_largest_free_block:
                confidence += 0.2
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
                    event.source,
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
        confidence, replayed, missing = _weigh_replay(
            replay, confidence, located[0].source if located is not None else None
        )
        evidence.extend(replayed)
        fixes = fragmentation_fixes(stuck, expandable_on, replay)
        if located is None:
            missing = (CAPTURE_SNAPSHOT,)
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                f"{size(stuck)} of GPU memory was reserved by PyTorch but unusable when a "
                f"{size(n.request)} request failed (allocated {size(n.allocated)} of "
                f"{size(n.limit)} {n.limit_name})"
            ),
            evidence=tuple(evidence),
            fixes=fixes,
            missing=missing,
            rank=event.rank,
            figures=figures,
        )

    def _from_snapshot(self, s: SnapshotOom, thresholds: Thresholds) -> Iterator[Diagnosis]:
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
        evidence.extend(replayed)
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                f"{size(stuck)} of GPU memory was reserved by PyTorch but unusable when a "
                f"{size(s.request)} request failed ({size(s.allocated)} allocated)"
            ),
            evidence=tuple(evidence),
            fixes=fragmentation_fixes(stuck, expandable_on, replay),
            missing=("the job's log with the OOM message (card capacity and limit)", *missing),
            rank=s.snapshot.source.rank,
            figures={
                "tried_to_allocate": s.request,
                "reserved_unallocated": stuck,
                "allocated_by_pytorch": s.allocated,
                "largest_free_block": oom.largest_free_block,
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


class OtherProcessRule:
    id: ClassVar[str] = "other_process"
    title: ClassVar[str] = "Another process holds GPU memory"
    explanation: ClassVar[str] = (
        "The OOM message lists every other process NVML sees on the same GPU with the memory "
        "it holds. Memory held by another process (a leftover job, a notebook, a DataLoader "
        "worker that touched CUDA, another rank placed on the same GPU) is simply not there "
        "for this one. Inside containers NVML may show this very process under its host pid; "
        "oomlens ignores a single listed process whose size matches this process' own."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for s in snapshot_ooms(facts):
            if s.device_exhausted:
                yield Diagnosis(
                    id=self.id,
                    title=self.title,
                    severity=Severity.HIGH,
                    confidence=0.45,
                    summary=(
                        f"the device had only {size(s.device_free)} free while this process "
                        f"reserved {size(s.reserved)}: unless the card is that small, other "
                        "processes or memory outside PyTorch held the rest"
                    ),
                    evidence=(snapshot_oom_evidence(s, "the device itself was full"),),
                    missing=(
                        "the OOM message from the log (it lists every process on the GPU), "
                        "or nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
                    ),
                    rank=s.snapshot.source.rank,
                    figures={"device_free": s.device_free, "reserved": s.reserved},
                )
        event = allocator_oom(facts)
        if event is None:
            return
        n = oom_numbers(event)
        others = event.message.other_processes
        if not others or n.total is None:
            return
        if n.process_in_use is None and len(others) == 1 and n.reserved is not None:
            # Containers: NVML reports this process under its host pid.
            if abs(others[0].bytes - n.reserved) <= 2 * 1024**3:
                return
        held = n.others or 0
        share = held / n.total
        if share < thresholds.other_process_min_fraction:
            return
        confidence = 0.6
        if share >= 0.5 or (n.process_in_use is not None and held > n.process_in_use):
            confidence = 0.85
        if n.free is not None and n.request is not None and n.free < n.request:
            confidence += 0.05
        listing = ", ".join(f"pid {p.pid}: {size(p.bytes)}" for p in others[:5])
        evidence = [
            oom_evidence(
                event,
                f"other processes hold {size(held)} ({share:.0%} of the {size(n.total)} card); "
                f"this process holds {size(n.process_in_use)}",
            ),
            Evidence(
                EvidenceKind.DERIVED,
                f"other processes on device {event.message.device}: {listing}",
                event.source,
            ),
        ]
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.HIGH,
            confidence=clamp(confidence),
            summary=(
                f"{len(others)} other process(es) held {size(held)} of the GPU's "
                f"{size(n.total)}; only {size(n.free)} was free for a {size(n.request)} request"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Find and stop the other process, or run where the GPU is yours alone.",
                    command=(
                        "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                        "--format=csv  # on the node; SLURM: --exclusive or --gres=gpu:N"
                    ),
                    predicted_saving_bytes=held,
                    cost="none",
                ),
                Fix(
                    "If the other process is your own DataLoader worker or a second rank on the "
                    "same GPU, make sure workers never touch CUDA and each rank calls "
                    "torch.cuda.set_device(local_rank) before any CUDA work.",
                    cost="code change",
                ),
            ),
            rank=event.rank,
            figures={**n.as_figures(), "other_processes_share": round(share, 3)},
        )


class NonPytorchMemoryRule:
    id: ClassVar[str] = "non_pytorch_memory"
    title: ClassVar[str] = "Memory outside PyTorch's allocator"
    explanation: ClassVar[str] = (
        "This process holds GPU memory that PyTorch's caching allocator does not manage: the "
        "CUDA context (0.3-0.7 GiB), cuBLAS/cuDNN handles, NCCL communication buffers (hundreds "
        "of MiB to several GiB per rank), and other libraries' allocations (cupy, JAX, "
        "TensorRT). None of it shows in memory_allocated() or in snapshots."
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None:
            return
        n: OomNumbers = oom_numbers(event)
        outside = n.non_pytorch_self
        if outside is None or outside < thresholds.non_pytorch_self_max_bytes:
            return
        share = outside / n.total if n.total else 0.0
        yield Diagnosis(
            id=self.id,
            title=self.title,
            severity=Severity.MEDIUM,
            confidence=clamp(0.35 + share),
            summary=(
                f"this process held {size(outside)} of GPU memory outside PyTorch's allocator "
                f"(in use {size(n.process_in_use)}, PyTorch reserved {size(n.reserved)})"
            ),
            evidence=(
                oom_evidence(
                    event,
                    f"{size(n.process_in_use)} in use by this process - {size(n.reserved)} "
                    f"reserved by PyTorch = {size(outside)} elsewhere",
                ),
            ),
            fixes=(
                Fix(
                    "Shrink NCCL's buffers if they are the cause (set NCCL_DEBUG=INFO to see "
                    "their sizes), and keep other GPU libraries from preallocating.",
                    environment={
                        "NCCL_BUFFSIZE": "2097152",
                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                    },
                    cost="NCCL: possibly slower collectives",
                ),
            ),
            missing=("NCCL's own report of its buffers: NCCL_DEBUG=INFO",),
            rank=event.rank,
            figures={**n.as_figures(), "non_pytorch_bytes": outside},
        )
