"""The run's facts, derived once from what its inputs say.

``Digest()(fact)`` turns one input's raw facts into what the run keeps of them as soon as they
are read (a snapshot becomes its allocator analysis, so that the raw snapshot - millions of
objects - is dropped before the next one is loaded).  A snapshot that ran out fragmented is
also replayed with expandable segments then (``oomlens.analysis.whatif.with_replays``), under
the limit the log's OOM message printed for the same process (``logged_limit``): the logs
are read before the snapshots (the input kinds' order), so that limit is known by then.
``derive_run(inputs, hints)`` derives everything rules and renderers ask about the whole
run: the per-rank picture, the world size, the parameter count, the host memory, the config
the run used (a file reconciled with the engine's own dump, validated at the world size), the
ZeRO memory model, and the last step.  What an ``oomlens capture`` recorded (one
``RankCapture`` per process, its files joined here) adds to each when the logs do not say it:
the ranks' OOMs, exceptions and OOM kills, the world size, the parameter count, the DeepSpeed
config as DeepSpeed resolved it, the job's cgroup limit or the node's memory, and the limit a
captured OOM ran against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from oomlens.analysis.allocator import analyze_snapshot
from oomlens.analysis.ds_resolve import reconcile_with_dump
from oomlens.analysis.ds_validation import read_and_check
from oomlens.analysis.ranks import rank_picture
from oomlens.analysis.whatif import with_replays
from oomlens.analysis.zero_model import build_budget, candidate_patches, compare_with_capacity
from oomlens.derive.account import derive_account
from oomlens.derive.context import derive_context
from oomlens.derive.failure_site import cut_tracebacks, phase_of, phase_site
from oomlens.derive.lookalikes import (
    bug_evidence,
    library_failure_explained,
    non_memory_failure_lines,
)
from oomlens.derive.pinned import pinned_failure
from oomlens.derive.rejections import config_rejections
from oomlens.derive.signals import (
    host_memory_pressure,
    normal_end,
    scheduler_end,
    shm_permission_denied,
    signal_deaths,
    silent_death,
    unseen_errors,
)
from oomlens.facts import SourceRef
from oomlens.facts.capture import RankCapture, join_captures
from oomlens.facts.config import ConfigDocument, ConfigReading
from oomlens.facts.inputs import InputFacts
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import ErrorFileFacts, LogFacts, OomEvent, OomKind, Phase
from oomlens.facts.memory_model import Capacity, MemoryModelFacts, ModelSize, Topology
from oomlens.facts.run import ConfigSource, ModelParams, RunFacts, WorldSizeFact
from oomlens.facts.signals import EventPlace, FailurePoint, Signals, event_key
from oomlens.facts.snapshot import Snapshot
from oomlens.facts.whatif import LoggedLimit
from oomlens.units import printed_size_error

GPUS_PER_NODE_GUESS = 8
"""Ranks per host when no launcher line says it (the common 8-GPU node)."""


@dataclass(frozen=True, slots=True)
class RunHints:
    """What the command line (or a caller) adds to the inputs: the parameter count, the world
    size, a card's or a host's memory in bytes, when the inputs do not say them."""

    params: int | None = None
    gpus: int | None = None
    gpu_memory: int | None = None
    host_memory: int | None = None
    prefer_deepspeed: bool = True
    """Validate configs with DeepSpeed's own models when it is installed; False keeps DeepSpeed
    (and torch with it: seconds and gigabytes) out of the process, oomlens' own checks stand in."""


class Digest:
    """Digests one run's facts in the order they are read (see the module docstring): call it
    on each fact; it returns what the run keeps of it.  It remembers the OOM events of the
    logs and error files it has seen, for the replay of the snapshots that come after them."""

    def __init__(self) -> None:
        self._ooms: list[OomEvent] = []

    def __call__(self, fact: object) -> object:
        """Raises ``InputError`` for a snapshot whose content cannot be analyzed."""
        if isinstance(fact, LogFacts):
            self._ooms.extend(fact.oom_events)
        elif isinstance(fact, ErrorFileFacts) and fact.oom_event is not None:
            self._ooms.append(fact.oom_event)
        elif isinstance(fact, Snapshot):
            rank = fact.source.rank
            return with_replays(
                fact,
                analyze_snapshot(fact),
                lambda device: logged_limit(self._ooms, rank, device),
            )
        return fact


def logged_limit(events: Sequence[OomEvent], rank: int | None, device: int) -> LoggedLimit | None:
    """The limit the allocator's OOM messages printed for ``device`` of the process of rank
    ``rank`` (None: unknown), when they all print the same one.

    ``X allowed`` is the memory fraction.  A message without it whose device had less free
    than the request (``of which F is free`` < ``Tried to allocate``) ran out of the device
    itself: the limit was what PyTorch reserved plus that free memory.  Any other message
    says nothing certain (2.1-2.4 drop ``allowed`` even with a fraction set).  Messages of
    another rank do not count; those with no rank count only when none has this one.
    """
    on_device = [
        e for e in events if e.message.kind is OomKind.ALLOCATOR and e.message.device == device
    ]
    same_rank = [e for e in on_device if rank is not None and e.rank == rank]
    chosen = same_rank or [e for e in on_device if e.rank is None]
    limits = {_printed_limit(e) for e in chosen}
    if len(limits) != 1:
        return None
    (printed,) = limits
    if printed is None:
        return None
    limit, error, fraction = printed
    return LoggedLimit(limit, error, fraction, chosen[0].source)


def _printed_limit(event: OomEvent) -> tuple[int, int, bool] | None:
    m = event.message
    if m.allowed is not None:
        return m.allowed, printed_size_error(m.allowed), True
    figures = (m.free, m.tried_to_allocate, m.allocated_by_pytorch, m.reserved_unallocated)
    if any(figure is None for figure in figures) or not m.complete:
        return None
    free, request, allocated, unallocated = (int(figure or 0) for figure in figures)
    if free >= request:
        return None
    error = sum(printed_size_error(figure) for figure in (free, allocated, unallocated))
    return allocated + unallocated + free, error, False


def derive_run(inputs: InputFacts, hints: RunHints) -> RunFacts:
    """Every fact of the run (see the module docstring)."""
    logs = inputs.logs
    captures = join_captures(inputs.captures)
    world = _world_size(logs, hints) or _captured_world_size(captures)
    host_memory, host_origin = _host_memory(logs, hints, captures)
    facts = RunFacts(
        inputs=inputs.reports,
        logs=logs,
        error_files=inputs.error_files,
        kernel_logs=inputs.kernel_logs,
        snapshots=inputs.snapshots,
        config=_config(
            inputs.configs, logs, world, prefer_deepspeed=hints.prefer_deepspeed, captures=captures
        ),
        ranks=rank_picture(logs, inputs.error_files, inputs.kernel_logs, captures=captures),
        world_size=world,
        params=_params(logs, hints, captures),
        gpu_memory=hints.gpu_memory or _captured_gpu_memory(captures),
        host_memory=host_memory,
        host_memory_origin=host_origin,
        last_step=max(
            (log.steps.max_step for log in logs if log.steps.max_step is not None), default=None
        ),
        other_inputs=inputs.other,
        captures=captures,
    )
    facts = replace(facts, memory_model=memory_model(facts))
    context = derive_context(facts)
    facts = replace(facts, context=context, account=derive_account(facts, context))
    return replace(facts, signals=derive_signals(facts))


def derive_signals(facts: RunFacts) -> Signals:
    """Every signal of ``oomlens.facts.signals``, read once from ``facts``."""
    gpu = facts.gpu_oom_events()
    kills = facts.kernel_oom_kills()
    return Signals(
        signal_deaths=tuple(signal_deaths(facts)),
        silent_death=silent_death(facts),
        host_pressure=host_memory_pressure(facts),
        shm_denied=shm_permission_denied(facts),
        config_rejections=tuple(config_rejections(facts.logs)),
        library_bug=library_failure_explained(facts.logs, gpu),
        bug=bug_evidence(facts.logs),
        non_memory_lines=tuple(non_memory_failure_lines(facts.logs)),
        unseen_errors=tuple(unseen_errors(facts)),
        normal_end=normal_end(facts),
        scheduler_end=scheduler_end(facts),
        pinned=pinned_failure(facts),
        cut_tracebacks=cut_tracebacks(facts),
        places={event_key(e): EventPlace(*phase_of(e), phase_site(e)) for e in facts.oom_events()},
        host_kill_seen=bool(kills or facts.captured_kills()),
        memory_series_seen=any(True for _ in facts.memory_series()),
        gpu_failure=_failure_point(facts, facts.first_gpu_oom(), ()),
        host_failure=_failure_point(facts, None, kills),
        rank_failure=_failure_point(facts, None, ()),
    )


def _failure_point(
    facts: RunFacts, event: OomEvent | None, kills: Sequence[KernelOomKill]
) -> FailurePoint:
    """What died first, led by ``event`` (a GPU OOM), else the first of ``kills``, else the
    rank that failed first; with the last step printed before it."""
    status = facts.ranks.first_failed
    source: SourceRef | None = None
    rank: int | None = None
    time: datetime | None = None
    exact = True
    kill: KernelOomKill | None = None
    if event is not None:
        source, rank, time, exact = event.source, event.rank, event.timestamp, event.timestamp_exact
        status = None
    elif kills:
        kill = kills[0]
        source, time = kill.source, kill.timestamp
        status = None
    elif status is not None:
        source, rank, time = status.first_source, status.rank, status.first_time
    if rank is None and facts.ranks.first_failed is not None:
        rank = facts.ranks.first_failed.rank
    return FailurePoint(
        event, kill, status, source, rank, time, exact, facts.step_before(rank, source)
    )


def _params(
    logs: Sequence[LogFacts], hints: RunHints, captures: Sequence[RankCapture] = ()
) -> ModelParams | None:
    if hints.params is not None:
        return ModelParams(hints.params, "command line (--params)")
    for log in logs:
        if log.param_count is not None:
            count = log.param_count
            return ModelParams(count.total, f"log ({count.origin})", count.source)
    for capture in captures:
        if capture.params:
            return ModelParams(capture.params, f"capture ({capture.params_origin})", capture.source)
    return None


def _captured_world_size(captures: Sequence[RankCapture]) -> WorldSizeFact | None:
    known = [c for c in captures if c.world_size]
    if not known:
        return None
    best = max(known, key=lambda c: c.world_size or 0)
    return WorldSizeFact(best.world_size or 0, f"capture ({best.world_size_origin})", best.source)


def _captured_gpu_memory(captures: Sequence[RankCapture]) -> int | None:
    """The limit a captured OOM ran against (the allowed maximum, else the card)."""
    for capture in captures:
        for oom in capture.ooms:
            if oom.limit:
                return oom.limit
    return None


def _host_memory(
    logs: Sequence[LogFacts], hints: RunHints, captures: Sequence[RankCapture] = ()
) -> tuple[int | None, str]:
    """One host's RAM: ``--host-memory``, else the job's cgroup limit or the node's memory a
    capture read, else what DeepSpeed's ``see_memory_usage`` implies (``CPU Virtual Memory:
    used = U GB, percent = P%`` is node-wide: total = U / P)."""
    if hints.host_memory is not None:
        return hints.host_memory, "--host-memory"
    for capture in captures:
        if capture.cgroup_limit and (
            capture.node_memory is None or capture.cgroup_limit < capture.node_memory
        ):
            return capture.cgroup_limit, f"the job's cgroup memory limit (capture {capture.path})"
        if capture.node_memory:
            return capture.node_memory, f"the node's MemTotal (capture {capture.path})"
    best: tuple[int, str] | None = None
    for log in logs:
        for series in log.memory:
            for sample in series.samples:
                if sample.cpu_used and sample.cpu_percent and sample.cpu_percent >= 1.0:
                    total = round(sample.cpu_used / (sample.cpu_percent / 100))
                    origin = f"see_memory_usage CPU line at {sample.source.describe()}"
                    if best is None or total > best[0]:
                        best = (total, origin)
    return best if best is not None else (None, "")


def _world_size(logs: Sequence[LogFacts], hints: RunHints) -> WorldSizeFact | None:
    if hints.gpus is not None:
        return WorldSizeFact(hints.gpus, "command line (--gpus)", None)
    best = None
    for log in logs:
        ws = log.world_size
        if ws is not None and float(ws.value).is_integer() and int(ws.value) >= 1:
            candidate = WorldSizeFact(
                int(ws.value), ws.origin, ws.source, lower_bound=ws.origin in _RANKS_LISTED
            )
            # a line that states the world size outranks one that only lists some ranks
            if best is None or (not candidate.lower_bound, candidate.value) > (
                not best.lower_bound,
                best.value,
            ):
                best = candidate
    if best is not None:
        return best
    ranks: set[int] = set()
    for log in logs:
        ranks.update(log.ranks_seen)
    if len(ranks) > 1:
        return WorldSizeFact(max(ranks) + 1, "ranks seen in the log", None, lower_bound=True)
    return None


_RANKS_LISTED = frozenset({"torchrun_summary"})
"""World-size origins that only list ranks (rank N says the world has more than N)."""


def _config(
    documents: Sequence[ConfigDocument],
    logs: Sequence[LogFacts],
    world: WorldSizeFact | None,
    *,
    prefer_deepspeed: bool = True,
    captures: Sequence[RankCapture] = (),
) -> ConfigSource | None:
    """The run's DeepSpeed config: the file (validated at the run's world size) reconciled with
    the engine's own dump from the log (else the one a capture recorded) when there is one."""
    from_file: ConfigReading | None = None
    if documents:
        from_file = read_and_check(
            documents[0],
            world_size=world.value if world else None,
            prefer_deepspeed=prefer_deepspeed,
        )
    dump = _log_dump(logs, captures)
    dump_origin = "log_dump" if _log_dump(logs) is not None else "capture"
    if from_file is not None and dump is not None:
        merged, differences = reconcile_with_dump(from_file.effective, dump.effective)
        notes = from_file.notes + tuple(
            f"the log's config dump differs from the file: {d.describe()}" for d in differences
        )
        reading = ConfigReading(
            raw=from_file.raw,
            effective=merged,
            problems=from_file.problems,
            hazards=from_file.hazards,
            notes=notes,
        )
        return ConfigSource(reading, f"file+{dump_origin}", dump)
    if from_file is not None:
        return ConfigSource(from_file, "file")
    if dump is not None:
        return ConfigSource(dump, dump_origin, dump)
    return None


def _log_dump(
    logs: Sequence[LogFacts], captures: Sequence[RankCapture] = ()
) -> ConfigReading | None:
    """The engine's own config dump from the logs (the first one found), else the one a
    capture recorded, as a reading whose ``raw`` is the user's JSON the dump printed."""
    dumps = [log.ds_config_dump for log in logs] + [c.ds_config for c in captures]
    for dumped in dumps:
        if dumped is not None:
            return ConfigReading(
                raw=dumped.user_config, effective=dumped.effective, notes=dumped.problems
            )
    return None


_MODEL_PHASES = {
    Phase.MODEL_INIT: "engine init",
    Phase.FORWARD: "forward/backward",
    Phase.BACKWARD: "forward/backward",
    Phase.OPTIMIZER_STEP: "optimizer step",
}


def memory_model(facts: RunFacts) -> MemoryModelFacts | None:
    """The ZeRO memory model, when the config, the parameter count and the world size are
    known; compared with the GPU capacity the OOM message (or ``--gpu-memory``) gives and the
    host memory ``--host-memory`` (or the log) gives.  None when any input is missing."""
    if facts.config is None or facts.params is None or facts.world_size is None:
        return None
    effective = facts.config.reading.effective
    world = facts.world_size.value
    topology = Topology(world_size=world, gpus_per_node=min(world, GPUS_PER_NODE_GUESS))
    model = ModelSize(
        total_params=facts.params.total, source=facts.params.origin, source_ref=facts.params.source
    )
    try:
        budget = build_budget(effective, model, topology)
    except ValueError:
        return None
    event = facts.first_gpu_oom()
    capacity: Capacity | None = None
    total = event.message.total_capacity if event is not None else None
    if event is not None and total is not None:
        m = event.message
        capacity = Capacity.from_oom_message(
            total_capacity=total,
            free=m.free,
            allocated_by_pytorch=m.allocated_by_pytorch,
            reserved_unallocated=m.reserved_unallocated,
            allowed=m.allowed,
            source=f"OOM message at {event.source.describe()}",
            host_bytes=facts.host_memory,
            host_source=facts.host_memory_origin,
        )
    elif facts.gpu_memory is not None or facts.host_memory is not None:
        capacity = Capacity(
            gpu_bytes=facts.gpu_memory,
            gpu_source="--gpu-memory",
            host_bytes=facts.host_memory,
            host_source=facts.host_memory_origin,
        )
    verdicts = tuple(compare_with_capacity(budget, capacity)) if capacity else ()
    phase = _MODEL_PHASES.get(event.phase) if event is not None else None
    patches = tuple(
        candidate_patches(effective, model, topology, capacity, verdicts=verdicts, phase=phase)
    )
    assumptions = tuple(budget.assumptions)
    if world > GPUS_PER_NODE_GUESS:
        assumptions += (f"{GPUS_PER_NODE_GUESS} GPUs per node assumed",)
    return MemoryModelFacts(budget, verdicts, patches, assumptions)
