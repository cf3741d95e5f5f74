"""A memory account of the rank that ran out: what held the card when it failed, term by term.

``oomlens.derive.account`` builds it from the OOM message's balance sheet, the snapshot's
categories, the ZeRO memory model and the run's context; rules read it to name the term that
did not fit and to compute the settings that make it fit; every report shows it as a table.

Bytes per parameter of the model states, by how the model is trained, are reviewed data
(``STATE_BYTES``), each with where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TermBasis(StrEnum):
    """How a term's bytes are known."""

    MEASURED = "measured"
    """Printed by torch (the OOM message) or recorded by the allocator (a snapshot)."""
    MODEL = "model"
    """DeepSpeed's allocations as the ZeRO memory model computes them for the config."""
    ARITHMETIC = "arithmetic"
    """Parameters x bytes per parameter for the precision and optimizer (a range when either
    is unknown)."""
    REMAINDER = "remainder"
    """What the measured total leaves once the other terms are taken out."""


class Term(StrEnum):
    MODEL_STATES = "model_states"
    """Parameters, gradients and optimizer states (with master weights), as sharded."""
    ACTIVATIONS = "activations"
    """Tensors of the forward/backward pass (what the phase's own allocations hold)."""
    EVAL_OUTPUTS = "eval_outputs"
    """Evaluation's or prediction's accumulated outputs and temporaries."""
    KV_CACHE = "kv_cache"
    """Generation: the KV cache and the logits of the sequences being generated."""
    OTHER_LIVE = "other_live"
    """Live tensors of a phase that is not known."""
    REQUEST = "request"
    """The allocation that failed."""
    CACHED_UNUSED = "cached_unused"
    """Reserved by PyTorch's allocator but not allocated (fragmentation's term)."""
    NON_PYTORCH = "non_pytorch"
    """This process' memory outside the caching allocator: CUDA context, NCCL, libraries."""
    OTHER_PROCESSES = "other_processes"
    """Other processes on the card (the message's capacity minus free minus this process)."""


@dataclass(frozen=True, slots=True)
class AccountTerm:
    """One line of the account: ``bytes`` at the failure, within ``low``..``high`` when the
    inputs only bound it; ``source`` says where (a line, a snapshot, a config key, the
    arithmetic)."""

    term: Term
    bytes: int
    basis: TermBasis
    source: str
    low: int | None = None
    high: int | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class MemoryAccount:
    """The account of one OOM: the rank and device, the phase, what the process could use
    (``limit``, from where), what it needed (``needed``: live tensors plus the request), the
    terms, and the model states once gradients and optimizer states all exist
    (``states_at_peak``: the first steps create them, so a failure before the first optimizer
    step holds fewer)."""

    rank: int | None
    device: int | None
    phase: str
    limit: int | None
    limit_source: str
    limit_is_cap: bool
    """The limit is a per-process cap on the allocator (``X allowed``): only the allocator's
    memory counts against it."""
    needed: int | None
    terms: tuple[AccountTerm, ...]
    states_at_peak: AccountTerm | None = None
    micro_batch: int | None = None
    """The micro batch the failing pass ran with, when the context knows it."""
    states_at_least: int | None = None
    """The fewest bytes the model states take once all exist, with nothing assumed: the
    config's memory model, or the parameters at the smallest precision the context allows,
    with gradients only when the run is known to train and optimizer states only when the
    optimizer is known.  None when the parameters are not known."""

    def term(self, term: Term) -> AccountTerm | None:
        return next((t for t in self.terms if t.term is term), None)

    def bytes_of(self, term: Term) -> int:
        found = self.term(term)
        return found.bytes if found is not None else 0


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per trainable parameter (weights, gradients, optimizer states incl. master
    weights) and per frozen parameter, for one way of training, with its source."""

    weights: float
    gradients: float
    optimizer: float
    source: str

    @property
    def per_trainable(self) -> float:
        return self.weights + self.gradients + self.optimizer


QUANTIZED_WEIGHT_BYTES = 0.5
"""The fewest bytes a weight can take: 4-bit quantization (bitsandbytes NF4/FP4, GPTQ and AWQ
int4 kernels), which a base model under QLoRA uses while the run states bf16."""

STATE_BYTES: dict[tuple[str, str], StateBytes] = {
    ("fp32", "adam"): StateBytes(
        4, 4, 8, "torch.optim.Adam(W): exp_avg and exp_avg_sq in the parameter's dtype"
    ),
    ("amp", "adam"): StateBytes(
        4, 4, 8, "torch.autocast keeps fp32 weights and gradients; Adam's two fp32 states"
    ),
    ("bf16", "adam"): StateBytes(
        2, 2, 4, "a model cast to 16 bits: Adam's states take the parameter's dtype"
    ),
    ("zero16", "adam"): StateBytes(
        2,
        2,
        12,
        "DeepSpeed ZeRO with 16-bit weights: 16-bit partitions of the weights and gradients; "
        "fp32 master weights and Adam's two fp32 moments on the optimizer's side",
    ),
    ("fp32", "adam_8bit"): StateBytes(
        4, 4, 2, "bitsandbytes 8-bit Adam: two uint8 states per parameter (+ block scales)"
    ),
    ("fp32", "sgd"): StateBytes(4, 4, 4, "torch.optim.SGD with momentum: one buffer"),
    ("fp32", "adafactor"): StateBytes(
        4, 4, 0, "Adafactor: factored second moments, O(rows + columns) per matrix"
    ),
}
"""Reviewed: the states each torch / bitsandbytes optimizer creates (``_init_group`` of
torch/optim/adam.py, adamw.py, sgd.py; bitsandbytes/optim/optimizer.py ``init_state``;
transformers' Adafactor).  ``amp`` is mixed precision by autocast (fp32 master weights).
DeepSpeed's own layouts are the ZeRO memory model's (``oomlens.analysis.zero_model``)."""
