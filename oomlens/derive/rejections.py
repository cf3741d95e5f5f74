"""Exceptions that are a configuration being refused, not a crash.

A job that dies at startup because its own configuration was rejected failed for its config:
pydantic's ``ValidationError`` over a config model (DeepSpeed's ``DeepSpeedZeroConfig``,
``DeepSpeedBF16Config``..., and other frameworks' config models), or batch arithmetic that
does not multiply out (DeepSpeed's batch assertion, transformers' "config values that mismatch
TrainingArguments" listing batch keys, a trainer's "batch size must be divisible by ..."), or a
framework refusing to run in the memory its own setting allows and naming the setting to change.
``rejection_of(exception_class, text)`` says which, from the exception as printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlens.facts.log import LogFacts
from oomlens.facts.signals import ConfigRejection, Rejection

BATCH_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "per_device_train_batch_size",
    }
)

_SCHEMA = re.compile(r"\d{1,4} validation errors? for (?P<model>[A-Za-z_][\w.]{0,80})")
_HF_MISMATCH = re.compile(
    r"^\s*-\s*ds (?P<key>[\w.]{1,80})=(?P<ds>\S{1,40}) vs hf (?P<hf>.{1,120})$"
)
_BATCH = re.compile(
    r"(?i)batch[ _]size[^\n]{0,160}?(?:must be (?:evenly )?divisible|is not divisible|"
    r"not equal to|must be a multiple)|Check batch related parameters|"
    r"divisible by (?:the )?(?:micro[- ]?batch|batch size)"
)


_ADVISED = re.compile(
    r"(?i)(?:try|consider|please) (?:increasing|decreasing|reducing|lowering|raising|setting) "
    r"(?:the )?`?(?P<setting>[A-Za-z_][\w.-]{2,60})`?"
)
_MEMORY_WORDS = re.compile(r"(?i)memory|cache blocks|KV cache")


def mismatch_keys(text: str) -> tuple[str, ...]:
    """The DeepSpeed keys of transformers' ``- ds KEY=V vs hf ...`` listing."""
    return tuple(m.group("key") for line in text.splitlines() if (m := _HF_MISMATCH.match(line)))


@dataclass(frozen=True, slots=True)
class ConfigRejectionKind:
    """What one exception rejects: the kind, the config model named, the keys listed."""

    kind: Rejection
    model: str | None
    keys: tuple[str, ...]


def rejection_of(exception_class: str, text: str) -> ConfigRejectionKind | None:
    """What ``text`` (an exception of ``exception_class`` as printed) rejects, if anything."""
    schema = _SCHEMA.search(text)
    if schema is not None and exception_class.rsplit(".", 1)[-1] == "ValidationError":
        return ConfigRejectionKind(Rejection.SCHEMA, schema.group("model"), ())
    keys = mismatch_keys(text)
    if "mismatch TrainingArguments" in text:
        batch = tuple(k for k in keys if k in BATCH_KEYS)
        if batch or not keys:
            return ConfigRejectionKind(Rejection.BATCH, None, batch)
        return ConfigRejectionKind(Rejection.SCHEMA, None, keys)
    if _BATCH.search(text):
        return ConfigRejectionKind(Rejection.BATCH, None, ())
    advised = _ADVISED.search(text)
    if advised is not None and _MEMORY_WORDS.search(text):
        return ConfigRejectionKind(Rejection.SETTING, None, (advised.group("setting"),))
    return None


def config_rejections(logs: tuple[LogFacts, ...] | list[LogFacts]) -> list[ConfigRejection]:
    """Every refused configuration the logs show: exceptions that are a rejection, and
    DeepSpeed's config error lines (whose continuation lines the exception carries)."""
    found: list[ConfigRejection] = []
    seen: set[tuple[str, int | None]] = set()
    for log in logs:
        for exception in log.exceptions:
            what = rejection_of(exception.exception_class, exception.text)
            if what is None:
                continue
            seen.add((exception.source.path, exception.source.line))
            found.append(
                ConfigRejection(
                    what.kind, exception.source, exception.text[:1000], what.model, what.keys
                )
            )
        for line in log.config_errors:
            what = rejection_of("", line.text)
            if what is None or (line.source.path, line.source.line) in seen:
                continue
            if any(r.source.path == line.source.path for r in found):
                continue  # the exception that printed this line is already counted
            found.append(ConfigRejection(what.kind, line.source, line.text, what.model, what.keys))
    return found
