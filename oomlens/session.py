"""One analysis, end to end: inputs -> facts -> derived facts -> rules -> report.

``analyze(paths)`` is the whole pipeline; every command (``analyze``, ``triage``, ``epilog``)
goes through it.  Bad inputs never raise: each becomes an ``InputReport`` with its problem, and
the rest is still analyzed.  Only when nothing at all could be read does it raise
``NoUsableInputError``.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from oomlens.analysis.allocator import analyze_snapshot
from oomlens.analysis.ds_resolve import reconcile_with_dump
from oomlens.analysis.ds_validation import read_and_check
from oomlens.analysis.ranks import rank_picture
from oomlens.analysis.zero_model import build_budget, candidate_patches, compare_with_capacity
from oomlens.errors import InputError, NoUsableInputError
from oomlens.facts import SourceRef
from oomlens.facts.config import ConfigReading
from oomlens.facts.log import LogFacts, Phase
from oomlens.facts.memory_model import Capacity, MemoryModelFacts, ModelSize, Topology
from oomlens.facts.run import ConfigSource, InputReport, ModelParams, RunFacts, WorldSizeFact
from oomlens.facts.snapshot import SnapshotAnalysis
from oomlens.ingest.detect import DiscoveredFile, InputKind, discover_run
from oomlens.ingest.ds_config import read_ds_config
from oomlens.ingest.run import inputs_of, read_run
from oomlens.ingest.snapshot import SnapshotLimits, load_snapshot
from oomlens.report import Report, assemble
from oomlens.rules.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """What the command line (or a caller) adds to the inputs.

    ``params``, ``gpus``, ``gpu_memory`` and ``host_memory`` fill in what the inputs may not
    say (the parameter count, the world size, a card's or host's memory in bytes).
    """

    thresholds: Thresholds = field(default_factory=Thresholds)
    params: int | None = None
    gpus: int | None = None
    gpu_memory: int | None = None
    host_memory: int | None = None
    snapshot_limits: SnapshotLimits | None = None
    max_snapshot_bytes: int | None = None
    """Snapshots larger than this are not loaded (recorded as skipped): for time-boxed callers."""
    prefer_deepspeed: bool = True
    """Validate configs with DeepSpeed's own models when it is installed; False keeps DeepSpeed
    (and torch with it: seconds and gigabytes) out of the process, oomlens' own checks stand in."""


_WARM_MODULES = (
    "oomlens.session",
    "oomlens.render.json",
    "oomlens.render.html",
    # Optional accelerators the readers import lazily.
    "ahocorasick_rs",
    "zstandard",
    "hjson",
)


def preload() -> None:
    """Import now everything an analysis will import, so that processes forked from this one
    start warm and processes that drop privileges need not read the installation again."""
    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def analyze(
    paths: Sequence[str | os.PathLike[str]],
    *,
    config: str | os.PathLike[str] | None = None,
    options: AnalysisOptions | None = None,
) -> Report:
    """Analyze the inputs of one run (files and/or run directories) and return the report."""
    options = options or AnalysisOptions()
    facts = gather_facts(paths, config=config, options=options)
    return assemble(facts, options.thresholds)


def gather_facts(
    paths: Sequence[str | os.PathLike[str]],
    *,
    config: str | os.PathLike[str] | None = None,
    options: AnalysisOptions | None = None,
) -> RunFacts:
    """Every fact of the run's inputs, plus the derived ones.  See ``analyze``."""
    options = options or AnalysisOptions()
    files, reports = _collect_inputs(paths, config)
    run_logs = read_run(
        f
        for f in files
        if f.kind is not InputKind.SNAPSHOT_PICKLE and f.kind is not InputKind.DS_CONFIG
    )
    for problem in run_logs.problems:
        reports.append(
            InputReport(problem.path, "unreadable", problem.problem, problem=problem.message)
        )
    for log in run_logs.logs:
        reports.append(
            InputReport(
                log.path,
                InputKind.TRAINING_LOG.value,
                f"{log.lines} lines",
                notes=log.notes,
                rank=log.layout_rank,
            )
        )
    for error_file in run_logs.error_files:
        reports.append(
            InputReport(error_file.path, InputKind.ELASTIC_ERROR.value, "torchelastic error file")
        )
    for kernel in run_logs.kernel_logs:
        reports.append(
            InputReport(kernel.path, InputKind.KERNEL_LOG.value, f"{kernel.lines} lines")
        )

    snapshots: list[SnapshotAnalysis] = []
    config_files: list[DiscoveredFile] = []
    for file in files:
        if file.kind is InputKind.SNAPSHOT_PICKLE:
            analysis, report = _load_snapshot(file, options)
            reports.append(report)
            if analysis is not None:
                snapshots.append(analysis)
        elif file.kind is InputKind.DS_CONFIG:
            config_files.append(file)

    ranks = rank_picture(run_logs.logs, run_logs.error_files, run_logs.kernel_logs)
    world = _world_size(run_logs.logs, options)
    config_source = _config(
        config_files, run_logs.logs, world, reports, prefer_deepspeed=options.prefer_deepspeed
    )
    params = _params(run_logs.logs, options)
    host_memory, host_origin = _host_memory(run_logs.logs, options)
    if (
        not run_logs.logs
        and not snapshots
        and not run_logs.error_files
        and not run_logs.kernel_logs
        and config_source is None
    ):
        problems = "; ".join(r.problem for r in reports if r.problem) or "no inputs"
        raise NoUsableInputError(f"nothing could be analyzed: {problems}")
    facts = RunFacts(
        inputs=tuple(reports),
        logs=run_logs.logs,
        error_files=run_logs.error_files,
        kernel_logs=run_logs.kernel_logs,
        snapshots=tuple(snapshots),
        config=config_source,
        ranks=ranks,
        world_size=world,
        params=params,
        gpu_memory=options.gpu_memory,
        host_memory=host_memory,
        host_memory_origin=host_origin,
    )
    return replace(facts, memory_model=memory_model(facts))


def _params(logs: Sequence[LogFacts], options: AnalysisOptions) -> ModelParams | None:
    if options.params is not None:
        return ModelParams(options.params, "command line (--params)")
    for log in logs:
        if log.param_count is not None:
            count = log.param_count
            return ModelParams(count.total, f"log ({count.origin})", count.source)
    return None


def _host_memory(logs: Sequence[LogFacts], options: AnalysisOptions) -> tuple[int | None, str]:
    """One host's RAM: ``--host-memory``, else what DeepSpeed's ``see_memory_usage`` implies
    (``CPU Virtual Memory: used = U GB, percent = P%`` is node-wide: total = U / P)."""
    if options.host_memory is not None:
        return options.host_memory, "--host-memory"
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


_MODEL_PHASES = {
    Phase.MODEL_INIT: "engine init",
    Phase.FORWARD: "forward/backward",
    Phase.BACKWARD: "forward/backward",
    Phase.OPTIMIZER_STEP: "optimizer step",
}


def memory_model(facts: RunFacts) -> MemoryModelFacts | None:
    """The ZeRO memory model, when the config, the parameter count and the world size are
    known; compared with the GPU capacity the OOM message (or ``--gpu-memory``) gives and the
    host memory ``--host-memory`` gives.  None when any input is missing."""
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


def _collect_inputs(
    paths: Sequence[str | os.PathLike[str]], config: str | os.PathLike[str] | None
) -> tuple[list[DiscoveredFile], list[InputReport]]:
    files: list[DiscoveredFile] = []
    reports: list[InputReport] = []
    loose: list[str | os.PathLike[str]] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                found = discover_run(path)
            except InputError as exc:
                reports.append(InputReport(exc.path, "directory", exc.problem, problem=exc.message))
                continue
            if not found.files:
                reports.append(
                    InputReport(
                        os.fspath(path),
                        "directory",
                        "nothing recognisable",
                        problem=f"{os.fspath(path)}: holds no training log, snapshot, ds_config, "
                        "kernel log or error.json; point oomlens at the run's output directory",
                    )
                )
            files.extend(found.files)
        else:
            loose.append(path)
    if loose:
        found_files, problems = inputs_of(loose)
        files.extend(found_files)
        reports.extend(
            InputReport(problem.path, "unreadable", problem.problem, problem=problem.message)
            for problem in problems
        )
    if config is not None:
        shown = os.fspath(config)
        files = [f for f in files if os.path.abspath(f.path) != os.path.abspath(shown)]
        files.append(
            DiscoveredFile(
                shown, InputKind.DS_CONFIG, "named with --config", None, None, None, None, None
            )
        )
    return files, reports


GPUS_PER_NODE_GUESS = 8
"""Ranks per host when no launcher line says it (the common 8-GPU node)."""

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d{1,6})")


def _load_snapshot(
    file: DiscoveredFile, options: AnalysisOptions
) -> tuple[SnapshotAnalysis | None, InputReport]:
    try:
        size = os.path.getsize(file.path)
        if options.max_snapshot_bytes is not None and size > options.max_snapshot_bytes:
            return None, InputReport(
                file.path,
                InputKind.SNAPSHOT_PICKLE.value,
                f"{size} bytes",
                problem=f"{file.path}: snapshot of {size} bytes skipped (limit "
                f"{options.max_snapshot_bytes}); analyze it with oomlens analyze directly",
            )
        snapshot = load_snapshot(
            file.path, limits=options.snapshot_limits, rank=file.rank, freeze_gc=False
        )
        analysis = analyze_snapshot(snapshot)
    except InputError as exc:
        return None, InputReport(
            file.path, InputKind.SNAPSHOT_PICKLE.value, exc.problem, problem=exc.message
        )
    except OSError as exc:
        return None, InputReport(
            file.path,
            InputKind.SNAPSHOT_PICKLE.value,
            "unreadable",
            problem=f"{file.path}: cannot be read ({exc.strerror or exc})",
        )
    detail = (
        f"{snapshot.layout.value} layout, {snapshot.history.value} history, "
        f"{snapshot.segment_count} segments, {snapshot.trace_entry_count} trace entries"
    )
    return analysis, InputReport(
        file.path, InputKind.SNAPSHOT_PICKLE.value, detail, rank=analysis.source.rank
    )


def _world_size(logs: Sequence[LogFacts], options: AnalysisOptions) -> WorldSizeFact | None:
    if options.gpus is not None:
        return WorldSizeFact(options.gpus, "command line (--gpus)", None)
    best = None
    for log in logs:
        ws = getattr(log, "world_size", None)
        if ws is not None and float(ws.value).is_integer() and int(ws.value) >= 1:
            candidate = WorldSizeFact(int(ws.value), ws.origin, ws.source)
            if best is None or candidate.value > best.value:
                best = candidate
    if best is not None:
        return best
    ranks: set[int] = set()
    for log in logs:
        ranks.update(getattr(log, "ranks_seen", ()))
    if len(ranks) > 1:
        return WorldSizeFact(max(ranks) + 1, "ranks seen in the log (a lower bound)", None)
    return None


def _config(
    config_files: Sequence[DiscoveredFile],
    logs: Sequence[LogFacts],
    world: WorldSizeFact | None,
    reports: list[InputReport],
    *,
    prefer_deepspeed: bool = True,
) -> ConfigSource | None:
    """The run's DeepSpeed config: the file (validated at the run's world size) reconciled with
    the engine's own dump from the log when there is one."""
    from_file: ConfigReading | None = None
    for file in config_files[:1]:
        try:
            document = read_ds_config(file.path)
        except InputError as exc:
            reports.append(
                InputReport(file.path, InputKind.DS_CONFIG.value, exc.problem, problem=exc.message)
            )
            continue
        from_file = read_and_check(
            document, world_size=world.value if world else None, prefer_deepspeed=prefer_deepspeed
        )
        reports.append(InputReport(file.path, InputKind.DS_CONFIG.value, file.reason))
    reports.extend(
        InputReport(
            extra.path,
            InputKind.DS_CONFIG.value,
            "ignored",
            problem=f"{extra.path}: a second ds_config; only "
            f"{config_files[0].path} is used (name one with --config)",
        )
        for extra in config_files[1:]
    )
    dump = _log_dump(logs)
    if from_file is not None and dump is not None:
        merged, differences = reconcile_with_dump(from_file.effective, dump.effective)
        notes = from_file.notes + tuple(
            f"the log's config dump differs from the file: {d}" for d in differences
        )
        reading = ConfigReading(
            raw=from_file.raw,
            effective=merged,
            problems=from_file.problems,
            hazards=from_file.hazards,
            notes=notes,
        )
        return ConfigSource(reading, "file+log_dump", dump)
    if from_file is not None:
        return ConfigSource(from_file, "file")
    if dump is not None:
        return ConfigSource(dump, "log_dump", dump)
    return None


def _log_dump(logs: Sequence[LogFacts]) -> ConfigReading | None:
    """The engine's own config dump from the logs (the first one found), as a reading whose
    ``raw`` is the user's JSON the dump printed."""
    for log in logs:
        dumped = log.ds_config_dump
        if dumped is not None:
            return ConfigReading(
                raw=dumped.user_config, effective=dumped.effective, notes=dumped.problems
            )
    return None


def source_of(path: str | Path) -> SourceRef:
    return SourceRef(os.fspath(path))
