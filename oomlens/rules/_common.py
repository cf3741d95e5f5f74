"""Helpers several rules share: the numbers of an OOM message, evidence builders, and the
questions about model states and memory models that more than one rule must answer the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from oomlens.diagnosis import Evidence, EvidenceKind, Figure, Fix, in_bytes
from oomlens.facts import SourceRef
from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import LogFacts, OomEvent, OomKind, OomMessage, Phase
from oomlens.facts.memory_model import CapacityVerdict
from oomlens.facts.run import RunFacts
from oomlens.facts.snapshot import DeviceAnalysis, MemoryCategory, SnapshotAnalysis
from oomlens.rules.thresholds import Thresholds
from oomlens.units import format_size

MODEL_STATE_CATEGORIES = frozenset(
    {MemoryCategory.PARAMETERS, MemoryCategory.GRADIENTS, MemoryCategory.OPTIMIZER_STATE}
)
QUOTE_LIMIT = 400
CAPTURE_SNAPSHOT = (
    "an allocator snapshot at the OOM: call torch.cuda.memory._record_memory_history("
    "max_entries=100000) at start and dump torch.cuda.memory._snapshot() from an "
    "out-of-memory observer (torch._C._cuda_attach_out_of_memory_observer)"
)
CAPTURE_MEMORY_SERIES = (
    "memory after every step: log torch.cuda.memory_allocated() and memory_reserved() each "
    'step (DeepSpeed: see_memory_usage(..., force=True), or "memory_breakdown": true)'
)
CAPTURE_CONFIG = (
    'the ds_config.json the job ran with (or "log_level": "info" so DeepSpeed prints it)'
)
CAPTURE_KERNEL = (
    "the node's kernel log for the job's time: dmesg -T | grep -i -E 'killed process|oom' "
    "(or the scheduler's record, e.g. sacct -j JOBID -o JobID,State,MaxRSS)"
)


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """A log line or message shortened for citation (the full text stays in the input)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def oom_figures(m: OomMessage) -> dict[str, Figure]:
    """The figures of an allocator OOM message, under the message's own names."""
    return {
        "tried_to_allocate": in_bytes(m.tried_to_allocate),
        "allocated_by_pytorch": in_bytes(m.allocated_by_pytorch),
        "reserved_unallocated": in_bytes(m.reserved_unallocated),
        "free": in_bytes(m.free),
        "total_capacity": in_bytes(m.total_capacity),
        "allowed": in_bytes(m.allowed),
        "process_in_use": in_bytes(m.process_in_use),
        "other_processes": in_bytes(m.other_processes_total),
    }


def allocator_oom(facts: RunFacts) -> OomEvent | None:
    """The first failure's allocator OOM (the one with numbers), else any allocator OOM."""
    first = facts.first_gpu_oom()
    if first is not None and first.message.kind is OomKind.ALLOCATOR:
        return first
    for event in facts.gpu_oom_events():
        if event.message.kind is OomKind.ALLOCATOR:
            return event
    return first


def oom_evidence(event: OomEvent, note: str = "") -> Evidence:
    kind = EvidenceKind.ERROR_FILE if event.origin == "error_file" else EvidenceKind.LOG
    prefix = f"{event.message.exception_class}: " if event.message.exception_class else ""
    return Evidence(kind, quote(prefix + event.message.text), event.source, note)


def phase_evidence(event: OomEvent) -> Evidence | None:
    if event.phase is Phase.UNKNOWN or event.phase_evidence is None:
        return None
    return Evidence(
        EvidenceKind.LOG,
        f"phase {event.phase.value}: {event.phase_evidence}",
        event.traceback.source if event.traceback is not None else event.source,
        "the traceback frame that places the failure",
    )


def size(num: int | float | None) -> str:
    return "unknown" if num is None else format_size(num)


def snapshot_evidence(
    snapshot: SnapshotAnalysis, text: str, note: str = "", *, supports: bool = True
) -> Evidence:
    return Evidence(EvidenceKind.SNAPSHOT, text, snapshot.source, note, supports)


def config_evidence(value: ConfigValue[Any], note: str = "") -> Evidence:
    return Evidence(EvidenceKind.CONFIG, value.cite(), value.source, note)


def live_bytes(device: DeviceAnalysis, categories: Iterable[MemoryCategory]) -> int:
    wanted = set(categories)
    return sum(c.bytes for c in device.live_by_category if c.category in wanted)


def category_share(device: DeviceAnalysis, categories: Iterable[MemoryCategory]) -> float:
    allocated = device.state.allocated_bytes
    return live_bytes(device, categories) / allocated if allocated else 0.0


def effective_config(facts: RunFacts) -> EffectiveDsConfig | None:
    return facts.config.reading.effective if facts.config is not None else None


def steps_completed_before(facts: RunFacts, event: OomEvent) -> int | None:
    """The last step counter printed before the OOM in its log (None: no step lines)."""
    best: int | None = None
    for log in facts.logs:
        if log.path != event.source.path:
            continue
        for sample in log.steps.samples:
            if sample.step is None or sample.source.line is None or event.source.line is None:
                continue
            if sample.source.line < event.source.line:
                best = sample.step if best is None else max(best, sample.step)
    return best


def any_steps(facts: RunFacts) -> bool:
    return any(log.steps.total for log in facts.logs)


def log_of(facts: RunFacts, source: SourceRef) -> LogFacts | None:
    for log in facts.logs:
        if log.path == source.path:
            return log
    return None


def first_step_optimizer_oom(facts: RunFacts, event: OomEvent) -> bool:
    """The OOM happened in the optimizer step before any step completed: the optimizer's
    states (created lazily at the first step) did not fit."""
    if event.phase is not Phase.OPTIMIZER_STEP:
        return False
    done = steps_completed_before(facts, event)
    if done is not None:
        return done == 0
    log = log_of(facts, event.source)
    return log is not None and log.steps.total == 0


def optimizer_state_init(event: OomEvent) -> bool:
    """The failing allocation creates optimizer state (torch ``_init_group``, DeepSpeed
    ``initialize_optimizer_states`` / ``_create_fp32_partitions``)."""
    if event.traceback is None:
        return False
    names = {f.function for f in event.traceback.frames[-6:]}
    return bool(
        names
        & {
            "_init_group",
            "initialize_optimizer_states",
            "_create_fp32_partitions",
            "_init_state",
            "init_state",
        }
    )


@dataclass(frozen=True, slots=True)
class SnapshotOom:
    """An OOM known only from a snapshot's ``oom`` trace entry (no log says it).

    ``limit`` is what the process could use, estimated from the snapshot alone: its reserved
    bytes, plus the device's free bytes when those were below the request (no per-process cap:
    the device itself was full).  ``device_exhausted`` says which case it was.
    """

    snapshot: SnapshotAnalysis
    device: DeviceAnalysis
    request: int
    allocated: int
    reserved: int
    reserved_unallocated: int
    device_free: int | None

    @property
    def device_exhausted(self) -> bool:
        return self.device_free is not None and self.device_free < self.request

    @property
    def limit(self) -> int:
        extra = self.device_free if self.device_exhausted and self.device_free else 0
        return self.reserved + extra

    def where(self) -> str:
        oom = self.device.oom
        site = oom.site.describe() if oom is not None and oom.site is not None else "unknown site"
        return f"device {self.device.device}, request from {site}"


def snapshot_ooms(facts: RunFacts) -> list[SnapshotOom]:
    """Snapshot OOMs that no log OOM event accounts for (a snapshot without its log)."""
    if any(e.message.kind is OomKind.ALLOCATOR for e in facts.gpu_oom_events()):
        return []
    found = []
    for snapshot, device in facts.snapshot_devices():
        oom = device.oom
        if oom is None:
            continue
        state = device.state
        found.append(
            SnapshotOom(
                snapshot=snapshot,
                device=device,
                request=oom.alloc_size_bytes,
                allocated=state.allocated_bytes + state.private_pool_free_bytes,
                reserved=state.reserved_bytes,
                reserved_unallocated=state.reserved_unallocated_bytes,
                device_free=oom.device_free_bytes,
            )
        )
    return found


def snapshot_oom_evidence(s: SnapshotOom, note: str = "") -> Evidence:
    oom = s.device.oom
    category = oom.category if oom is not None else MemoryCategory.UNKNOWN
    what = "" if category is MemoryCategory.UNKNOWN else f" ({category.value.replace('_', ' ')})"
    return snapshot_evidence(
        s.snapshot,
        f"oom entry on {s.where()}: {size(s.request)} needed{what}; "
        f"{size(s.allocated)} allocated, {size(s.reserved_unallocated)} reserved but unallocated, "
        f"{size(s.device_free)} free on the device",
        note,
    )


#: Memory-model components (``oomlens.analysis.zero_model``) that are model states.
MODEL_STATE_COMPONENTS = frozenset(
    {
        "param_partition",
        "param_full",
        "grad_partition",
        "grads",
        "fp32_master",
        "optimizer_states",
        "step_fp32_grads",
        "init_fp32_grad_buffer",
        "hpz_secondary",
    }
)


def model_overflow(facts: RunFacts) -> tuple[Evidence, CapacityVerdict] | None:
    """The memory model's GPU verdict when it says the config cannot fit the card."""
    model = facts.memory_model
    if model is None:
        return None
    verdict = model.verdict("gpu")
    if verdict is None or verdict.overflow_bytes <= 0:
        return None
    blamed = verdict.overflow_component
    text = (
        f"ZeRO memory model: {size(verdict.required_bytes)} needed per GPU at its peak "
        f"({verdict.peak_phase}) vs {size(verdict.capacity_bytes)} ({verdict.capacity_source}); "
        f"first overflow at {verdict.overflow_phase}"
        + (f", largest allocation there: {blamed.name} {size(blamed.bytes)}" if blamed else "")
    )
    source = facts.params.source if facts.params is not None else None
    note = (
        f"for {facts.params.total:,} parameters ({facts.params.origin}) on "
        f"{facts.world_size.value if facts.world_size else '?'} GPUs"
        if facts.params is not None
        else ""
    )
    return Evidence(EvidenceKind.DERIVED, text, source, note), verdict


def model_patch_fixes(facts: RunFacts, limit: int = 2) -> list[Fix]:
    """The memory model's best config patches as fixes, with their predicted savings."""
    model = facts.memory_model
    if model is None:
        return []
    fixes = []
    for patch in model.patches[:limit]:
        merge = patch.merge_patch()
        if not merge:
            continue
        fixes.append(
            Fix(
                patch.summary[:1].upper() + patch.summary[1:] + ".",
                config_patch=merge,
                predicted_saving_bytes=patch.gpu_bytes_saved,
                cost=patch.cost,
            )
        )
    return fixes


def kernel_kill_evidence(kill: KernelOomKill, note: str) -> Evidence:
    """The kernel's ``Killed process`` line as evidence (shmem-rss is where pinned pages show)."""
    scope = "Memory cgroup out of memory" if kill.cgroup else "Out of memory"
    return Evidence(
        EvidenceKind.KERNEL,
        f"{scope}: Killed process {kill.pid} ({kill.process_name}) anon-rss "
        f"{size(kill.anon_rss)}, shmem-rss {size(kill.shmem_rss)}",
        kill.source,
        note,
    )


_GATHER_FRAMES = frozenset(
    {
        "fetch_sub_module",
        "_all_gather",
        "all_gather_coalesced",
        "_all_gather_params",
        "__all_gather_params",
        "_fetch_sub_module_impl",
    }
)


def near_full(n: OomMessage, thresholds: Thresholds) -> bool:
    if n.limit is None or n.allocated_by_pytorch is None:
        return False
    request = n.tried_to_allocate or 0
    return n.allocated_by_pytorch + request >= thresholds.capacity_near_full_fraction * n.limit


def little_stuck(n: OomMessage, thresholds: Thresholds) -> bool:
    if n.reserved_unallocated is None or n.limit is None:
        return True
    return n.reserved_unallocated < max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * n.limit,
    )


def in_zero3_gather(event: OomEvent) -> bool:
    if event.traceback is None:
        return False
    return any(f.function in _GATHER_FRAMES for f in event.traceback.frames)


def capacity_evidence(event: OomEvent, n: OomMessage) -> Evidence:
    return oom_evidence(
        event,
        f"allocated {size(n.allocated_by_pytorch)} of {size(n.limit)} {n.limit_name}, only "
        f"{size(n.reserved_unallocated)} cached: the live tensors themselves filled the card",
    )


def others_dominate(n: OomMessage, thresholds: Thresholds) -> bool:
    return (
        n.other_processes_total is not None
        and n.total_capacity is not None
        and n.other_processes_total >= thresholds.others_dominate_fraction * n.total_capacity
    )


def leaf_key(value: ConfigValue[Any]) -> str:
    return value.key_path.rsplit(".", 1)[-1]


def host_kill_evidence(facts: RunFacts) -> tuple[list[Evidence], float, int | None]:
    """Evidence that host memory ran out, a confidence for it, and the pinned bytes the kernel
    saw (shmem-rss) per killed process."""
    evidence: list[Evidence] = []
    confidence = 0.0
    shmem: int | None = None
    kills = facts.kernel_oom_kills()
    for kill in kills[:2]:
        evidence.append(
            kernel_kill_evidence(kill, "page-locked (pinned) host buffers are counted as shmem-rss")
        )
        if kill.shmem_rss:
            shmem = max(shmem or 0, kill.shmem_rss)
    if kills:
        confidence = 0.75
    killed_at = facts.sigkilled_at()
    if killed_at is not None:
        evidence.append(
            Evidence(
                EvidenceKind.LOG,
                f"a rank was killed with SIGKILL ({killed_at})",
                None,
                "what the OOM killer does; no Python traceback is left",
            )
        )
        confidence = max(confidence, 0.5)
    return evidence, confidence, shmem
