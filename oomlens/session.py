"""One analysis, end to end: inputs -> facts -> derived facts -> rules -> report; one
pre-flight check of a config; one what-if replay of a snapshot.

``analyze(paths)`` is the whole pipeline; every command (``analyze``, ``triage``, ``epilog``)
goes through it.  ``check_config(path, ...)`` is ``oomlens check``'s: the config read, then
pre-flighted (``oomlens.analysis.preflight``) into a ``CheckReport``.  ``what_if(path, ...)``
is ``oomlens whatif``'s: the snapshot loaded, then replayed (``oomlens.analysis.whatif``) into
a ``WhatIfReport``.  Every report goes to the same renderers (``oomlens.render.registry``).

Each step of an analysis is one call: the inputs are collected and read kind by kind
(``oomlens.ingest.run`` over the registry of input kinds), each input's facts digested as soon
as it is read (``oomlens.derive.run.Digest``), the run's facts and signals derived once
(``oomlens.derive.run.derive_run``), and the report assembled from what the rules decided
(``oomlens.report.assemble`` over ``oomlens.rules.judgment.judge``: the diagnoses, the
verdict).  Bad inputs never raise: each becomes an ``InputReport`` with its
problem, and the rest is still analyzed.  Only when nothing at all could be read does it raise
``NoUsableInputError``.
"""

from __future__ import annotations

import importlib
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from oomlens.analysis.preflight import preflight
from oomlens.derive.run import Digest, RunHints, derive_run
from oomlens.errors import InputError, NoUsableInputError, UsageError
from oomlens.facts.inputs import InputFacts
from oomlens.facts.run import InputReport, RunFacts
from oomlens.ingest.ds_config import read_ds_config
from oomlens.ingest.kinds import ReadOptions, preload_readers
from oomlens.ingest.run import collect_inputs, failed_input, read_inputs
from oomlens.ingest.snapshot import SnapshotLimits, load_snapshot
from oomlens.report import CheckReport, Report, WhatIfReport, assemble
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
    log_jobs: int = 1
    """Processes that scan a large training log (0: one per core); see ``read_log``."""
    progress: Callable[[str, int, int], None] | None = None
    """Told ``(file, bytes read, bytes in all)`` while a large log is read."""
    prefer_deepspeed: bool = True
    """Validate configs with DeepSpeed's own models when it is installed; False keeps DeepSpeed
    (and torch with it: seconds and gigabytes) out of the process, oomlens' own checks stand in."""


_WARM_MODULES = (
    "oomlens.session",
    "oomlens.render.registry",
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
    preload_readers()
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
    files, reports = collect_inputs(paths, config=config)
    slots: defaultdict[str, list[object]] = defaultdict(list)
    reading = ReadOptions(
        options.snapshot_limits,
        options.max_snapshot_bytes,
        log_jobs=options.log_jobs,
        progress=options.progress,
    )
    digest = Digest()
    for read in read_inputs(files, reading):
        report = read.report
        try:
            kept = [digest(fact) for fact in read.facts]
        except InputError as exc:
            kept = []
            report = InputReport(read.found.path, read.kind.id, exc.problem, problem=exc.message)
        except Exception as exc:  # noqa: BLE001 - one input's bug must not cost the others
            kept = []
            report = failed_input(read.found.path, read.kind.id, exc)
        reports.append(report)
        slots[read.kind.slot].extend(kept)
    inputs = InputFacts.from_slots(reports, slots)
    if not inputs.any_facts():
        problems = "; ".join(r.problem for r in reports if r.problem) or "no inputs"
        raise NoUsableInputError(f"nothing could be analyzed: {problems}")
    hints = RunHints(
        params=options.params,
        gpus=options.gpus,
        gpu_memory=options.gpu_memory,
        host_memory=options.host_memory,
        prefer_deepspeed=options.prefer_deepspeed,
    )
    return derive_run(inputs, hints)


def check_config(config_path: str | os.PathLike[str], **settings: Any) -> CheckReport:
    """Pre-flight the ds_config at ``config_path``; ``settings`` are ``preflight``'s keywords
    (the model size, GPUs, memory, validator...).  Raises ``InputError`` for a config that
    cannot be read."""
    return CheckReport(preflight(read_ds_config(os.fspath(config_path)), **settings))


def what_if(
    snapshot_path: str | os.PathLike[str],
    alloc_confs: Sequence[str] = (),
    *,
    device: int | None = None,
    allowed: int | None = None,
) -> WhatIfReport:
    """Replay the snapshot at ``snapshot_path`` under each ``PYTORCH_CUDA_ALLOC_CONF`` value of
    ``alloc_confs`` (none: the recorded setting and the default ladder), under ``allowed``
    bytes when given.  Raises ``UsageError`` for a value torch would refuse (torch's message),
    ``InputError`` for a snapshot that cannot be read or holds no allocation history."""
    from oomlens.analysis.whatif import (
        AllocConfError,
        InconsistentTraceError,
        parse_alloc_conf,
        run_whatif,
    )

    settings = None
    if alloc_confs:
        settings = []
        for text in alloc_confs:
            try:
                settings.append(parse_alloc_conf(text))
            except AllocConfError as err:
                raise UsageError(f"--alloc-conf {text!r}: {err}") from err
    loaded = load_snapshot(os.fspath(snapshot_path))
    try:
        return WhatIfReport(run_whatif(loaded, settings, device=device, allowed=allowed))
    except InconsistentTraceError as err:
        raise InputError(
            os.fspath(snapshot_path),
            f"{err}: no allocator could have run it, so there is nothing to replay",
            "take the snapshot from the job again",
        ) from None
