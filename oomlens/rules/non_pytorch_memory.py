"""Memory this process holds outside PyTorch's caching allocator (CUDA context, NCCL, libraries)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Fix, Severity, in_bytes
from oomlens.facts.run import RunFacts
from oomlens.rules._common import (
    OomMessage,
    allocator_oom,
    oom_evidence,
    oom_figures,
    size,
)
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="non_pytorch_memory",
    title="Memory outside PyTorch's allocator",
    severity=Severity.MEDIUM,
    explanation=(
        "This process holds GPU memory that PyTorch's caching allocator does not manage: the "
        "CUDA context (0.3-0.7 GiB), cuBLAS/cuDNN handles, NCCL communication buffers (hundreds "
        "of MiB to several GiB per rank), and other libraries' allocations (cupy, JAX, "
        "TensorRT). None of it shows in memory_allocated() or in snapshots."
    ),
    verify=(
        "the OOM message's 'this process has X in use' minus what PyTorch reserved falls back to "
        "the size of a CUDA context (well under a GiB); NCCL_DEBUG=INFO shows the smaller "
        "buffers."
    ),
    thresholds=("non_pytorch_self_max_bytes",),
    precedence=30,
)


class NonPytorchMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None:
            return
        n: OomMessage = event.message
        outside = n.non_pytorch_self
        if outside is None or outside < thresholds.non_pytorch_self_max_bytes:
            return
        share = outside / n.total_capacity if n.total_capacity else 0.0
        yield SPEC.diagnose(
            confidence=0.35 + share,
            summary=(
                f"this process held {size(outside)} of GPU memory outside PyTorch's allocator "
                f"(in use {size(n.process_in_use)}, PyTorch reserved {size(n.reserved)})"
            ),
            evidence=(
                oom_evidence(
                    event,
                    f"{size(n.process_in_use)} in use by this process - {size(n.reserved)} "
                    f"reserved by PyTorch = {size(outside)} elsewhere",
                ),
            ),
            fixes=(
                Fix(
                    "Shrink NCCL's buffers if they are the cause (set NCCL_DEBUG=INFO to see "
                    "their sizes), and keep other GPU libraries from preallocating.",
                    environment={
                        "NCCL_BUFFSIZE": "2097152",
                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                    },
                    cost="NCCL: possibly slower collectives",
                ),
            ),
            missing=("NCCL's own report of its buffers: NCCL_DEBUG=INFO",),
            rank=event.rank,
            figures={**oom_figures(n), "non_pytorch_bytes": in_bytes(outside)},
        )


RULE = NonPytorchMemoryRule()
