"""Facts read from training logs: OOM errors, tracebacks, DeepSpeed and launcher lines, steps.

Produced by ``oomlens.ingest.log.read_log`` in one streaming pass.  Every fact carries a
``SourceRef`` (file, 1-based line, rank, host).  Sizes are bytes, parsed exactly as printed
(two-decimal GiB values are only that precise).  Times are naive datetimes as printed in the
log (no timezone is ever printed); ``None`` when unknown.

Everything that can repeat is bounded: lists keep at most a configured number of items and
count what they dropped; time series keep their first and last samples and a thinned middle,
with running statistics over all samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from oomlens.facts import SourceRef
from oomlens.facts.config import DumpedConfig
from oomlens.facts.context import ContextValue
from oomlens.facts.kernel import FatalSignalLine, KernelOomKill, OomKillerInvoked, SlurmOomKill


class OomKind(StrEnum):
    """Which layer ran out of memory, told by the message's shape."""

    ALLOCATOR = "allocator"
    """The caching allocator (CUDA, HIP, XPU, NPU...): ``out of memory. Tried to allocate``."""
    ALLOCATOR_ASYNC = "allocator_async"
    """The cudaMallocAsync backend: ``Allocation on device N would exceed allowed memory``."""
    DRIVER = "driver"
    """A runtime/driver call: ``CUDA error: out of memory`` (pinned memory, context creation,
    kernel loading), ``cuda runtime error (2)``, ``hipErrorOutOfMemory``."""
    CUBLAS = "cublas"
    CUDNN = "cudnn"
    CUSOLVER = "cusolver"
    NCCL = "nccl"
    """NCCL could not allocate: ``Cuda failure 'out of memory'``, ``Failed to CUDA calloc``."""
    PROBABLE_OOM_ASSERT = "probable_oom_assert"
    """``NVML_SUCCESS == r INTERNAL ASSERT FAILED`` in the allocator: an OOM whose details
    were lost because NVML failed while the message was being built."""
    MPS = "mps"
    HOST = "host"
    """Host RAM inside torch: ``DefaultCPUAllocator: can't allocate memory``."""
    FRAMEWORK = "framework"
    """Another framework's GPU allocator in the same job (XLA/JAX ``RESOURCE_EXHAUSTED: Out of
    memory while trying to allocate N bytes``, TensorFlow ``OOM when allocating tensor``, MXNet
    ``cudaMalloc failed: out of memory``)."""


class Phase(StrEnum):
    """Where in training memory ran out, told by the traceback's frames."""

    MODEL_INIT = "model_init"
    """Model construction, ``zero.Init``, ``from_pretrained``, ``deepspeed.initialize``."""
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    EVALUATION = "evaluation"
    GENERATION = "generation"
    CHECKPOINT_SAVE = "checkpoint_save"
    DATA_LOADING = "data_loading"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """``Process <pid> has <size> memory in use.``: another process on the same GPU (as NVML
    saw it; inside containers this may be the failing process itself under its host pid)."""

    pid: int
    bytes: int


@dataclass(frozen=True, slots=True)
class OomMessage:
    """One OOM message, parsed: ``oomlens.ingest.log.torch_oom.parse_oom_message``'s result.

    Every size is bytes as printed, ``None`` when the message has no such clause.
    ``message_format`` names the template, which dates the torch build:

    * ``cached`` (1.0-1.3: ``... free; <C> cached)``),
    * ``reserved`` (1.4-2.0: ``... reserved in total by PyTorch)``; also DPCPP/NPU forks),
    * ``capacty`` (2.1, with the typo), ``capacity`` (2.2+),
    * ``truncated`` (2.2/2.3 builds that cut the message after ``GPU ``),
    * ``exabyte`` (``Tried to allocate more than 1EB memory``),
    * ``malloc_async``, ``driver``, ``thc`` (torch <= 0.4), ``nvml_assert``, ``cublas``,
      ``cudnn``, ``cusolver``, ``nccl``, ``nccl_warn``, ``mps``, ``host`` (torch's CPU allocator),
      ``host_raised`` (``MemoryError``, numpy's ``_ArrayMemoryError``, ``std::bad_alloc``,
      ``[Errno 12] Cannot allocate memory``);
    * ``class_only`` (torch's OOM exception named, its message lost: cut);
    * ``xla``, ``tensorflow``, ``mxnet`` (another framework's allocator).
    """

    kind: OomKind
    message_format: str
    certain: bool
    """False for messages that usually, not always, mean OOM (the NVML assert,
    ``CUBLAS_STATUS_NOT_INITIALIZED``, ``CUDNN_STATUS_INTERNAL_ERROR``...)."""
    text: str
    """The message as read (bounded), from its first word to its end."""
    complete: bool
    """False when the message was cut before its end (truncated log or 2.2/2.3 truncation)."""
    exception_class: str | None = None
    """As printed before the message: ``torch.OutOfMemoryError`` (2.4+),
    ``torch.cuda.OutOfMemoryError`` (1.13-2.3), ``RuntimeError`` (<=1.12, drivers),
    ``torch.AcceleratorError``, ``OutOfMemoryError`` (error files, notebooks)..."""
    backend: str | None = None
    """``CUDA``, ``HIP``, ``XPU``, ``DPCPP``, ``NPU``, ``MUSA``, ``MPS``..."""
    device: int | None = None
    """Device index as the process saw it (after ``CUDA_VISIBLE_DEVICES``)."""
    tried_to_allocate: int | None = None
    """The segment the allocator wanted (not the tensor size); for ``exabyte``, 2**60 as a
    lower bound; for NCCL ``calloc`` and host messages, the bytes requested."""
    total_capacity: int | None = None
    free: int | None = None
    process_in_use: int | None = None
    """``Including non-PyTorch memory, this process has X memory in use``; or the X of
    ``Process N has X memory in use`` when that process is this one (``listed_self``)."""
    allocated_by_pytorch: int | None = None
    """``Of the allocated memory X is allocated by PyTorch`` (includes private pools since
    2.4); ``X already allocated`` in the old forms; ``Currently allocated`` (malloc_async);
    ``MPS allocated`` (MPS)."""
    reserved_unallocated: int | None = None
    """``X is reserved by PyTorch but unallocated``; for the old forms, reserved total minus
    allocated (the same quantity, derived)."""
    reserved_total: int | None = None
    """``X reserved in total by PyTorch`` / ``X cached`` (old forms only)."""
    allowed: int | None = None
    """``X allowed;`` (a per-process memory fraction is set); MPS ``max allowed``;
    the malloc_async ``PyTorch limit`` when one is set."""
    private_pools: int | None = None
    """``with X allocated in private pools (e.g., CUDA Graphs)``."""
    other_allocations: int | None = None
    """MPS ``other allocations``."""
    other_processes: tuple[ProcessMemory, ...] = ()
    listed_self: ProcessMemory | None = None
    """The process the message lists as ``Process N has X memory in use`` when it is this very
    process under another pid (a container's pid namespace: NVML's pid is not the one the
    process knows): the message has no ``this process has`` clause, lists exactly one process,
    goes on past the list (it was not cut there), and PyTorch's own reserved memory
    (allocated + reserved-but-unallocated, as far as printed) fits in X.  Then
    ``process_in_use`` is X and ``other_processes`` does not list it."""

    @property
    def other_processes_total(self) -> int | None:
        """Bytes used by the other processes listed, or None when none is listed."""
        if not self.other_processes:
            return None
        return sum(process.bytes for process in self.other_processes)

    @property
    def limit(self) -> int | None:
        """What this process could use: ``allowed`` when a memory fraction is set, else the
        card's capacity."""
        return self.allowed if self.allowed is not None else self.total_capacity

    @property
    def limit_name(self) -> str:
        return "allowed" if self.allowed is not None else "total capacity"

    @property
    def reserved(self) -> int | None:
        """What PyTorch's caching allocator held: allocated plus reserved-but-unallocated."""
        if self.allocated_by_pytorch is None or self.reserved_unallocated is None:
            return None
        return self.allocated_by_pytorch + self.reserved_unallocated

    @property
    def non_pytorch_self(self) -> int | None:
        """This process' memory outside the caching allocator (context, NCCL, libraries)."""
        if self.process_in_use is None or self.reserved is None:
            return None
        return self.process_in_use - self.reserved


@dataclass(frozen=True, slots=True)
class Frame:
    """One ``File "<filename>", line <line>, in <function>`` frame."""

    filename: str
    line: int
    function: str
    at: int | None = field(default=None, compare=False)
    """The log line it was read on (its ``File ...`` line, the first of a wrapped one); None
    when it was not read from a log's lines (an error file's call stack, a capture).  Not
    compared: the same frame printed by two ranks is the same frame."""


@dataclass(frozen=True, slots=True)
class Traceback:
    """A Python traceback, outermost frame first.

    Long tracebacks keep their first and last frames; ``frames_omitted`` counts the rest.
    ``cut`` is True when the log ended (or the traceback stopped) before the exception line.
    """

    source: SourceRef
    """Where ``Traceback (most recent call last):`` was read."""
    frames: tuple[Frame, ...]
    frames_omitted: int
    exception_class: str | None
    exception_text: str | None
    """The exception's message (bounded, continuation lines joined with newlines)."""
    cut: bool
    chained: bool
    """This traceback was printed after ``During handling of the above exception`` or
    ``The above exception was the direct cause``: an earlier exception caused it."""
    headless: bool = False
    """The text starts inside it: no ``Traceback (most recent call last)`` line was read, the
    first frame stands for it (a paste, a window of a log)."""
    style: str = "python"
    """How it was drawn: ``python``, ``rich`` (box characters) or ``ipython``."""
    current_line: str | None = None
    """The innermost frame's current source line as printed (Python's source line under the
    frame, rich's ``❱`` line, IPython's ``---->`` line), bounded; None when none was printed.
    In a traceback cut before its callee's frames it names the call that was running."""


@dataclass(frozen=True, slots=True)
class OomEvent:
    """An out-of-memory error found in a log, with where, on which rank, and when.

    ``source.rank`` is the global rank when known (``[rankN]:``, per-rank file layout, a
    failure summary), else the launcher's local rank (``[defaultN]:``).
    """

    source: SourceRef
    message: OomMessage
    phase: Phase
    phase_evidence: str | None
    """The frame that decided the phase, ``file:line in function``."""
    traceback: Traceback | None
    origin: str
    """``log`` (the worker's own output), ``failure_summary`` (quoted in a torchrun
    ``ChildFailedError`` block), ``error_file`` (a torchelastic error.json)."""
    timestamp: datetime | None
    timestamp_exact: bool
    """True when the OOM's own line carries the time; False when ``timestamp`` is the last
    time printed before it in the same file (a lower bound)."""
    local_rank: int | None = None
    reported_elsewhere: int = 0
    """How many later copies of the same message (torchrun summary, error file) were folded
    into this event."""
    preamble: str | None = None
    """What its line says before the message when that is more than an exception class: a
    warning or a log record that wraps the message (``UserWarning: Failed to clone() tensor
    with name lm_head.weight ... state_dict ... Error: ``, ``batch size 16 ran out of memory,
    retrying smaller: ``).  Bounded."""
    phase_source: SourceRef | None = None
    """Where that frame was read (its ``File ...`` line); None when it was not read from a
    log's lines (an error file, a capture) or no frame decided."""

    @property
    def rank(self) -> int | None:
        return self.source.rank


@dataclass(frozen=True, slots=True)
class ExceptionEvent:
    """A non-OOM exception that ended a traceback (or an uncaught C++ exception).

    ``peer_failure`` is True for the errors a rank gets when another rank died: NCCL
    watchdog timeouts, ``DistBackendError``, connection resets, ``terminate called after
    throwing an instance of 'c10::DistBackendError'``.
    """

    source: SourceRef
    exception_class: str
    text: str
    traceback: Traceback | None
    phase: Phase
    phase_evidence: str | None
    peer_failure: bool
    timestamp: datetime | None
    timestamp_exact: bool
    phase_source: SourceRef | None = None
    """Where that frame was read (its ``File ...`` line); None when it was not read from a
    log's lines (an error file, a capture) or no frame decided."""


@dataclass(frozen=True, slots=True)
class SeriesStats:
    """Running statistics over every sample of a series (kept or not).

    ``slope`` is the least-squares slope of value against sample index (bytes per sample for
    memory); ``None`` with fewer than two samples.
    """

    count: int
    first: float
    last: float
    minimum: float
    maximum: float
    mean: float
    slope: float | None


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One DeepSpeed ``see_memory_usage`` block: its label line, ``MA .. Max_MA .. CA ..
    Max_CA ..`` (GiB printed as ``GB``, converted to bytes; ``Max_CA`` is printed rounded to
    a whole GiB) and ``CPU Virtual Memory: used = .. GB, percent = ..%`` (node-wide)."""

    source: SourceRef
    """The ``MA`` line."""
    label: str | None
    allocated: int
    max_allocated: int
    reserved: int
    max_reserved: int
    cpu_used: int | None
    cpu_percent: float | None
    step: int | None
    """The last step counter seen before the sample, if any."""
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class LabelStats:
    """Statistics of the samples of one ``see_memory_usage`` label (e.g. ``Engine after step``):
    comparing a label with itself across steps shows growth that per-step cycles hide."""

    label: str
    allocated: SeriesStats
    reserved: SeriesStats


@dataclass(frozen=True, slots=True)
class MemorySeries:
    """The memory samples of one rank (``rank`` None: no rank known): DeepSpeed's
    ``see_memory_usage`` blocks of a log, or the series of an oomlens capture."""

    rank: int | None
    host: str | None
    samples: tuple[MemorySample, ...]
    """In log order: the first and last samples and a thinned middle."""
    total_samples: int
    allocated: SeriesStats
    reserved: SeriesStats
    max_allocated: SeriesStats
    cpu_used: SeriesStats | None
    by_label: tuple[LabelStats, ...]
    """Per label, for at most a bounded number of distinct labels (first seen first)."""
    origin: str = "see_memory_usage"
    """``see_memory_usage`` (a log's DeepSpeed lines) or ``capture`` (oomlens capture)."""


@dataclass(frozen=True, slots=True)
class CacheFlushWarning:
    """``N pytorch allocator cache flushes since last step`` (ZeRO-3, rank 0, per step)."""

    source: SourceRef
    flushes: int
    step: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class CacheFlushSummary:
    warnings: int
    """How many such warnings the log holds."""
    total_flushes: int
    max_flushes: int
    first: CacheFlushWarning | None
    last: CacheFlushWarning | None
    samples: tuple[CacheFlushWarning, ...]
    """Bounded: first and last warnings and a thinned middle."""


@dataclass(frozen=True, slots=True)
class StepSample:
    """A progress line: which step, and the loss when printed with it.

    ``kind``: ``deepspeed`` (``step=N, skipped=M``), ``throughput`` (DeepSpeed
    ``global_step=N ... MemAllocated=``), ``hf`` (``{'loss': ..., 'epoch': ...}``, step
    unknown), ``tqdm`` (``N/M [..]``, one sampled per read block), ``generic``
    (``step N ... loss X``, ``rank R step N loss X``, ``step N/M``), ``generic_eval`` (an
    evaluation loss line: its step only).
    """

    source: SourceRef
    kind: str
    step: int | None
    total: int | None
    loss: float | None
    epoch: float | None
    memory_allocated: int | None
    max_memory_allocated: int | None
    skipped: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class StepSeries:
    total: int
    """Progress lines seen."""
    samples: tuple[StepSample, ...]
    """Bounded: first and last lines and a thinned middle."""
    last: StepSample | None
    max_step: int | None
    loss: SeriesStats | None
    last_by_rank: tuple[StepSample, ...]
    """The last progress line of each rank that printed one."""


@dataclass(frozen=True, slots=True)
class DsConfigDump:
    """DeepSpeed's startup ``DeepSpeedEngine configuration:`` dump, raw.

    ``entries`` are the ``  key ....... value`` lines as printed (values are Python reprs:
    pydantic ``field=value`` lists, JSON blocks); ``json_text`` is the ``json = {...}``
    block, which is *not* strict JSON (``inf``/``nan``, ``5.000000e+08``): parse it with the
    ds_config parser.
    """

    source: SourceRef
    entries: tuple[tuple[str, str], ...]
    json_text: str | None
    complete: bool
    """False when the log ended inside the dump or it exceeded the kept size."""


@dataclass(frozen=True, slots=True)
class BatchAssertion:
    """``Check batch related parameters ... train_batch_size is not equal to
    micro_batch_per_gpu * gradient_acc_step * world_size A != B * C * D``."""

    source: SourceRef
    train_batch_size: int | float
    micro_batch_per_gpu: int | float
    gradient_accumulation_steps: int | float
    world_size: int | float
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class ConfigErrorLine:
    """Another DeepSpeed config rejection (``... is not defined``, ``Either train_batch_size
    or train_micro_batch_size_per_gpu needs to be provided``, a mismatch with HF args)."""

    source: SourceRef
    text: str


@dataclass(frozen=True, slots=True)
class WorldSize:
    """The number of ranks, and which line said it.

    ``origin``: ``world_info`` (``WORLD INFO DICT``), ``dist_world_size``, ``config``
    (``Config mesh_device ... world_size = N``; the data-parallel size, may be a float),
    ``config_dump`` (``world_size ...... N``), ``torchrun_summary`` (ranks listed).
    """

    value: int | float
    origin: str
    source: SourceRef


@dataclass(frozen=True, slots=True)
class ParamCount:
    """The model's parameter count as a line states it (``origin``: ``deepspeed`` zero.Init,
    ``hf_trainer``, ``peft``, ``lightning`` (its model summary's ``Total params``), ``script``
    for a training script's own line)."""

    total: int
    trainable: int | None
    origin: str
    source: SourceRef


@dataclass(frozen=True, slots=True)
class LauncherExit:
    """DeepSpeed launcher ``[...] exits with return code = N``.

    ``cmd_local_rank`` is the ``--local_rank=K`` of the printed command, which is the *last
    spawned* rank, not the failed one (DeepSpeed prints the loop variable).
    """

    source: SourceRef
    return_code: int
    cmd_local_rank: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class KilledSubprocess:
    """DeepSpeed launcher ``Killing subprocess <pid>`` (it kills every local rank once one
    failed); ``local_rank`` comes from the matching ``process <pid> spawned with command``."""

    source: SourceRef
    pid: int
    local_rank: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class ClosingSignal:
    """torchrun agent ``Sending process <pid> closing signal SIGTERM``: a peer being stopped
    because another worker failed."""

    source: SourceRef
    pid: int
    signal: str
    local_rank: int | None
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class ProcessFailure:
    """A worker that ended badly, as a launcher reported it.

    ``origin``: ``torchrun_agent`` (``failed (exitcode: N) local_rank: L (pid: P)``),
    ``torchrun_summary`` (an entry of a ``ChildFailedError`` block), ``mp_spawn``
    (``process N terminated with ...``), ``error_file`` (a torchelastic error.json).
    ``exitcode`` is negative for a signal (``-9`` SIGKILL); ``signal`` names it.
    """

    source: SourceRef
    origin: str
    exitcode: int | None
    signal: str | None
    rank: int | None
    local_rank: int | None
    pid: int | None
    host: str | None
    timestamp: datetime | None
    root_cause: bool
    """Listed under ``Root Cause (first observed failure)``."""
    error_file: str | None
    message: str | None
    """The ``traceback :`` field's last line (the exception), or the signal text."""
    oom: OomMessage | None
    """The OOM in the quoted traceback, when there is one."""
    unrecorded: bool = False
    """torchrun found no error file for this worker and printed its placeholder in the
    ``traceback :`` field (``To enable traceback see: .../elastic/errors.html``): the worker's
    own error went only to its stderr (the console, or ``--log-dir`` under ``--redirects`` /
    ``--tee``); ``message`` is then None."""


@dataclass(frozen=True, slots=True)
class FailureSummary:
    """A torchrun ``ChildFailedError`` block: ``<script> FAILED``, failures, root cause."""

    source: SourceRef
    title: str | None
    failures: tuple[ProcessFailure, ...]
    complete: bool


@dataclass(frozen=True, slots=True)
class PeerFailureSignal:
    """A line that means this rank is failing because a peer died or hung.

    ``kind``: ``watchdog_timeout`` (``Watchdog caught collective operation timeout``),
    ``watchdog_exception``, ``terminate_dist_backend`` (abort on ``c10::DistBackendError``),
    ``connection_lost`` (reset by peer, broken pipe, remote process exited), ``nccl_error``.
    """

    source: SourceRef
    kind: str
    text: str
    timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class CompletionLine:
    """A line that says the run (or a fit) ended normally.

    ``kind``: ``launcher_success`` (DeepSpeed's ``Process N exits successfully``),
    ``agent_finished`` (torchrun's ``Local worker group finished``), ``hf_train_runtime``
    (the HF Trainer's final ``{'train_runtime': ...}``), ``lightning_fit_stopped``
    (``Trainer.fit` stopped: `max_steps=N` reached``), ``script`` (``training finished``,
    ``Finished training``, ``Training completed``).
    """

    source: SourceRef
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class PlatformHint:
    """What the text shows of the machine it ran on, for causes that depend on it.

    ``kind``: ``wsl`` (a WSL kernel or ``/mnt/c`` paths: pinned memory is capped there),
    ``container`` (a container's shell prompt ``root@<12 hex>``, ``/workspace``, docker or
    kubernetes: NVML lists the process under another pid), ``notebook`` (Colab's
    ``/content``, Kaggle's ``/kaggle``), ``windows`` (``C:\\`` paths).
    """

    source: SourceRef
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class AllocatorSummary:
    """``torch.cuda.memory_summary()``'s table: ``CUDA OOMs: N | cudaMalloc retries: M`` and,
    when printed, the current and peak allocated and reserved memory (bytes)."""

    source: SourceRef
    device: int | None
    ooms: int | None
    malloc_retries: int | None
    allocated_current: int | None = None
    allocated_peak: int | None = None
    reserved_current: int | None = None
    reserved_peak: int | None = None


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What a whole card had in use, by every process, as a tool printed it: an
    ``nvidia-smi`` usage row (``78000MiB / 81920MiB``; ``origin`` ``nvidia_smi``) or a
    script's ``1998 MiB free of 143156 MiB`` (``script``).  ``device`` when the table or the
    line says it."""

    source: SourceRef
    device: int | None
    used: int
    total: int
    origin: str


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A row of ``nvidia-smi``'s process table: who holds how much of which card (``kind``
    ``C`` compute, ``G`` graphics such as Xorg, ``C+G``); ``used`` None for ``N/A``."""

    source: SourceRef
    device: int
    pid: int
    kind: str
    name: str
    used: int | None


@dataclass(frozen=True, slots=True)
class LogFacts:
    """Everything ``read_log`` found in one training log.

    Lists hold at most ``ReaderLimits`` items each (``dropped`` counts the rest per kind).
    ``notes`` are human-readable remarks about the input itself (invalid UTF-8 replaced, a
    cut compressed stream, lines cut...), each naming the problem.
    """

    path: str
    compression: str
    bytes_read: int
    lines: int
    long_lines: int
    invalid_utf8_lines: int
    ended_mid_line: bool
    ended_in_traceback: bool
    """The log ends inside a traceback, before its exception line (it was cut mid-crash; a
    message cut mid-way shows as ``OomMessage.complete`` False)."""
    layout_rank: int | None
    """The rank the file's name/location gives (per-rank log files), if any."""
    oom_events: tuple[OomEvent, ...]
    exceptions: tuple[ExceptionEvent, ...]
    memory: tuple[MemorySeries, ...]
    cache_flushes: CacheFlushSummary
    steps: StepSeries
    config_dump: DsConfigDump | None
    config_dumps_seen: int
    batch_assertions: tuple[BatchAssertion, ...]
    config_errors: tuple[ConfigErrorLine, ...]
    world_size: WorldSize | None
    param_count: ParamCount | None
    launcher_exits: tuple[LauncherExit, ...]
    killed_subprocesses: tuple[KilledSubprocess, ...]
    closing_signals: tuple[ClosingSignal, ...]
    process_failures: tuple[ProcessFailure, ...]
    failure_summaries: tuple[FailureSummary, ...]
    peer_failures: tuple[PeerFailureSignal, ...]
    kernel_oom_kills: tuple[KernelOomKill, ...]
    oom_invocations: tuple[OomKillerInvoked, ...]
    slurm_oom_kills: tuple[SlurmOomKill, ...]
    fatal_signals: tuple[FatalSignalLine, ...]
    ranks_seen: tuple[int, ...]
    hosts_seen: tuple[str, ...]
    dropped: tuple[tuple[str, int], ...]
    """``(kind, count)`` of facts not kept because a list reached its bound."""
    notes: tuple[str, ...]
    tail: tuple[tuple[int, str], ...] = ()
    """The log's last lines ``(line number, text)``, cleaned, at most ``TAIL_LINES``: what the
    job was doing when it died, for failures that leave no traceback (a kernel OOM kill)."""
    ds_config_dump: DumpedConfig | None = None
    """DeepSpeed's startup configuration dump, parsed (``oomlens.ingest.ds_config``): what the
    engine really ran with, every value citing its line."""
    completion: CompletionLine | None = None
    """The last line that says the run (or a fit) ended normally, if any."""
    caught_oom_events: tuple[OomEvent, ...] = ()
    """OOM errors the program caught and went on from (a batch-size finder, a retry loop): the
    run progressed or ended normally after them in the same stream.  Not in ``oom_events``:
    they are not what ended the run."""
    platform_hints: tuple[PlatformHint, ...] = ()
    """At most one per kind: the first line that shows it."""
    allocator_summaries: tuple[AllocatorSummary, ...] = ()
    tracebacks_cut: int = 0
    """Tracebacks that stopped before their exception line (a window that ends, or a paste
    that skipped the message): the text is visibly inside a crash."""
    partial_tracebacks: tuple[ExceptionEvent, ...] = ()
    """The last few of those, with their frames and the phase the frames show
    (``exception_class`` is ''): what a window inside a traceback still tells."""
    stream_cut: str | None = None
    """Why the compressed stream stopped before its end (cut short, or corrupt after some
    bytes), else None: what the log said after that point is lost, whatever came before."""
    gpu_usage: tuple[GpuUsage, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    context: tuple[ContextValue, ...] = ()
    """The settings the log states (``oomlens.ingest.context_lines``), the first of each key."""
    line_by_line: bool = False
    """The input was small enough to be read line by line with the wider anchor table (a
    paste, a window of a log): cut and wrapped messages and headless tracebacks are read."""


@dataclass(frozen=True, slots=True)
class ErrorFileFacts:
    """A torchelastic ``error.json`` (written by ``@record``): the failure it records and, when
    its message is an OOM, the OOM event (``origin="error_file"``) with the traceback taken
    from ``extraInfo.py_callstack``."""

    path: str
    failure: ProcessFailure
    oom_event: OomEvent | None
    traceback: Traceback | None
