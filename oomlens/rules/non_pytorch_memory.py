"""Memory this process holds outside PyTorch's caching allocator (CUDA context, NCCL, libraries)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, in_bytes
from oomlens.facts.log import OomEvent, OomKind, OomMessage
from oomlens.facts.oom_balance import MessageBalance
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import oom_evidence, oom_figures, self_listed_evidence, size
from oomlens.rules.common.message import allocator_oom, message_balance
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
    thresholds=(
        "context_min_bytes",
        "context_min_fraction",
        "non_pytorch_self_max_bytes",
        "other_process_self_match_bytes",
        "other_process_unlisted_fraction",
    ),
    precedence=30,
)

_API_CALL = re.compile(r"\b(cu(?:da)?[A-Z][A-Za-z0-9_]*)\s*\(")
"""A CUDA runtime or driver API call named in an error (``cudaFuncSetAttribute(...)``)."""
_ALLOCATING = ("alloc", "memcreate", "hostregister", "mempool")
"""Calls whose failure is an allocation's: they are not 'memory needed outside an allocator'
(``cudaHostAlloc`` is pinned host memory: the pinned-memory rule's)."""
_NON_ALLOCATING_CALL_CONFIDENCE = 0.3
"""One sign, read from the failing call's name alone: named, low."""


class NonPytorchMemoryRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None:
            return
        n: OomMessage = event.message
        if n.kind is OomKind.DRIVER:
            yield from self._non_allocating_call(event)
            return
        b = message_balance(n, thresholds)
        outside = b.non_pytorch_self
        if outside is not None and outside >= thresholds.non_pytorch_self_max_bytes:
            share = outside / n.total_capacity if n.total_capacity else 0.0
            evidence = [
                oom_evidence(
                    event,
                    f"{size(b.in_use_self)} in use by this process - {size(b.reserved)} "
                    f"reserved by PyTorch = {size(outside)} elsewhere",
                )
            ]
            itself = self_listed_evidence(event, b)
            if itself is not None:
                evidence.append(itself)
            yield self._diagnosis(event, b, outside, 0.35 + share, evidence, _distributed(facts))
            return
        context = self._context(b, thresholds)
        if context is not None:
            held, confidence = context
            evidence = [
                oom_evidence(event),
                Evidence(
                    EvidenceKind.DERIVED,
                    f"capacity {size(b.capacity)} - reserved by PyTorch {size(b.reserved)} - "
                    f"free {size(b.free)} = {size(held)} outside PyTorch's allocator",
                    event.source,
                    f"{held / (b.capacity or 1):.0%} of this card: the CUDA context, cuDNN/cuBLAS "
                    "workspaces, other libraries and (on a desktop) the display; without it the "
                    f"{size(b.request)} request would have fit",
                ),
            ]
            yield self._diagnosis(event, b, held, confidence, evidence, _distributed(facts))

    @staticmethod
    def _non_allocating_call(event: OomEvent) -> Iterator[Diagnosis]:
        """A driver-level 'out of memory' from a CUDA call that allocates nothing itself
        (setting a kernel's shared memory, loading a module, creating a stream or a library
        handle): the driver could not find the little memory that call needs, so the card was
        already full outside any tensor allocator's request, most often filled by a memory
        pool that preallocates the card (JAX, TensorFlow, cupy, another framework in the
        process); another process is the other candidate."""
        call = _API_CALL.search(event.message.text)
        if call is None or any(word in call.group(1).lower() for word in _ALLOCATING):
            return
        name = call.group(1)
        yield SPEC.diagnose(
            confidence=_NON_ALLOCATING_CALL_CONFIDENCE,
            summary=(
                f"{name}, a CUDA call that allocates no tensor, ran out of memory: the card was "
                "already full outside the allocators' requests, most often held by a "
                "framework's preallocated pool (or by another process)"
            ),
            evidence=(
                oom_evidence(event, f"the failing call is {name}: not an allocation"),
                Evidence(
                    EvidenceKind.DERIVED,
                    f"{name} needs only the driver's own memory (kernel resources, a module, "
                    "a handle)",
                    event.source,
                    "no size is printed: which holder filled the card is not in the message",
                ),
            ),
            fixes=(
                Fix(
                    "Keep preallocating libraries from taking the whole card (JAX: "
                    "XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION; "
                    "TensorFlow: memory growth), and check nvidia-smi for other processes.",
                    environment={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                    cost="none for PyTorch; a preallocating framework may run a little slower",
                ),
            ),
            missing=(
                "what holds the card besides the job: nvidia-smi (or "
                "torch.cuda.list_gpu_processes()) just before the failing call",
            ),
            rank=event.rank,
        )

    @staticmethod
    def _context(b: MessageBalance, thresholds: Thresholds) -> tuple[int, float] | None:
        """Memory outside the allocator that no listed process accounts for, large for the card
        and enough to have made the difference (messages without 'this process has')."""
        held = b.outside_unlisted
        if (
            held is None
            or b.in_use_self is not None
            or b.others
            or not b.capacity  # a capacity of 0 is no card torch reports on
            or b.free is None
            or b.request is None
            or b.capped
            or b.oversized
        ):
            return None
        share = held / b.capacity
        if (
            share < thresholds.context_min_fraction
            or held < thresholds.context_min_bytes
            or b.free + held < b.request
        ):
            return None
        # Larger shares are more likely another process (other_process ranks them higher).
        return held, 0.3 if share >= thresholds.other_process_unlisted_fraction else 0.4

    @staticmethod
    def _diagnosis(
        event: OomEvent,
        b: MessageBalance,
        outside: int,
        confidence: float,
        evidence: list[Evidence],
        distributed: bool,
    ) -> Diagnosis:
        n = event.message
        return SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"this process held {size(outside)} of GPU memory outside PyTorch's allocator "
                f"(in use {size(b.in_use_self)}, PyTorch reserved {size(b.reserved)})"
                if b.in_use_self is not None
                else f"{size(outside)} of the {size(b.capacity)} card was outside PyTorch's "
                f"allocator (PyTorch reserved {size(b.reserved)}, {size(b.free)} free)"
            ),
            evidence=tuple(evidence),
            fixes=(_OUTSIDE_DISTRIBUTED if distributed else _OUTSIDE_ONE_PROCESS,),
            missing=(
                *(("NCCL's own report of its buffers: NCCL_DEBUG=INFO",) if distributed else ()),
                "what holds the card besides PyTorch: torch.cuda.list_gpu_processes() or "
                "nvidia-smi after allocating a small tensor",
            ),
            rank=event.rank,
            figures={**oom_figures(n), "non_pytorch_bytes": in_bytes(outside)},
        )


def _distributed(facts: RunFacts) -> bool:
    """More than one process in the run: NCCL's buffers are among what sits outside."""
    world = facts.world_size.value if facts.world_size is not None else 1
    return world > 1 or len(facts.ranks.ranks) > 1


_OUTSIDE_DISTRIBUTED = Fix(
    "Shrink NCCL's buffers if they are the cause (set NCCL_DEBUG=INFO to see their sizes), "
    "and keep other GPU libraries from preallocating.",
    environment={"NCCL_BUFFSIZE": "2097152", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    cost="NCCL: possibly slower collectives",
)
_OUTSIDE_ONE_PROCESS = Fix(
    "Leave room for what every CUDA process holds outside PyTorch (the CUDA context, "
    "cuDNN/cuBLAS workspaces: often 0.5-1.5 GiB, more under WSL or with a display on the "
    "card): a smaller batch, or close the other programs that use the GPU (nvidia-smi lists "
    "them).",
    cost="smaller batches: slightly lower throughput",
)


RULE = NonPytorchMemoryRule()
