"""The ZeRO memory model: what a DeepSpeed config costs per GPU and per host, and what a config
change would save.

Inputs: the effective config (``oomlens.facts.config``), the model size (total, trainable and
largest-layer parameter counts) and the topology (data-parallel ranks, ranks per host).
Output: a ``MemoryBudget`` - a list of ``MemoryComponent``, each with its bytes, the formula and
config keys that drive it, the phase it lives in and how sure the number is (``Basis``):

* ``CODE``: an allocation DeepSpeed 0.19.8 makes with exactly this size (``stage3.py``:
  ``grad_partitions_flat_buffer``, the IPG bucket ``torch.empty(reduce_bucket_size)``, the fp32
  partitions, the pinned CPU buffers...);
* ``BOUND``: an upper bound inferred from the code (the gathered-parameter working set under
  ``stage3_prefetch_bucket_size`` / ``max_live_parameters`` / ``max_reuse_distance``, gradients
  waiting for an in-flight reduce);
* ``ESTIMATE``: a coarser reading (ZeRO stages 0-2, optimizer state sizes for optimizers
  oomlens does not know).

Activations, the CUDA context and allocator fragmentation are outside the model: the budget
says what remains for them.  ``compare_with_capacity`` walks the allocations in the order
DeepSpeed makes them (engine init, first forward/backward, first optimizer step - when Adam
states are created -, later forward/backward passes) and names the component at which the card
or the host overflows and by how much.  ``candidate_patches`` builds the config changes that
would shrink the overflowing part, each with its predicted saving from this same model.

DeepSpeed's own estimators (``estimate_zero3_model_states_mem_needs``,
``estimate_zero2_model_states_mem_needs``) are restated in ``deepspeed_zero3_estimate`` and
``deepspeed_zero2_estimate`` and shown next to the budget as a cross-check; the tests pin both
against the installed DeepSpeed.  They differ from the component model by design: they count
18 bytes per parameter for model states, +4x the largest layer, and a 1.5 host buffer factor.

Modules: ``budget`` (the components), ``estimators`` (DeepSpeed's own), ``timeline`` (peaks and
capacity verdicts), ``patches`` (config changes with their predicted savings), ``hazards``.
The facts they produce (``MemoryBudget``, ``CapacityVerdict``, ``ConfigPatch``...) are in
``oomlens.facts.memory_model``.
"""

from __future__ import annotations

from oomlens.analysis.zero_model.accounting import (
    POW2_ROUNDING_FACTOR,
    optimizer_state_elements,
    pinned_allocation,
    sub_group_sizes,
)
from oomlens.analysis.zero_model.budget import build_budget
from oomlens.analysis.zero_model.estimators import (
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
)
from oomlens.analysis.zero_model.hazards import far_above_defaults, memory_hazards
from oomlens.analysis.zero_model.patches import (
    candidate_patches,
    patch_offload_optimizer,
    patch_prefetch,
    patch_unpin,
    with_settings,
)
from oomlens.analysis.zero_model.timeline import (
    compare_with_capacity,
    gpu_peak,
    gpu_phase_totals,
    host_peak,
    phase_of_step,
)

__all__ = [
    "POW2_ROUNDING_FACTOR",
    "build_budget",
    "candidate_patches",
    "compare_with_capacity",
    "deepspeed_zero2_estimate",
    "deepspeed_zero3_estimate",
    "gpu_peak",
    "gpu_phase_totals",
    "host_peak",
    "far_above_defaults",
    "memory_hazards",
    "optimizer_state_elements",
    "patch_offload_optimizer",
    "patch_prefetch",
    "patch_unpin",
    "phase_of_step",
    "pinned_allocation",
    "sub_group_sizes",
    "with_settings",
]
