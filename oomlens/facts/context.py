"""What the inputs say about the run's shape: the model's size, the card, the batch, the
sequence, the precision, the parallel layout... each value with where it was read and how sure
it is.

``oomlens.ingest.context_lines`` reads the values a log states (argument dumps, command lines,
a script's own summary lines, model names); ``oomlens.derive.context`` merges them with what
the config, the OOM message and the snapshots give into one ``RunContext``.  A value no input
shows is absent: never guessed silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from oomlens.facts import SourceRef


class Certainty(StrEnum):
    """How a value was known."""

    STATED = "stated"
    """The input prints the value itself (``per_device_train_batch_size=8``, ``--seq-len 512``,
    a config key, the OOM message's capacity)."""
    DERIVED = "derived"
    """Computed from stated values (a micro batch DeepSpeed derives from the batch triple)."""
    INFERRED = "inferred"
    """Read from something that implies it (``Llama-2-13b-hf`` names about 13e9 parameters;
    ``A100-SXM4-80GB`` an 80 GB card)."""


class ContextKey(StrEnum):
    """The values an account of the run's memory uses."""

    PARAMS = "params"
    """The model's parameter count."""
    PARAMS_AT_LEAST = "params_at_least"
    """A lower bound of the parameter count, where nothing states the count (a failing
    request's size at an allocation site whose tensors are the rank's partition)."""
    TRAINABLE_PARAMS = "trainable_params"
    MODEL_NAME = "model_name"
    GPU_NAME = "gpu_name"
    GPU_CAPACITY = "gpu_capacity"
    """Bytes the process could use on one card: the per-process cap when one is set."""
    WORLD_SIZE = "world_size"
    PRECISION = "precision"
    """``fp32``, ``fp16``, ``bf16`` (mixed or pure as the source says)."""
    OPTIMIZER = "optimizer"
    """Lower-case family: ``adam``, ``adam_8bit``, ``adafactor``, ``sgd``, ``lion``..."""
    ZERO_STAGE = "zero_stage"
    OFFLOAD_OPTIMIZER = "offload_optimizer"
    OFFLOAD_PARAM = "offload_param"
    MICRO_BATCH = "micro_batch"
    """Samples per GPU per forward pass."""
    GRAD_ACCUM = "grad_accum"
    SEQ_LEN = "seq_len"
    EVAL_BATCH = "eval_batch"
    EVAL_ACCUMULATION_STEPS = "eval_accumulation_steps"
    BEAMS = "beams"
    NEW_TOKENS = "new_tokens"
    """Tokens each ``generate`` call adds."""
    PROMPTS = "prompts"
    """Sequences one ``generate`` call handles at once."""
    GRADIENT_CHECKPOINTING = "gradient_checkpointing"
    HOST_MEMORY = "host_memory"


@dataclass(frozen=True, slots=True)
class ContextValue:
    """One value with its provenance: ``text`` is the input's words it was read from (cut
    short), ``origin`` how (``log argument``, ``ds_config``, ``OOM message``...)."""

    key: ContextKey
    value: int | float | str | bool
    certainty: Certainty
    origin: str
    source: SourceRef | None = None
    text: str = ""

    def cite(self) -> str:
        where = self.source.describe() if self.source is not None else self.origin
        return f"{self.key.value} = {self.value} ({self.certainty.value}, {where})"


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run's known values, one per key (the best source's)."""

    values: Mapping[ContextKey, ContextValue] = field(default_factory=dict)

    def get(self, key: ContextKey) -> ContextValue | None:
        return self.values.get(key)

    def number(self, key: ContextKey) -> int | float | None:
        """The value of ``key`` when it is a number (not a flag or a name)."""
        found = self.values.get(key)
        if found is None or isinstance(found.value, bool | str):
            return None
        return found.value

    def integer(self, key: ContextKey) -> int | None:
        value = self.number(key)
        return int(value) if value is not None and float(value).is_integer() else None

    def __iter__(self) -> Iterator[ContextValue]:
        return iter(self.values.values())

    def __len__(self) -> int:
        return len(self.values)
