"""Helpers several rules share: the numbers of an OOM message, evidence builders, and the
questions about model states and memory models that more than one rule must answer the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from oomlens.analysis.failure_site import phase_of, phase_site
from oomlens.analysis.oom_arithmetic import ROUNDING_BYTES, MessageBalance, balance
from oomlens.diagnosis import Evidence, EvidenceKind, Figure, Fix, in_bytes
from oomlens.facts import SourceRef
from oomlens.facts.capture import RankCapture
from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import (
    ExceptionEvent,
    Frame,
    LogFacts,
    OomEvent,
    OomKind,
    OomMessage,
    Phase,
)
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
    "an allocator snapshot at the OOM: run the job under python -m oomlens.capture (it dumps "
    "one per rank the moment the allocator gives up), or call "
    "torch.cuda.memory._record_memory_history(max_entries=100000) at start and dump "
    "torch.cuda.memory._snapshot() from an out-of-memory observer "
    "(torch._C._cuda_attach_out_of_memory_observer)"
)
CAPTURE_MEMORY_SERIES = (
    "memory after every step: run the job under python -m oomlens.capture (it records it per "
    "rank), or log torch.cuda.memory_allocated() and memory_reserved() each step (DeepSpeed: "
    'see_memory_usage(..., force=True), or "memory_breakdown": true)'
)
CAPTURE_CONFIG = (
    "the ds_config.json the job ran with (python -m oomlens.capture records it as DeepSpeed "
    'resolved it; or set "log_level": "info" so DeepSpeed prints it)'
)
CAPTURE_KERNEL = (
    "the node's kernel log for the job's time: run the job under python -m oomlens.capture "
    "(it records the cgroup's OOM kills and, where readable, the kernel's lines), or "
    "dmesg -T | grep -i -E 'killed process|oom' "
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
    kind = {"error_file": EvidenceKind.ERROR_FILE, "capture": EvidenceKind.CAPTURE}.get(
        event.origin, EvidenceKind.LOG
    )
    prefix = f"{event.message.exception_class}: " if event.message.exception_class else ""
    return Evidence(kind, quote(prefix + event.message.text), event.source, note, verbatim=True)


def as_printed(exception: ExceptionEvent) -> bool:
    """Whether ``exception_line`` of ``exception`` is its line as printed (a class put before a
    text that did not name it is not)."""
    return exception_line(exception) == exception.text


def exception_line(exception: ExceptionEvent) -> str:
    """The exception as printed, ``class: message``: its text, which starts with its class when
    it was read from an exception line; the class put before a text that does not name it (a
    C++ exception's ``what():``)."""
    cls, text = exception.exception_class, exception.text
    if not text:
        return cls
    if not cls or text == cls or text.startswith(cls + ":"):
        return text
    return f"{cls}: {text}"


def phase(event: OomEvent) -> Phase:
    """The failure's phase: the reader's, or what the innermost frames show when it has none
    (``oomlens.analysis.failure_site``)."""
    return phase_of(event)[0]


def phase_evidence(event: OomEvent) -> Evidence | None:
    where, frame = phase_of(event)
    if where is Phase.UNKNOWN or frame is None:
        return None
    return Evidence(
        EvidenceKind.LOG,
        f"phase {where.value}: {frame}",
        phase_site(event),
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
    if phase(event) is not Phase.OPTIMIZER_STEP:
        return False
    return failed_before_training(facts, event)


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
    return zero3_gather_frame(event) is not None


def zero3_gather_frame(event: OomEvent) -> Frame | None:
    """The innermost traceback frame of ``event`` that is a ZeRO-3 parameter gather."""
    if event.traceback is None:
        return None
    return next((f for f in reversed(event.traceback.frames) if f.function in _GATHER_FRAMES), None)


def frame_site(event: OomEvent, frame: Frame) -> SourceRef:
    """Where ``frame`` of ``event``'s traceback was read (its ``File ...`` line); the
    traceback's start when that line is unknown (an error file's call stack, a capture)."""
    assert event.traceback is not None
    if frame.at is None:
        return event.traceback.source
    return replace(event.traceback.source, line=frame.at, rank=event.source.rank)


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
    for capture in facts.captured_kills()[:2]:
        evidence.append(
            captured_kill_evidence(
                capture, "page-locked (pinned) host buffers count as shared resident memory"
            )
        )
        pinned = captured_pinned_bytes(capture)
        if pinned:
            shmem = max(shmem or 0, pinned)
    if kills or facts.captured_kills():
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


def host_kill_seen(facts: RunFacts) -> bool:
    """The kernel's log or a capture's cgroup counters show an OOM kill."""
    return bool(facts.kernel_oom_kills() or facts.captured_kills())


def captured_kill_evidence(capture: RankCapture, note: str) -> Evidence:
    """A captured rank that vanished while its cgroup counted an OOM kill, with its last host
    sample (what it held when it was killed)."""
    gone = capture.gone
    who = f"rank {capture.rank}" if capture.rank is not None else "the process"
    text = (
        f"{who} (pid {capture.pid}) disappeared without an exit record; the cgroup's "
        f"memory.events oom_kill went {gone.oom_kill_before} -> {gone.oom_kill_after}"
        if gone is not None
        else f"{who} disappeared without an exit record"
    )
    host = capture.host_memory
    last = host.last if host is not None else None
    if last is not None:
        parts = [f"RSS {size(last.rss)}"]
        if last.rss_shmem:
            parts.append(f"shared (pinned) {size(last.rss_shmem)}")
        if last.cgroup_current is not None and last.cgroup_max:
            parts.append(f"cgroup {size(last.cgroup_current)} of {size(last.cgroup_max)}")
        text += "; last sample: " + ", ".join(parts)
    return Evidence(
        EvidenceKind.CAPTURE, text, gone.source if gone is not None else capture.source, note
    )


def captured_pinned_bytes(capture: RankCapture) -> int | None:
    """The most shared (pinned) resident memory a captured rank held."""
    host = capture.host_memory
    if host is None or host.rss_shmem is None:
        return None
    return int(host.rss_shmem.maximum)


def message_balance(n: OomMessage, thresholds: Thresholds) -> MessageBalance:
    """The OOM message's balance sheet (``oomlens.analysis.oom_arithmetic``), a listed process
    counting as this job when it holds what the allocator reserved plus at most
    ``other_process_self_match_bytes``."""
    return balance(n, thresholds.other_process_self_match_bytes)


def oversized(n: OomMessage) -> bool:
    """The request alone is larger than the whole card (or a 1 EB lower bound was printed)."""
    return n.message_format == "exabyte" or balance(n, 0).oversized


def oversized_evidence(event: OomEvent) -> Evidence:
    n = event.message
    return Evidence(
        EvidenceKind.DERIVED,
        f"the request ({size(n.tried_to_allocate)}) is larger than the whole card "
        f"({size(n.total_capacity)})",
        event.source,
        "no batch size or memory setting makes room for it: not a lack of memory",
        supports=False,
    )


def self_listed_evidence(event: OomEvent, b: MessageBalance) -> Evidence | None:
    """A listed ``Process N`` that is this job seen from a container, with the arithmetic."""
    if b.self_listed is None or b.reserved is None:
        return None
    return Evidence(
        EvidenceKind.DERIVED,
        f"process {b.self_listed.pid} holds {size(b.self_listed.bytes)}: this process' allocator "
        f"reserved {size(b.reserved)} (allocated {size(b.allocated)} + reserved but unallocated "
        f"{size(b.message.reserved_unallocated)}) and the message has no 'this process has' "
        "clause",
        event.source,
        "that process is this job itself under its host pid (a container), not another one",
    )


def demand_exceeds_card(b: MessageBalance, thresholds: Thresholds) -> bool:
    """This process' own tensors filled what it could use: live tensors hold most of what it
    could reach, the request did not fit in the free memory plus its allocator's cached free
    blocks (or those were few: a defragmented allocator would fail too), other holders took
    little (a CUDA context's worth aside), and the request is not larger than the card."""
    shortfall, live = b.shortfall, b.live_share
    if shortfall is None or live is None or b.capacity is None or b.oversized:
        return False
    if live < thresholds.own_tensors_min_fraction:
        return False
    cached_little = b.unallocated is not None and b.unallocated < max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * (b.limit or b.capacity),
    )
    if shortfall <= 0 and not cached_little:
        return False  # the memory was there, in cached pieces: fragmentation's question
    return b.capped or _little_held_elsewhere(b, thresholds)


def _little_held_elsewhere(b: MessageBalance, thresholds: Thresholds) -> bool:
    """Other holders of the card (listed processes, memory no one accounts for beyond a CUDA
    context's worth) took little of it."""
    unlisted = b.outside_unlisted or 0
    if unlisted < thresholds.other_process_unlisted_min_bytes:
        unlisted = 0  # a CUDA context's worth
    held_elsewhere = unlisted + b.others_total
    return held_elsewhere < thresholds.other_process_unlisted_fraction * (b.capacity or 0)


def request_fills_card(b: MessageBalance, thresholds: Thresholds) -> bool:
    """This process' own demand filled what it could use, with one large request as much of
    it as the live tensors (``demand_exceeds_card`` asks the live tensors alone to fill it):
    live tensors plus the request hold most of what it could reach, the request did not fit in
    the free memory (as printed, to its rounding: a few cached blocks cannot join it), its
    allocator cached little (no fragmentation question), others took little, and the request
    is not larger than the card."""
    if (
        b.allocated is None
        or b.request is None
        or b.reserved is None
        or b.free is None
        or b.unallocated is None
        or b.capacity is None
        or b.oversized
        or b.request + ROUNDING_BYTES < b.free
        or demand_exceeds_card(b, thresholds)
    ):
        return False
    reachable = b.limit if b.capped and b.limit is not None else b.reserved + b.free
    if not reachable or (b.allocated + b.request) / reachable < thresholds.own_tensors_min_fraction:
        return False
    if b.unallocated >= max(
        thresholds.fragmentation_min_unallocated_bytes,
        thresholds.fragmentation_min_unallocated_fraction * (b.limit or b.capacity),
    ):
        return False
    return b.capped or _little_held_elsewhere(b, thresholds)


def fullness(n: OomMessage) -> str:
    """How full the card was, in the message's own numbers (or that it printed none)."""
    if n.allocated_by_pytorch is None or n.limit is None:
        if n.tried_to_allocate is not None:
            return f"{size(n.tried_to_allocate)} more was needed"
        return "the message carries no allocator numbers"
    return (
        f"{size(n.allocated_by_pytorch)} allocated of {size(n.limit)} {n.limit_name} when "
        f"{size(n.tried_to_allocate)} more was needed"
    )


def failed_before_training(facts: RunFacts, event: OomEvent) -> bool:
    """The failure came before any training step completed, as far as the log can tell: no
    progress line before it where the log has progress lines, or, where it has none, a log
    that shows the job starting (a parameter count, DeepSpeed's config dump or world info).
    A paste of the error alone says nothing about when it came."""
    done = steps_completed_before(facts, event)
    if done is not None:
        return done == 0
    log = log_of(facts, event.source)
    if log is None or log.steps.total:
        return False
    return any(fact is not None for fact in (log.param_count, log.config_dump, log.world_size))


def printed_line(facts: RunFacts, source: SourceRef) -> str | None:
    """The text of the line at ``source`` when the log kept it (its last lines), else None."""
    log = log_of(facts, source)
    if log is None or source.line is None:
        return None
    for number, text in log.tail:
        if number == source.line:
            return text
    return None
