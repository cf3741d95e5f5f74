"""DeepSpeed's own estimators, restated: ``estimate_zero3_model_states_mem_needs`` and
``estimate_zero2_model_states_mem_needs`` (the tests pin both against the installed DeepSpeed).
They count 18 bytes per parameter for model states, +4x the largest layer, and a 1.5 host buffer
factor, so they differ from the component budget by design: shown next to it as a cross-check.
"""

from __future__ import annotations

from oomlens.facts.config import EffectiveDsConfig
from oomlens.facts.memory_model import EstimatorCrossCheck, ModelSize, Topology

# -- DeepSpeed's estimators ----------------------------------------------------------------------


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """``estimate_zero3_model_states_mem_needs`` of DeepSpeed 0.19.8, restated:
    (CPU bytes per node, GPU bytes per GPU, largest layer bytes)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    cpu_mem: float
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = (
                    total_params
                    * max(4 * num_gpus_per_node, 18 * gpus_factor)
                    * additional_buffer_factor
                )
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = (
                    total_params
                    * max(4 * num_gpus_per_node, 16 * gpus_factor)
                    * additional_buffer_factor
                )
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def deepspeed_zero2_estimate(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """``estimate_zero2_model_states_mem_needs`` of DeepSpeed 0.19.8, restated:
    (CPU bytes per node, GPU bytes per GPU)."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def estimator_for(
    eff: EffectiveDsConfig, model: ModelSize, topo: Topology
) -> EstimatorCrossCheck | None:
    stage = int(eff.zero.stage.value)
    gpn = topo.ranks_per_host
    nodes = topo.nodes
    oo = eff.zero.offload_optimizer.enabled
    if stage == 3:
        op = eff.zero.offload_param.enabled
        largest = model.largest_layer_params or 0
        cpu, gpu, _ = deepspeed_zero3_estimate(
            model.total_params, largest, gpn, nodes, oo, op and oo
        )
        args = (
            f"total_params={model.total_params}, largest_layer_params={largest}, "
            f"num_gpus_per_node={gpn}, "
            f"num_nodes={nodes}, cpu_offload={oo}, cpu_offload_params={op and oo}"
        )
        return EstimatorCrossCheck("estimate_zero3_model_states_mem_needs", args, gpu, cpu)
    if stage == 2:
        cpu, gpu = deepspeed_zero2_estimate(model.total_params, gpn, nodes, oo)
        args = (
            f"total_params={model.total_params}, num_gpus_per_node={gpn}, num_nodes={nodes}, "
            f"cpu_offload={oo}"
        )
        return EstimatorCrossCheck("estimate_zero2_model_states_mem_needs", args, gpu, cpu)
    return None
