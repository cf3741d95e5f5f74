"""The ZeRO memory model's facts: a config's memory budget per GPU and per host, the capacity
it is compared with, the verdicts, and the config patches predicted to help.

``oomlens.analysis.zero_model`` computes them (see its docstring for how); rules and renderers
read them.  ``MemoryBudget`` carries its peaks, computed once when the budget is built.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from oomlens.facts import SourceRef
from oomlens.facts.config import Precision

#: Host memory a training rank uses outside DeepSpeed's buffers (Python, torch and CUDA
#: libraries, the CUDA context's host side, page cache).  Measured in the crash corpus (torch
#: 2.11, CUDA 13, DeepSpeed 0.19.8): checkpoint_save_host_oom's cgroup peak during engine init,
#: 5,053,739,008 B for 2 ranks, minus the 2 x 1.34 GB defragment copies = 1.19 GB per rank.
#: Runs with the optimizer offloaded to DeepSpeedCPUAdam measured 1.76-1.87 GB per rank.
DEFAULT_PROCESS_BASELINE_BYTES = 1_200_000_000


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
"""The memory model's components that are model states (parameters, gradients, optimizer
states and master weights), not buckets, gathers or buffers."""


class Device(Enum):
    GPU = "gpu"
    HOST = "host"


class BudgetPhase(Enum):
    """When a component exists."""

    PERSISTENT = "persistent"
    """From engine init on (or, for optimizer states, from the first step on)."""
    INIT = "engine init"
    """Only while ``deepspeed.initialize`` builds the optimizer."""
    FORWARD_BACKWARD = "forward/backward"
    OPTIMIZER_STEP = "optimizer step"
    CHECKPOINT_SAVE = "checkpoint save"


class Basis(Enum):
    CODE = "code"
    BOUND = "bound"
    ESTIMATE = "estimate"


@dataclass(frozen=True, slots=True)
class ModelSize:
    """Parameter counts (elements).  ``trainable_params`` defaults to ``total_params``;
    ``largest_layer_params`` (the biggest module's own parameters: often the embedding) is what
    one module gather needs - unknown means the current-module term is left out.
    ``source`` says where the numbers come from (``--params``, the log's
    ``finished initializing model`` line, a snapshot)."""

    total_params: int
    trainable_params: int | None = None
    largest_layer_params: int | None = None
    hidden_size: int | None = None
    source: str = ""
    source_ref: SourceRef | None = None

    @property
    def trainable(self) -> int:
        return self.total_params if self.trainable_params is None else self.trainable_params


@dataclass(frozen=True, slots=True)
class ActivationShape:
    """What activation memory depends on, for the optional activation estimate (outside
    ds_config, so only when the caller knows it).  ``micro_batch`` is the per-GPU micro batch
    (the config's, or what DeepSpeed derives); ``flash_attention`` drops the attention-score
    term (SDPA/flash kernels do not store it); ``checkpointing`` is full activation
    checkpointing of every layer."""

    micro_batch: int
    seq_len: int
    hidden_size: int
    layers: int
    vocab_size: int | None = None
    heads: int | None = None
    flash_attention: bool = True
    checkpointing: bool = False


@dataclass(frozen=True, slots=True)
class Topology:
    """``world_size``: ranks in the ZeRO partition group (the data-parallel size);
    ``gpus_per_node``: ranks per host (they share its RAM and pinned memory)."""

    world_size: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.gpus_per_node < 1:
            raise ValueError("world_size and gpus_per_node must be at least 1")

    @property
    def nodes(self) -> int:
        return math.ceil(self.world_size / self.gpus_per_node)

    @property
    def ranks_per_host(self) -> int:
        return min(self.gpus_per_node, self.world_size)


@dataclass(frozen=True, slots=True)
class MemoryComponent:
    """One allocation class.  ``bytes`` is per GPU for ``Device.GPU`` and per rank for
    ``Device.HOST`` (a host holds ``Topology.ranks_per_host`` of them) unless ``per_host``.
    ``formula`` shows the arithmetic; ``key_paths`` the config keys that drive it."""

    code: str
    name: str
    device: Device
    phase: BudgetPhase
    bytes: int
    formula: str
    key_paths: tuple[str, ...] = ()
    pinned: bool = False
    basis: Basis = Basis.CODE
    per_host: bool = False
    note: str = ""
    requested_bytes: int | None = None
    """For pinned buffers: what DeepSpeed asks to pin (what its ``[pinned-memory ...]`` log
    lines count), before torch's allocator rounds it up; None when equal to ``bytes``."""


@dataclass(frozen=True, slots=True)
class EstimatorCrossCheck:
    """DeepSpeed's own estimator for this stage/offload/topology (``None`` fields: it has no
    number for this case).  ``host_bytes`` is per node, ``gpu_bytes`` per GPU."""

    function: str
    arguments: str
    gpu_bytes: int | None
    host_bytes: int | None


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Every component for one config, model and topology, with the assumptions made."""

    stage: int
    precision: Precision
    model: ModelSize
    topology: Topology
    components: tuple[MemoryComponent, ...]
    gpu_peak_bytes: int
    """The GPU's peak over DeepSpeed's allocation timeline (one GPU)."""
    host_peak_bytes: int
    """One host's peak (all its ranks)."""
    assumptions: tuple[str, ...] = ()
    estimator: EstimatorCrossCheck | None = None
    activations: ActivationShape | None = None
    process_baseline_bytes: int = DEFAULT_PROCESS_BASELINE_BYTES

    def on(self, device: Device, phase: BudgetPhase | None = None) -> list[MemoryComponent]:
        return [
            c for c in self.components if c.device is device and (phase is None or c.phase is phase)
        ]

    def component(self, code: str) -> MemoryComponent | None:
        return next((c for c in self.components if c.code == code), None)

    def pinned_per_host(self) -> int:
        """Page-locked host memory of one host (all its ranks), at its largest (init included)."""
        total = 0
        for comp in self.components:
            if comp.device is Device.HOST and comp.pinned:
                total += comp.bytes if comp.per_host else comp.bytes * self.topology.ranks_per_host
        return total

    def pinned_requested_per_rank(self) -> int:
        """Pinned bytes one rank asks for (DeepSpeed's ``pin_memory_tracker`` total), before
        torch's power-of-two rounding."""
        return sum(
            c.bytes if c.requested_bytes is None else c.requested_bytes
            for c in self.components
            if c.device is Device.HOST and c.pinned and not c.per_host
        )

    def gpu_model_states(self) -> int:
        """Persistent GPU bytes: parameters, gradients, master weights, optimizer states, bucket."""
        return sum(c.bytes for c in self.on(Device.GPU, BudgetPhase.PERSISTENT))


@dataclass(frozen=True, slots=True)
class Capacity:
    """Memory to compare against.  ``gpu_bytes``: the card's total (``--gpu-memory``, or the OOM
    message's total capacity / allowed memory); ``gpu_reserved_bytes``: what is not available to
    PyTorch (CUDA context, other processes) when known.  ``host_bytes``: one host's RAM (or its
    cgroup limit)."""

    gpu_bytes: int | None = None
    gpu_source: str = ""
    host_bytes: int | None = None
    host_source: str = ""
    gpu_reserved_bytes: int = 0

    @classmethod
    def from_oom_message(
        cls,
        *,
        total_capacity: int,
        free: int | None = None,
        allocated_by_pytorch: int | None = None,
        reserved_unallocated: int | None = None,
        allowed: int | None = None,
        source: str = "OOM message",
        host_bytes: int | None = None,
        host_source: str = "",
    ) -> Capacity:
        """The GPU memory this process's PyTorch could use, from torch's OOM message numbers.

        torch prints the card's total capacity, what is free, and what PyTorch holds (allocated
        plus reserved-but-unallocated); the rest is the CUDA context and other processes.  So
        PyTorch could have had ``free + allocated + reserved_unallocated``, capped by the
        ``allowed`` memory when a memory fraction is set.  Without the breakdown, the total.
        """
        usable = total_capacity
        if (
            free is not None
            and allocated_by_pytorch is not None
            and reserved_unallocated is not None
        ):
            usable = free + allocated_by_pytorch + reserved_unallocated
        if allowed is not None:
            usable = min(usable, allowed)
        return cls(
            gpu_bytes=usable,
            gpu_source=source,
            host_bytes=host_bytes,
            host_source=host_source,
        )


@dataclass(frozen=True, slots=True)
class CapacityVerdict:
    """One device's budget against its capacity.

    ``required_bytes``: the model's peak; ``headroom_bytes``: capacity minus that (negative when
    it cannot fit; on a GPU what is left for activations, workspace and fragmentation).
    Walking DeepSpeed's allocations in order (engine init, first forward/backward, first
    optimizer step - where optimizer states are created -, later passes), ``overflow_phase`` is
    the step where the running total first exceeds the capacity and ``overflow_component`` the
    largest allocation of that step (within a step the order of allocations is not known).
    ``overflow_bytes`` is the peak minus the capacity (0 when it fits).  ``kind`` is ``gpu``,
    ``host`` or ``pinned``.
    """

    kind: str
    capacity_bytes: int
    capacity_source: str
    required_bytes: int
    peak_phase: str
    headroom_bytes: int
    overflow_component: MemoryComponent | None
    overflow_phase: str | None
    overflow_bytes: int

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0


#: Merge-patch value meaning "remove this key".
DELETE = None


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """Set ``key_path`` (dotted, as written in the config) to ``new``; ``new=None`` removes the
    key.  ``old`` is the value in force before (filled by ``make_patch``)."""

    key_path: str
    new: Any
    old: Any = None


@dataclass(frozen=True, slots=True)
class ConfigPatch:
    """A ds_config change and what it is predicted to do.

    ``gpu_bytes_saved``: per GPU, positive means less GPU memory at the peak.
    ``host_bytes_delta``: per host, positive means more host RAM (offloading moves memory there).
    ``pinned_bytes_delta``: per host, change in page-locked host memory.
    Any of them is None when the memory model cannot put a number on it.  ``cost`` says what
    it costs (speed, semantics).
    """

    changes: tuple[ConfigChange, ...]
    summary: str
    cost: str
    gpu_bytes_saved: int | None = None
    host_bytes_delta: int | None = None
    pinned_bytes_delta: int | None = None

    def merge_patch(self) -> dict[str, Any]:
        """The RFC 7386 merge patch (``null`` removes a key)."""
        patch: dict[str, Any] = {}
        for change in self.changes:
            parts = change.key_path.split(".")
            node = patch
            for part in parts[:-1]:
                child = node.get(part)
                if not isinstance(child, dict):
                    child = node[part] = {}
                node = child
            node[parts[-1]] = change.new
        return patch

    def apply_to(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with the merge patch applied (a new dict; ``config`` is not modified)."""
        result: dict[str, Any] = apply_merge_patch(config, self.merge_patch())
        return result


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 ``MergePatch(target, patch)``."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


@dataclass(frozen=True, slots=True)
class MemoryModelFacts:
    """The ZeRO memory model for this run: what the config implies per GPU and per host for
    the model's parameter count, compared with the capacity in force, and the config patches
    it predicts would help (most memory saved first)."""

    budget: MemoryBudget
    verdicts: tuple[CapacityVerdict, ...]
    patches: tuple[ConfigPatch, ...]
    assumptions: tuple[str, ...]

    def verdict(self, kind: str) -> CapacityVerdict | None:
        for verdict in self.verdicts:
            if verdict.kind == kind:
                return verdict
        return None
