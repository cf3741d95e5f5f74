"""Signals derived from a run's facts, once, before any rule reads them (``oomlens.derive``).

A signal is a reading every rule and the verdict must agree on: how workers died when they
printed nothing, whether the launcher tore the job down over a silent death, how full the node
was, which exceptions are a configuration being refused, which memory-looking failures a bug or
a broken driver explains, a failed pinned host allocation, the phase an OOM happened in when
only its innermost frames say it, tracebacks cut before their error.  They are computed by
``oomlens.derive`` (which holds the knowledge: signal numbers, refusal wordings, frame tables)
and kept here as frozen facts with the source each rests on, so rules, the verdict and the
report read the same answer and never recompute it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from oomlens.facts import SourceRef
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import ExceptionEvent, MemorySample, OomEvent, Phase, StepSample
from oomlens.facts.ranks import RankStatus


@dataclass(frozen=True, slots=True)
class SignalDeath:
    """A worker reported dead of ``signal`` (``SIGKILL``, ``SIGBUS``, ``SIGSEGV``,
    ``SIGABRT``), and where that was said."""

    signal: str
    source: SourceRef | None
    text: str


@dataclass(frozen=True, slots=True)
class SilentDeath:
    """A worker died without printing an error: what says so (the launcher's line)."""

    source: SourceRef
    text: str


@dataclass(frozen=True, slots=True)
class UnseenError:
    """A worker that exited with an exit code of its own (an uncaught Python error,
    ``sys.exit(1)``: not a signal) while no error of its own is in the inputs: what it died of
    was printed somewhere else (its stderr)."""

    rank: int | None
    exitcode: int
    source: SourceRef
    unrecorded: bool
    """torchrun said it had no error file for the worker (``To enable traceback see ...``):
    the entry point was not decorated with ``@record``."""


@dataclass(frozen=True, slots=True)
class NormalEnd:
    """What says the run ended normally, and where: a launcher's exit 0, a trainer's or
    script's end-of-training line, the last step of a known total, every captured rank's
    exit 0."""

    text: str
    source: SourceRef | None


@dataclass(frozen=True, slots=True)
class SchedulerEnd:
    """The scheduler cancelled the job or step (Slurm's ``*** JOB N ... CANCELLED AT T DUE TO
    TIME LIMIT ***``): ``reason`` in words (``its time limit``, ``preemption``, ``a node
    failure``...), None when the line gives none (a user's ``scancel``)."""

    reason: str | None
    source: SourceRef
    text: str


class Rejection(StrEnum):
    SCHEMA = "schema"
    """A config model refused a key or a value (unknown key, wrong type)."""
    BATCH = "batch"
    """The batch sizes, accumulation and world size do not agree."""
    SETTING = "setting"
    """A framework refused to run within the memory its own setting allows, and names the
    setting ("No available memory for the cache blocks. Try increasing
    `gpu_memory_utilization`")."""


@dataclass(frozen=True, slots=True)
class ConfigRejection:
    """One refused configuration as a log printed it."""

    kind: Rejection
    source: SourceRef
    text: str
    """The exception as printed (bounded)."""
    model: str | None = None
    """The config model that refused it (``DeepSpeedZeroConfig``), for schema errors."""
    keys: tuple[str, ...] = ()
    """The keys the error names (batch keys of a transformers mismatch listing)."""


@dataclass(frozen=True, slots=True)
class BugEvidence:
    """What says the failure was a bug: the exception (or line) and where."""

    text: str
    source: SourceRef


@dataclass(frozen=True, slots=True)
class FailureLine:
    """A line that reports a failure and says what it was: not a lack of memory."""

    text: str
    source: SourceRef
    why: str


@dataclass(frozen=True, slots=True)
class PinnedFailure:
    """What says a pinned allocation failed, and where."""

    text: str
    source: SourceRef
    oom: bool
    """It came with an out-of-memory message (not only a failed pin-memory thread)."""
    wsl_only: bool = False
    """Nothing but the platform (WSL) says the failed allocation was a pinned one."""


@dataclass(frozen=True, slots=True)
class EventPlace:
    """Where in training an OOM happened: its phase, the frame (``file:line in function``)
    or line that shows it, and where that was read."""

    phase: Phase
    evidence: str | None
    site: SourceRef


@dataclass(frozen=True, slots=True)
class FailurePoint:
    """What died first: a GPU OOM (``event``), a kernel OOM kill (``kill``) or the rank that
    failed first (``status``), where and when, and the last training step printed before it."""

    event: OomEvent | None
    kill: KernelOomKill | None
    status: RankStatus | None
    source: SourceRef | None
    rank: int | None
    time: datetime | None
    time_exact: bool
    step: StepSample | None


NOTHING_FAILED = FailurePoint(None, None, None, None, None, None, True, None)


def event_key(event: OomEvent) -> tuple[SourceRef, str]:
    """How ``Signals.places`` names an OOM event: where it was read and its message."""
    return event.source, event.message.text


@dataclass(frozen=True, slots=True)
class Signals:
    """Every derived signal of one run (see the module docstring); empty until derived."""

    signal_deaths: tuple[SignalDeath, ...] = ()
    """Every signal death the inputs report, launcher lines first, then shells' words."""
    silent_death: SilentDeath | None = None
    """The launcher tore the job down and no worker printed an error of its own."""
    host_pressure: MemorySample | None = None
    """The last memory sample carrying the node-wide host RAM figure (DeepSpeed's)."""
    shm_denied: SourceRef | None = None
    """Where opening shared memory was refused (a permission, not /dev/shm running out)."""
    config_rejections: tuple[ConfigRejection, ...] = ()
    """Every refused configuration the logs show."""
    library_bug: BugEvidence | None = None
    """The bug that explains the run's GPU OOMs when every one of them is a cuBLAS, cuDNN or
    cuSOLVER status (a poisoned CUDA context); None otherwise."""
    bug: BugEvidence | None = None
    """The first exception or kept line that names an indexing bug or a device-side assert."""
    non_memory_lines: tuple[FailureLine, ...] = ()
    """Lines that report a failure and say it was not memory (CUDA init, cuBLAS execution)."""
    unseen_errors: tuple[UnseenError, ...] = ()
    """Workers that exited with an exit code of their own when no worker's error text is in the
    inputs (no exception, no OOM, no error file, no message in the launcher's record)."""
    normal_end: NormalEnd | None = None
    """The first positive evidence that the run ended normally; None when nothing says so (a
    log that merely stops says nothing)."""
    scheduler_end: SchedulerEnd | None = None
    """The scheduler's cancellation of the job, when a line reports one."""
    pinned: PinnedFailure | None = None
    """The first failed pinned host allocation (or pin-memory thread failure)."""
    cut_tracebacks: tuple[ExceptionEvent, ...] = ()
    """Tracebacks cut before their exception, placed in a phase by their frames, when nothing
    else in the inputs failed (no OOM, no kill, no exception with a message)."""
    places: Mapping[tuple[SourceRef, str], EventPlace] = field(default_factory=dict)
    """The place of every OOM event (``event_key``)."""
    host_kill_seen: bool = False
    """The kernel's log or a capture's cgroup counters show an OOM kill."""
    memory_series_seen: bool = False
    """Some input printed memory over time (a series of samples)."""
    gpu_failure: FailurePoint = NOTHING_FAILED
    """What died first when the run died of GPU memory: its first GPU OOM."""
    host_failure: FailurePoint = NOTHING_FAILED
    """What died first when the run died of host memory: its first kernel OOM kill."""
    rank_failure: FailurePoint = NOTHING_FAILED
    """What died first otherwise: the rank that failed first."""

    @property
    def first_gpu_oom(self) -> OomEvent | None:
        """The GPU OOM of the rank that failed first, else the first in reading order (what
        ``gpu_failure`` leads with)."""
        return self.gpu_failure.event

    def place(self, event: OomEvent) -> EventPlace:
        """Where ``event`` happened; the reader's own reading for an event not derived."""
        found = self.places.get(event_key(event))
        if found is not None:
            return found
        site = event.phase_source or (
            event.traceback.source if event.traceback is not None else event.source
        )
        return EventPlace(event.phase, event.phase_evidence, site)

    def cut_in(self, phases: frozenset[Phase]) -> ExceptionEvent | None:
        """The first cut traceback placed in one of ``phases`` (see ``cut_tracebacks``)."""
        return next((e for e in self.cut_tracebacks if e.phase in phases), None)
