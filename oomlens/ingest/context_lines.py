"""The run's shape as a log states it: batch, sequence, precision, optimizer, model name...

Training programs state their settings in a few conventional forms, whatever the framework:
command lines (``--per_device_train_batch_size 8``, DeepSpeed's ``spawned with command:
['...', '--seq-len', '512']``), argument dumps (``TrainingArguments(... bf16=True, ...)``,
``per_device_train_batch_size: 8``, ``"num_beams": 4``) and a script's own summary
(``micro batch 8 x 4096 tokens``, ``gradient accumulation 2``).  One pass over the head of a
log (bounded: ``HEAD_BYTES``) reads every ``name <sep> value`` pair whose name is one of the
argument names of ``ALIASES`` (the names transformers, accelerate, Lightning, DeepSpeed,
Megatron and common scripts give these settings) and the model names that carry a size
(``Llama-2-13b-hf``).  The first statement of a key wins: later ones are the same argument
echoed by other ranks or a different phase (evaluation).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import regex

from oomlens.errors import InputError
from oomlens.facts import SourceRef
from oomlens.facts.context import Certainty, ContextKey, ContextValue
from oomlens.ingest.log.prefixes import strip_prefixes
from oomlens.ingest.textstream import open_text

HEAD_BYTES = 4 * 1024 * 1024
"""Settings are printed at start-up; a log's first 4 MiB hold them."""
MAX_LINE_CHARS = 4096
"""A longer line is cut here before it is searched (an argument dump on one line included)."""

_K = ContextKey
ALIASES: dict[str, ContextKey] = {
    # micro batch per GPU
    "per_device_train_batch_size": _K.MICRO_BATCH,
    "train_micro_batch_size_per_gpu": _K.MICRO_BATCH,
    "micro_batch_size": _K.MICRO_BATCH,
    "micro_batch": _K.MICRO_BATCH,
    "batch_size": _K.MICRO_BATCH,
    "per_gpu_train_batch_size": _K.MICRO_BATCH,
    "train_batch_size_per_device": _K.MICRO_BATCH,
    "batch_size_per_device": _K.MICRO_BATCH,
    # accumulation
    "gradient_accumulation_steps": _K.GRAD_ACCUM,
    "gradient_accumulation": _K.GRAD_ACCUM,
    "grad_accum": _K.GRAD_ACCUM,
    "grad_accumulation_steps": _K.GRAD_ACCUM,
    "accumulate_grad_batches": _K.GRAD_ACCUM,
    # sequence length
    "seq_len": _K.SEQ_LEN,
    "seq_length": _K.SEQ_LEN,
    "max_seq_len": _K.SEQ_LEN,
    "max_seq_length": _K.SEQ_LEN,
    "sequence_length": _K.SEQ_LEN,
    "max_length": _K.SEQ_LEN,
    "model_max_length": _K.SEQ_LEN,
    "cutoff_len": _K.SEQ_LEN,
    "block_size": _K.SEQ_LEN,
    # evaluation and generation
    "per_device_eval_batch_size": _K.EVAL_BATCH,
    "eval_batch_size": _K.EVAL_BATCH,
    "eval_accumulation_steps": _K.EVAL_ACCUMULATION_STEPS,
    "num_beams": _K.BEAMS,
    "beam_size": _K.BEAMS,
    "max_new_tokens": _K.NEW_TOKENS,
    "new_tokens": _K.NEW_TOKENS,
    "gen_batch": _K.PROMPTS,
    "generation_batch_size": _K.PROMPTS,
    # memory techniques and numerics
    "gradient_checkpointing": _K.GRADIENT_CHECKPOINTING,
    "activation_checkpointing": _K.GRADIENT_CHECKPOINTING,
    "optim": _K.OPTIMIZER,
    "optimizer": _K.OPTIMIZER,
    "zero_stage": _K.ZERO_STAGE,
    "zero_optimization_stage": _K.ZERO_STAGE,
    "optimizer_name": _K.OPTIMIZER,
    "mixed_precision": _K.PRECISION,
    "precision": _K.PRECISION,
    "torch_dtype": _K.PRECISION,
    "bf16": _K.PRECISION,
    "fp16": _K.PRECISION,
    # the model
    "model_name_or_path": _K.MODEL_NAME,
    "pretrained_model_name_or_path": _K.MODEL_NAME,
    "model_name": _K.MODEL_NAME,
    "base_model": _K.MODEL_NAME,
    "model": _K.MODEL_NAME,
}
"""Argument names (lower case, words joined by ``_``) and the setting each states."""

_WORD = r"[A-Za-z][A-Za-z0-9]*(?:[_-][A-Za-z0-9]+)*"
_NAME = _WORD + r"(?: " + _WORD + r"){0,4}"
"""An identifier of any length (``train_micro_batch_size_per_gpu``), or up to five words of
prose (``Instantaneous batch size per device``)."""
_PAIR = regex.compile(
    r"(?<![\w.-])(?:--?)?[\"']?(?P<name>" + _NAME + r")[\"']?"
    r"(?:\s*[=:]\s*|\s+\.+\s+|\s+|[\"']?,\s*[\"'])"
    r"[\"']?(?P<value>[A-Za-z0-9][\w./-]{0,150})"
)
"""``name = value``, ``name: value``, ``--name value``, ``'--name', 'value'``, ``"name": 8``,
DeepSpeed's config print ``gradient_accumulation_steps .. 2`` (``DeepSpeedConfig.print``: the
name, dots to column 29, the value) and the prose form ``micro batch 8``."""
_STEMS = regex.compile(
    r"batch|seq|len|accum|beam|token|optim|bf16|fp16|precision|dtype|model|checkpoint|stage|prompt"
    r"|\d[bm](?![a-z])|MEMBER|Enabling DeepSpeed",
    regex.IGNORECASE,
)
"""A line without one of these words (or a model size such as ``13b``) states no setting."""
_BATCH_BY_TOKENS = regex.compile(
    r"\b(?P<batch>\d{1,6})\s*[x\u00d7]\s*(?P<seq>\d{1,7})\s*tokens\b", regex.IGNORECASE
)
"""``8 x 4096 tokens``: a batch of sequences of that many tokens."""
_GENERATION = regex.compile(
    r"\b(?P<tokens>\d{1,7})\s+(?:new\s+)?tokens\s+(?:for|of|x|\u00d7)\s+(?P<prompts>\d{1,6})\s+"
    r"(?:prompts|sequences|inputs)\b",
    regex.IGNORECASE,
)
"""``2048 tokens for 128 prompts``: a generation's length and its number of sequences."""
_MEMBER = regex.compile(r"\bGLOBAL_RANK: \d{1,6}, MEMBER: \d{1,6}/(?P<world>\d{1,6})\b")
"""Lightning and Fabric at process-group setup (``_init_dist_connection`` and the DeepSpeed
strategy's ``_init_deepspeed_distributed``): ``Initializing distributed: GLOBAL_RANK: 0,
MEMBER: 1/8``, the world size after the slash."""
_DEEPSPEED_CAST = regex.compile(r"\bEnabling DeepSpeed (?P<precision>BF16|FP16)\. Model parameters")
"""Lightning's DeepSpeed strategy, when the Trainer's precision sets it (``_format_precision_
config``): ``Enabling DeepSpeed BF16. Model parameters and inputs will be cast to
`bfloat16`.``"""
_SIZED_MODEL = regex.compile(
    r"(?<![\w.])(?P<name>(?:[\w.-]+/)?[A-Za-z][\w.]*(?:[-_][\w.]+)*?[-_](?P<size>\d{1,4}(?:\.\d{1,2})?)"
    r"(?P<unit>[bBmM])(?:[-_][\w.]+)*)(?![\w.])"
)
"""A model id whose part names its size: ``meta-llama/Llama-2-13b-hf``, ``Qwen2-72B``,
``opt-6.7b``, ``bloom-560m``."""
_FILE = regex.compile(r"\.(?:py|sh|json|ya?ml|txt|log|md|cfg|toml|ipynb)$", regex.IGNORECASE)
"""A script or a config file named after a model size (``deepspeed_7b_finetune.py``) is not
the model."""
_GPU = regex.compile(
    r"\b(?:NVIDIA|Tesla|Quadro)\s+(?P<name>(?:GeForce\s+)?(?:RTX\s+)?[A-Z]{0,4}\d{2,4}[A-Za-z]*"
    r"(?:[ -](?:SXM\d?|PCIe|NVL|Ti|SUPER|HBM\d?e?|\d{1,3}GB|Ada|Generation))*)"
)
_GPU_MEMORY = regex.compile(r"(?P<gb>\d{1,3})GB\b")


def _number(text: str) -> int | float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return None
    return int(value) if value.is_integer() else value


def _count(text: str) -> int | None:
    value = _number(text)
    return value if isinstance(value, int) and 0 < value < 10**9 else None


def _flag(text: str) -> bool | None:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", "none"):
        return False
    return None


def _precision(name: str, value: str) -> str | None:
    lowered = value.lower()
    if name in ("bf16", "fp16"):
        return name if _flag(value) else None
    for token, precision in (
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
        ("16", "fp16"),
        ("fp32", "fp32"),
        ("float32", "fp32"),
        ("32", "fp32"),
    ):
        if lowered.startswith(token):
            return precision
    return "fp32" if lowered == "no" else None


_OPTIMIZERS = (
    ("8bit", "adam_8bit"),
    ("bnb", "adam_8bit"),
    ("adafactor", "adafactor"),
    ("lion", "lion"),
    ("sgd", "sgd"),
    ("adagrad", "adagrad"),
    ("adam", "adam"),
    ("lamb", "lamb"),
)


def _optimizer(value: str) -> str | None:
    lowered = value.lower()
    return next((family for token, family in _OPTIMIZERS if token in lowered), None)


def _stage(value: str) -> int | None:
    count = _number(value)
    return count if isinstance(count, int) and 0 <= count <= 3 else None


def model_size_params(name: str) -> int | None:
    """Parameters a model id's size part names (``13b`` -> 13e9), or None."""
    match = _SIZED_MODEL.fullmatch(name.strip())
    if match is None:
        return None
    size = float(match.group("size"))
    scale = 1e9 if match.group("unit") in "bB" else 1e6
    params = round(size * scale)
    return params if 10**6 <= params <= 10**13 else None


_READERS: dict[ContextKey, Callable[[str, str], int | float | str | bool | None]] = {
    _K.MICRO_BATCH: lambda _n, v: _count(v),
    _K.GRAD_ACCUM: lambda _n, v: _count(v),
    _K.SEQ_LEN: lambda _n, v: _count(v),
    _K.EVAL_BATCH: lambda _n, v: _count(v),
    _K.EVAL_ACCUMULATION_STEPS: lambda _n, v: _count(v),
    _K.BEAMS: lambda _n, v: _count(v),
    _K.NEW_TOKENS: lambda _n, v: _count(v),
    _K.PROMPTS: lambda _n, v: _count(v),
    _K.GRADIENT_CHECKPOINTING: lambda _n, v: _flag(v),
    _K.OPTIMIZER: lambda _n, v: _optimizer(v),
    _K.ZERO_STAGE: lambda _n, v: _stage(v),
    _K.PRECISION: _precision,
    _K.MODEL_NAME: lambda _n, v: v if model_size_params(v) is not None else None,
}
_QUALIFIERS = frozenset(
    {
        "total",
        "global",
        "effective",
        "overall",
        "train",
        "training",
        "min",
        "minimum",
        "max",
        "maximum",
        "eval",
        "evaluation",
        "val",
        "valid",
        "validation",
        "test",
        "predict",
        "prediction",
        "inference",
        "generation",
    }
)
"""Words that, before a setting's name in prose, name another quantity: HF Trainer's
``Total train batch size (w. parallel, distributed & accumulation) = 32`` and Unsloth's
``Total batch size = 8`` are the global batch (DeepSpeed's ``train_batch_size`` too), ``test
batch size``, ``min seq len`` are not the training pass's values."""
_WORD_BEFORE = regex.compile(r"(?<![\w.-])([A-Za-z]+) $")
"""The prose word just before a name (overlapped matching also starts a match after it)."""
_GENERIC_NAMES = frozenset({"batch_size", "model", "optimizer", "precision"})
"""Names scripts use loosely: read as inferred, not stated."""


def _normalise(name: str) -> str:
    return name.lower().replace(" ", "_").replace("-", "_")


def values_in_line(text: str, source: SourceRef) -> Iterable[ContextValue]:
    """Every setting ``text`` states (see the module docstring)."""
    text = text[:MAX_LINE_CHARS]
    if _STEMS.search(text) is None and _GPU.search(text) is None:
        return
    for match in _BATCH_BY_TOKENS.finditer(text):
        quoted = match.group(0)
        yield ContextValue(
            _K.MICRO_BATCH, int(match["batch"]), Certainty.INFERRED, "log", source, quoted
        )
        yield ContextValue(_K.SEQ_LEN, int(match["seq"]), Certainty.INFERRED, "log", source, quoted)
    for match in _GENERATION.finditer(text):
        quoted = match.group(0)
        yield ContextValue(
            _K.NEW_TOKENS, int(match["tokens"]), Certainty.INFERRED, "log", source, quoted
        )
        yield ContextValue(
            _K.PROMPTS, int(match["prompts"]), Certainty.INFERRED, "log", source, quoted
        )
    member = _MEMBER.search(text)
    if member is not None and int(member["world"]) > 0:
        yield ContextValue(
            _K.WORLD_SIZE, int(member["world"]), Certainty.STATED, "log", source, member.group(0)
        )
    cast = _DEEPSPEED_CAST.search(text)
    if cast is not None:
        yield ContextValue(
            _K.PRECISION, cast["precision"].lower(), Certainty.STATED, "log", source, cast.group(0)
        )
    for match in _PAIR.finditer(text, overlapped=True):
        # prose may carry leading words ("the micro batch"): its longest known tail, taken at
        # a space; an identifier (``min_train_batch_size``, ``ds train_batch_size``) is one
        # word, never cut into a tail of itself
        words = match["name"].split()
        at = match.start("name")
        before = _WORD_BEFORE.search(text, max(0, at - 64), at)
        for start in range(len(words)):
            name = _normalise("_".join(words[start:]))
            key = ALIASES.get(name)
            if key is None:
                continue
            qualifier = words[start - 1] if start else before.group(1) if before else ""
            if _normalise(qualifier) in _QUALIFIERS:
                break  # "Total batch size = 8": another quantity than the setting
            value = _READERS[key](name, match["value"])
            if value is not None:
                certainty = Certainty.INFERRED if name in _GENERIC_NAMES else Certainty.STATED
                yield ContextValue(key, value, certainty, "log", source, match.group(0)[:120])
            break
    for match in _SIZED_MODEL.finditer(text):
        params = model_size_params(match["name"])
        if (
            params is not None
            and ("/" in match["name"] or _has_family(match["name"]))
            and _FILE.search(match["name"]) is None
        ):
            yield ContextValue(
                _K.MODEL_NAME, match["name"], Certainty.INFERRED, "log", source, match["name"]
            )
    for match in _GPU.finditer(text):
        name = match["name"].strip()
        yield ContextValue(_K.GPU_NAME, name, Certainty.STATED, "log", source, match.group(0))


def _has_family(name: str) -> bool:
    """A size part after a family name (``Qwen2-72B``), not a bare size (``350m``)."""
    head: str = regex.split(r"[-_]\d", name, maxsplit=1)[0]
    return sum(c.isalpha() for c in head) >= 2


def read_context(
    path: str | os.PathLike[str], *, display: str | None = None
) -> tuple[ContextValue, ...]:
    """The settings the head of the log at ``path`` states, the first of each key; () when
    the file cannot be read (its reader reports why)."""
    shown = display if display is not None else os.fspath(path)
    found: dict[ContextKey, ContextValue] = {}
    seen = 0
    try:
        source = open_text(path, display=shown)
        known_hosts: set[str] = set()
        for number, line in source.lines():
            seen += len(line) + 1
            if seen > HEAD_BYTES:
                break
            rest, prefix = strip_prefixes(line, known_hosts)
            ref = SourceRef(shown, number, prefix.rank, prefix.host)
            for value in values_in_line(rest, ref):
                found.setdefault(value.key, value)
    except (InputError, OSError):
        return tuple(found.values())
    return tuple(found.values())
