"""Facts about a ``torch.cuda.memory._snapshot()`` pickle and what the caching allocator held.

Two layers live here:

* :class:`Snapshot` is what :func:`oomlens.ingest.snapshot.load_snapshot` returns: a typed
  header (layout, devices, recording mode, allocator settings) plus the raw builtin data in
  :class:`RawSnapshot`.  The raw part exists for analysis processors only; rules never read it.
  A 1 GB pickle holds millions of blocks and trace entries, so they are *not* turned into one
  dataclass each: processors walk the raw lists once and keep summaries.
* :class:`SnapshotAnalysis` / :class:`DeviceAnalysis` are what
  :func:`oomlens.analysis.allocator.analyze_snapshot` returns: bounded summaries with exact byte
  counts (top-N lists, never one object per block), holding no reference to the raw data.

Sizes are bytes (``int``).  Times are ``time_us`` as torch records them: microseconds since the
Unix epoch (``None`` for torch 2.0 snapshots, which recorded no times).  ``stream`` is torch's
``int64(cudaStream_t)``; 0 is the legacy default stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from oomlens.facts import SourceRef
from oomlens.facts.whatif import ReplayVerdict

# --------------------------------------------------------------------------------------------
# The loaded snapshot
# --------------------------------------------------------------------------------------------


class SnapshotLayout(StrEnum):
    """Which of the shapes torch has pickled the file has."""

    CURRENT = "current"
    """torch >= 2.1 ``_snapshot()`` / ``_dump_snapshot``: a dict with ``segments`` and
    ``device_traces``; blocks carry ``address``, ``frames`` and ``requested_size``."""
    BLOCK_HISTORY = "block_history"
    """torch 2.0: a dict with ``segments`` and ``device_traces``; blocks carry an optional
    ``history`` list (``addr``, ``real_size``, ``frames``) instead of ``frames``; no
    ``time_us`` on trace entries, no ``is_expandable``."""
    SEGMENT_LIST = "segment_list"
    """A bare list of segments: ``torch.cuda.memory_snapshot()`` (any version) or torch 1.13's
    ``_snapshot()``.  There is no allocation history."""


class HistoryMode(StrEnum):
    """How much allocation history the snapshot recorded."""

    ALLOC_HISTORY = "alloc_history"
    """``device_traces`` holds alloc/free/segment events (``enabled='all'``)."""
    STATE_ONLY = "state_only"
    """``device_traces`` holds only ``snapshot``/``oom`` markers (``enabled='state'``, a
    one-entry ring buffer): the state of live blocks, no timeline."""
    NONE = "none"
    """No ``device_traces`` at all (a bare segment list)."""


class StackDepth(StrEnum):
    """Which frames the recorder kept (``_record_memory_history(stacks=...)``)."""

    NONE = "none"
    """No block or event carries a frame (``context=None`` or history disabled)."""
    PYTHON = "python"
    """Python frames only (``stacks='python'``).  Backward-pass allocations then have *no*
    frames at all: the autograd thread has no Python stack."""
    PYTHON_AND_NATIVE = "python_and_native"
    """C++ frames too (``stacks='all'``, torch's default)."""


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """The allocator configuration recorded in the snapshot (``allocator_settings``, torch >= 2.3).

    ``raw_config`` is the last ``PYTORCH_CUDA_ALLOC_CONF`` / ``_set_allocator_settings`` string
    ('' when none was set).  ``max_split_size`` is None when unlimited (torch records -1).
    ``roundup_power2_divisions`` maps the interval's lower bound in MiB (1, 2, 4, ... 32768) to
    its division count (0 = not set).  ``config_options`` is ``raw_config`` split into
    ``(key, value)`` pairs as torch splits it.  Keys this version of oomlens does not know are
    kept in ``other`` as ``(key, repr(value))``.
    """

    raw_config: str
    expandable_segments: bool | None
    max_split_size: int | None
    garbage_collection_threshold: float | None
    roundup_power2_divisions: tuple[tuple[int, int], ...]
    release_lock_on_cudamalloc: bool | None
    config_options: tuple[tuple[str, str], ...]
    other: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class RawSnapshot:
    """The unpickled builtin data, for analysis processors only (rules must not read it).

    Read-only by contract: the lists are shared (frame lists are memoized in the pickle and
    appear many times), so nothing may be mutated in place.  ``segments`` is the list of
    segment dicts, ``device_traces`` one list of trace-entry dicts per device (``[]`` when
    none), ``annotations`` the ``external_annotations`` list (``[]`` when none).
    """

    segments: list[Any]
    device_traces: list[Any]
    annotations: list[Any]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot file, loaded through the restricted unpickler and checked for shape.

    ``devices`` are the devices with at least one segment or one trace event other than a
    ``snapshot`` marker; ``device_count`` is how many devices the allocator knew
    (``len(device_traces)``, or the highest device index + 1).  ``block_count`` and
    ``trace_entry_count`` are totals over all devices.
    """

    source: SourceRef
    layout: SnapshotLayout
    history: HistoryMode
    stacks: StackDepth
    pickle_protocol: int | None
    compressed: bool
    file_bytes: int
    pickle_bytes: int
    devices: tuple[int, ...]
    device_count: int
    segment_count: int
    block_count: int
    trace_entry_count: int
    allocator_settings: AllocatorSettings | None
    extra_keys: tuple[str, ...]
    raw: RawSnapshot = field(repr=False, compare=False)


# --------------------------------------------------------------------------------------------
# Analysis results
# --------------------------------------------------------------------------------------------


class Pool(StrEnum):
    """The caching allocator's two block pools (``segment_type``)."""

    SMALL = "small"
    """Requests <= 1 MiB, carved from 2 MiB segments."""
    LARGE = "large"
    """Everything else."""


class BlockState(StrEnum):
    """Block states as torch writes them."""

    ALLOCATED = "active_allocated"
    PENDING_FREE = "active_pending_free"
    """Freed by the program, still waiting for other streams (``record_stream``) or a graph
    capture; not reusable yet.  Older docs call it ``active_awaiting_free``."""
    INACTIVE = "inactive"
    """Free and cached."""


class MemoryCategory(StrEnum):
    """What a live block probably is, inferred from its allocation stack.

    The inference is a best effort from frame names (see :mod:`oomlens.analysis.stacks`);
    :class:`CategoryBytes` says which frame decided and how sure that is.
    """

    PARAMETERS = "parameters"
    """Model weights: ``module.to/cuda`` (``_apply``), state-dict loading, DeepSpeed partitions."""
    GRADIENTS = "gradients"
    """Allocated by the backward pass (autograd nodes, ``AccumulateGrad``, DeepSpeed fp32
    gradient buffers).  Gradients and backward temporaries cannot be told apart by stack."""
    OPTIMIZER_STATE = "optimizer_state"
    """Optimizer state init (``_init_group``, DeepSpeed ``initialize_optimizer_states``,
    fp32 master partitions)."""
    ACTIVATIONS = "activations"
    """Allocated inside a ``forward``: activations kept for backward, or forward outputs and
    temporaries still referenced (a stack cannot show whether autograd kept them)."""
    ZERO3_GATHERED_PARAMS = "zero3_gathered_params"
    """Full parameters all-gathered by DeepSpeed ZeRO-3 (``fetch_sub_module``, ``_all_gather``)."""
    ZERO_BUCKETS = "zero_buckets"
    """DeepSpeed gradient buckets and reduce-scatter buffers (``__add_grad_to_ipg_bucket`` ...)."""
    TEMPORARIES = "temporaries"
    """Short-lived work tensors: optimizer-step intermediates, gradient clipping."""
    WORKSPACE = "workspace"
    """Library workspaces allocated through the caching allocator (cuBLAS/cuBLASLt)."""
    UNKNOWN = "unknown"
    """No stack was recorded, or no frame of it is recognised."""


class Confidence(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


@dataclass(frozen=True, slots=True)
class CallSite:
    """One frame of an allocation stack, used to group bytes by who allocated them.

    ``is_user_code`` is False for library frames (torch, DeepSpeed, transformers, ...,
    anything under site-packages or the standard library) and for native frames.  A group
    keyed by a library or native frame means the stack had no user frame at all.
    """

    filename: str
    line: int
    name: str
    is_user_code: bool
    is_native: bool

    def describe(self) -> str:
        """``train.py:42 in forward``, or a shortened native symbol (``AddmmBackward0::apply``)."""
        if self.is_native:
            return f"{_short_native_name(self.name)} (native)"
        base = self.filename.rsplit("/", 1)[-1] or self.filename
        return f"{base}:{self.line} in {self.name}"


def _short_native_name(symbol: str) -> str:
    """``...::AddmmBackward0::apply(std::vector<...>&&)``: ``AddmmBackward0::apply``."""
    depth = 0
    cut = len(symbol)
    for index, char in enumerate(symbol):
        if char in "<(":
            if char == "(" and depth == 0:
                cut = index
                break
            depth += 1
        elif char in ">)":
            depth = max(0, depth - 1)
    head = symbol[:cut]
    parts = [part for part in head.split("::") if part]
    return "::".join(parts[-2:]) if len(parts) >= 2 else head


@dataclass(frozen=True, slots=True)
class CategoryBytes:
    """Live bytes of one category, with the frame that decided it for the largest share."""

    category: MemoryCategory
    bytes: int
    blocks: int
    confidence: Confidence
    evidence: str
    """Why, e.g. ``frame adam.py:178 in _init_group (optimizer state init)``."""


@dataclass(frozen=True, slots=True)
class SiteBytes:
    """Live bytes attributed to one call site (the first user frame of the stack).

    ``site`` is None for blocks with no recorded stack.  ``category`` is the category of the
    largest share of these bytes.  ``common_size`` is the block size that occurs most often
    among them and ``common_size_blocks`` how many blocks have it: many equal blocks from one
    site are tensors of one shape piling up (kept across steps, or one per layer).
    """

    site: CallSite | None
    bytes: int
    blocks: int
    category: MemoryCategory
    common_size: int
    common_size_blocks: int


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One block, for top-N lists."""

    address: int
    size: int
    requested_size: int
    state: BlockState
    segment_address: int
    pool: Pool
    stream: int
    site: CallSite | None
    category: MemoryCategory


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment, for top-N lists (e.g. segments pinned by a live block)."""

    address: int
    total_size: int
    allocated_bytes: int
    active_bytes: int
    free_bytes: int
    largest_free_block: int
    blocks: int
    live_blocks: int
    pool: Pool
    stream: int
    pool_id: tuple[int, int]
    is_expandable: bool


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """Usage of one pool (small/large) over default-pool and private-pool segments alike."""

    pool: Pool
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    free_bytes: int
    largest_free_block: int


@dataclass(frozen=True, slots=True)
class FreeSpace:
    """Free (inactive) blocks usable by one (pool, stream, private pool) triple.

    The allocator's best fit only looks at blocks of the request's pool *and* stream, and
    private-pool blocks serve only their pool, so this is what a request could have used.
    """

    pool: Pool
    stream: int
    pool_id: tuple[int, int]
    free_bytes: int
    free_blocks: int
    largest_free_block: int


@dataclass(frozen=True, slots=True)
class PrivatePoolUsage:
    """A CUDA-graph / ``MemPool`` private pool (``segment_pool_id != (0, 0)``)."""

    pool_id: tuple[int, int]
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryState:
    """What the allocator held on one device when the snapshot was taken (from ``segments``).

    Identities (exact):

    * ``reserved_bytes = allocated_bytes + pending_free_bytes + free_bytes``;
    * ``free_bytes = unreleasable_free_bytes + expandable_free_bytes + releasable_free_bytes``
      (+ free bytes of private pools counted in ``private_pool_free_bytes``, which are part of
      the three terms too);
    * ``reserved_unallocated_bytes = reserved_bytes - allocated_bytes - private_pool_free_bytes``
      is the OOM message's "reserved by PyTorch but unallocated"; the message's "allocated by
      PyTorch" is ``allocated_bytes + private_pool_free_bytes`` (torch >= 2.4).

    ``unreleasable_free_bytes``: free blocks inside non-expandable segments that still hold a
    live (allocated or pending-free) block.  ``empty_cache`` and the OOM retry cannot return
    them (torch's "Non-releasable memory", ``inactive_split_bytes``).
    ``releasable_free_bytes``: segments with no live block at all (``releasable_segments`` of
    them); the OOM retry frees these before failing, so at OOM time they are 0 unless they
    belong to a private pool.
    ``expandable_free_bytes``: free blocks inside expandable segments (pages can be unmapped).
    ``internal_waste_bytes``: ``size - requested_size`` over allocated blocks (rounding).
    """

    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int
    pending_free_bytes: int
    pending_free_blocks: int
    free_bytes: int
    unreleasable_free_bytes: int
    unreleasable_segments: int
    releasable_free_bytes: int
    releasable_segments: int
    expandable_free_bytes: int
    private_pool_free_bytes: int
    reserved_unallocated_bytes: int
    internal_waste_bytes: int
    largest_free_block: int
    segments: int
    blocks: int
    live_blocks: int
    split_segments: int
    expandable_segments: int
    pools: tuple[PoolUsage, ...]
    free_space: tuple[FreeSpace, ...]
    private_pools: tuple[PrivatePoolUsage, ...]


@dataclass(frozen=True, slots=True)
class OomEntry:
    """An ``oom`` trace entry: a request the allocator could not serve.

    ``request_bytes`` is what torch recorded: the request rounded (to 512 B or a power-2
    division).  ``alloc_size_bytes`` is the segment size torch tried to cudaMalloc for it, the
    figure the OOM message prints as "Tried to allocate" (2 MiB for <= 1 MiB requests, 20 MiB
    below 10 MiB, else rounded up to 2 MiB).  ``device_free_bytes`` is cudaMemGetInfo's free
    at the failure ("of which X is free").

    The comparison fields use the snapshot's segments and are only meaningful when
    ``snapshot_at_oom`` is True (no allocator event between the OOM and the snapshot, as with
    a snapshot dumped from an OOM observer): ``largest_free_block`` / ``free_bytes`` are the
    free blocks of the request's pool and stream in the default pool, and
    ``fits_largest_free_block`` says whether the biggest of them could have held the request.
    """

    trace_index: int
    time_us: int | None
    request_bytes: int
    alloc_size_bytes: int
    pool: Pool
    stream: int
    device_free_bytes: int | None
    site: CallSite | None
    category: MemoryCategory
    snapshot_at_oom: bool
    largest_free_block: int
    free_bytes: int
    fits_largest_free_block: bool


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Bytes live (allocated + pending free) and reserved after trace entry ``index``."""

    index: int
    time_us: int | None
    active_bytes: int
    reserved_bytes: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """The allocation history of one device, replayed from ``device_traces``.

    Allocation sizes are rounded as the allocator rounds them; the curve is anchored so that
    it ends at the active/reserved bytes of the snapshot's segments, and ``baseline_*`` are
    the bytes already live before the first recorded event (allocations made before
    recording began; for the active curve also the slack of blocks handed out unsplit, so it
    is approximate).  ``samples`` is the curve downsampled to at most a few hundred points,
    each the maximum of its stretch.  ``unmatched_frees`` counts frees of blocks allocated
    before the recorded history (a ring buffer that wrapped, or recording started late).
    """

    entries: int
    first_time_us: int | None
    last_time_us: int | None
    allocs: int
    frees: int
    segment_allocs: int
    segment_frees: int
    ooms: int
    unmatched_frees: int
    baseline_active_bytes: int
    baseline_reserved_bytes: int
    peak_active: TimelinePoint
    peak_reserved: TimelinePoint
    end: TimelinePoint
    samples: tuple[TimelinePoint, ...]


@dataclass(frozen=True, slots=True)
class Growth:
    """What grew between ``start`` and ``end`` and was still live at ``end``.

    ``basis`` says how the window was chosen: ``since_lowest_point`` (from the lowest point of
    the recorded curve before the end to the end) or ``last_iteration`` (from the start of the
    iteration in which the end falls).  ``end`` is the OOM entry when there is one, else the
    last entry.  ``by_site``/``by_category`` hold the allocations made inside the window that
    were still live at ``end`` (top entries only); ``live_new_bytes`` is their total.
    """

    basis: str
    start: TimelinePoint
    end: TimelinePoint
    net_bytes: int
    live_new_bytes: int
    by_site: tuple[SiteBytes, ...]
    by_category: tuple[CategoryBytes, ...]


@dataclass(frozen=True, slots=True)
class Iterations:
    """Training iterations found in the history.

    ``source`` is ``annotations`` (``external_annotations`` START markers named ``marker``:
    ``Optimizer.step#Adam.step``, which torch's optimizers record by themselves, or
    ``ProfilerStep#<n>``) or ``alloc_pattern`` (an allocation of the same size and stack depth
    recurring at a regular interval, with live bytes rising and falling back within each
    period).  ``alloc_pattern`` is weaker: when the history is shorter than one training step
    (a small ``max_entries``), the cycle found may be one layer of a step (ZeRO-3 gathers and
    releases each layer's parameters) rather than a step.  ``complete`` is the number of
    whole iterations between the first and last boundary seen in the trace.
    ``active_at_boundaries`` are the live bytes at each boundary (the last
    ``MAX_BOUNDARIES`` of them).
    """

    source: str
    marker: str
    complete: int
    median_entries: int
    median_duration_us: int | None
    boundary_indices: tuple[int, ...]
    active_at_boundaries: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LeakSite:
    """A call site whose allocations survive iteration after iteration."""

    site: CallSite | None
    category: MemoryCategory
    bytes_per_iteration: int
    iterations_with_survivors: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Leak:
    """Live bytes growing by about the same amount every iteration.

    ``bytes_per_iteration`` is the median growth of live bytes from one iteration boundary to
    the next; ``increments`` are those growths (the last ones); ``growing_fraction`` is the
    share of them that are > 0.  ``sites`` are the call sites whose allocations made in most
    complete iterations were still live at the OOM (or, without one, at the end of the trace).
    """

    bytes_per_iteration: int
    iterations: int
    total_growth_bytes: int
    growing_fraction: float
    increments: tuple[int, ...]
    sites: tuple[LeakSite, ...]


@dataclass(frozen=True, slots=True)
class DeviceAnalysis:
    """Everything the snapshot says about one device.

    ``oom`` is the last ``oom`` entry of the device's trace (``earlier_ooms`` counts the ones
    before it, e.g. OOMs the program caught).  ``growth`` is what grew from the lowest point
    of the recorded history to the OOM (or the end); ``iteration_growth`` what grew since the
    start of the iteration the OOM (or the end) fell in.  ``timeline``, ``growth``,
    ``iteration_growth``, ``iterations`` and ``leak`` are None when the history cannot tell
    (``history`` says why: a state-only snapshot has no timeline; capture with
    ``_record_memory_history(enabled='all')`` next time).  ``notes`` are short
    machine-readable remarks (see :data:`oomlens.analysis.allocator.NOTES`).  ``replay`` is
    what replaying the recorded allocations with expandable segments says about the OOM
    (:mod:`oomlens.analysis.whatif`); None when it was not replayed (no OOM, no history, nothing
    reserved but unallocated, or the trace too long).
    """

    device: int
    history: HistoryMode
    state: MemoryState
    oom: OomEntry | None
    earlier_ooms: int
    live_by_site: tuple[SiteBytes, ...]
    live_by_category: tuple[CategoryBytes, ...]
    top_blocks: tuple[BlockInfo, ...]
    pinned_segments: tuple[SegmentInfo, ...]
    timeline: Timeline | None
    growth: Growth | None
    iteration_growth: Growth | None
    iterations: Iterations | None
    leak: Leak | None
    notes: tuple[str, ...]
    replay: ReplayVerdict | None = None


@dataclass(frozen=True, slots=True)
class SnapshotAnalysis:
    """The analysis of one snapshot: header facts plus one :class:`DeviceAnalysis` per device."""

    source: SourceRef
    layout: SnapshotLayout
    history: HistoryMode
    stacks: StackDepth
    allocator_settings: AllocatorSettings | None
    devices: tuple[DeviceAnalysis, ...]

    def device(self, index: int) -> DeviceAnalysis | None:
        """The analysis of device ``index``, or None when the snapshot shows no use of it."""
        for analysis in self.devices:
            if analysis.device == index:
                return analysis
        return None
