"""Exceptions that are a configuration being refused, not a crash.

A job that dies at startup because its own configuration was rejected failed for its config:
pydantic's ``ValidationError`` over a config model (DeepSpeed's ``DeepSpeedZeroConfig``,
``DeepSpeedBF16Config``..., and other frameworks' config models), or batch arithmetic that
does not multiply out (DeepSpeed's batch assertion, transformers' "config values that mismatch
TrainingArguments" listing batch keys, a trainer's "batch size must be divisible by ..."), or a
framework refusing to run in the memory its own setting allows and naming the setting to change.
``rejection_of(exception_class, text)`` says which, from the exception as printed;
``check_rejection(exception)`` from where its traceback stops: inside a library's config check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlens.facts.log import ExceptionEvent, LogFacts
from oomlens.facts.signals import ConfigRejection, Rejection
from oomlens.knowledge.frames import frame_role

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


_CHECK_FAILURES = ("AssertionError", "ValueError", "ConfigError", "ValidationError")
"""What a config check raises when it fails; a check's frame under another error (an OOM, a
KeyError) is where that error happened, not the check failing."""
_BATCH_CHECK = re.compile(r"(?i)batch|grad_acc|gradient_accumulation")


def check_rejection(exception: ExceptionEvent) -> ConfigRejection | None:
    """A traceback that stops inside a library's config check (``library_frames.json``'s
    ``config_check``: DeepSpeed's ``_batch_assertion``), cut before its error or ending in
    the error such a check raises: that check failed.  A check of the batch arithmetic is a
    batch rejection; another check in a config module a refused config."""
    traceback = exception.traceback
    if traceback is None or not traceback.frames:
        return None
    failed = exception.exception_class.rsplit(".", 1)[-1]
    if exception.text.strip() and failed not in _CHECK_FAILURES:
        return None
    inner = traceback.frames[-1]
    known = frame_role(inner.filename, inner.function)
    if known is None or known.role != "config_check":
        return None
    checks = "; ".join(known.checks)
    if any(_BATCH_CHECK.search(check) for check in known.checks):
        kind = Rejection.BATCH
    elif "config" in known.file:
        kind = Rejection.SCHEMA
    else:
        return None
    said = exception.text.strip() or "(the traceback stops there)"
    text = (
        f"{inner.filename}:{inner.line} in {inner.function}, {known.library}'s config check"
        + (f" asserting {checks}" if checks else "")
        + f": {said}"
    )
    return ConfigRejection(kind, exception.source, text[:1000])


def config_rejections(logs: tuple[LogFacts, ...] | list[LogFacts]) -> list[ConfigRejection]:
    """Every refused configuration the logs show: exceptions that are a rejection, tracebacks
    that stop inside a library's config check (``check_rejection``), and DeepSpeed's config
    error lines (whose continuation lines the exception carries)."""
    found: list[ConfigRejection] = []
    seen: set[tuple[str, int | None]] = set()
    for log in logs:
        for exception in (*log.exceptions, *log.partial_tracebacks):
            what = rejection_of(exception.exception_class, exception.text)
            if what is None:
                checked = check_rejection(exception)
                if checked is not None:
                    seen.add((exception.source.path, exception.source.line))
                    found.append(checked)
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
