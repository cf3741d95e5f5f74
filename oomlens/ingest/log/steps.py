"""Progress lines: which step a run reached, and the loss printed with it.

Forms: DeepSpeed ``step=N, skipped=M, lr=...``; DeepSpeed ThroughputTimer
``epoch=E/micro_step=M/global_step=N, ... MemAllocated=xGB, MaxMemAllocated=yGB`` (and the
older ``N/M, SamplesPerSec=..., MemAllocated=...``); HF Trainer ``{'loss': 1.23, ...,
'epoch': 0.5}``; tqdm ``45/100 [00:10<00:12, ...]``; generic ``step N ... loss X``,
``iter N/M``, ``global_step N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from oomlens.lazyregex import lazy_regex

ANCHORS: tuple[bytes, ...] = (
    b", skipped=",
    b"global_step",
    b"SamplesPerSec",
    b"loss",
    b"Loss",
)
"""Literals of the progress lines worth reading one by one (free-form ``step N ... loss X``
lines are found by their ``loss``; a ``step N/M`` without a loss is not looked for).  tqdm
bars are not among them:
they rewrite themselves many times a second, so the reader samples them (``TQDM_ANCHORS``)
once per block instead."""
TQDM_ANCHORS: tuple[bytes, ...] = (b"it/s]", b"s/it]")

_GIB = 1024**3
_FLOAT = r"[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:[eE][-+]?\d{1,4})?|nan|inf"
_DS_STEP = lazy_regex(r"\bstep=(?P<step>\d{1,12}), skipped=(?P<skipped>\d{1,12})")
_THROUGHPUT = lazy_regex(
    r"global_step=(?P<step>\d{1,12})[^\n]{0,400}?MemAllocated=(?P<mem>[\d.]{1,20})GB, MaxMemAlloc"
    r"ated=(?P<max>[\d.]{1,20})GB"
)
_OLD_THROUGHPUT = lazy_regex(
    r"(?P<step>\d{1,12})/(?P<total>\d{1,12}), SamplesPerSec=[^\n]{0,100}?MemAllocated=(?P<mem>[\d"
    r".]{1,20})GB, MaxMemAllocated=(?P<max>[\d.]{1,20})GB"
)
_HF = lazy_regex(
    r"\{'loss': '?(?P<loss>" + _FLOAT + r")'?,[^\n]{0,2000}?'epoch': '?(?P<epoch>" + _FLOAT + r")'?"
)
_TQDM = lazy_regex(
    r"\|\s{0,4}(?P<step>\d{1,12})/(?P<total>\d{1,12}) \[(?:\d{1,4}:)?\d{1,4}:\d\d[<,]"
)
_GENERIC_STEP = lazy_regex(
    r"\b(?:global[_ ]step|step|iteration|iter)\b\s{0,3}[:=#]?\s{0,3}\[?(?P<step>\d{1,12})(?:\s{0,"
    r"2}/\s{0,2}(?P<total>\d{1,12}))?",
    regex.IGNORECASE,
)
_RANK_IN_TEXT = lazy_regex(r"\brank[ =:]{0,2}(\d{1,6})\b", regex.IGNORECASE)
_GENERIC_LOSS = lazy_regex(
    r"\bloss\b['\"]?\s{0,3}[:=]?\s{0,3}'?(?P<loss>" + _FLOAT + ")", regex.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class StepReading:
    kind: str
    step: int | None
    total: int | None = None
    loss: float | None = None
    epoch: float | None = None
    memory_allocated: int | None = None
    max_memory_allocated: int | None = None
    skipped: int | None = None
    rank: int | None = None
    """A rank the line itself names (``rank 3 step 10 loss ...``)."""


def parse_step_line(text: str) -> StepReading | None:
    """The progress a line reports, or None.  See ``StepSample`` for the kinds."""
    match = _DS_STEP.search(text)
    if match is not None:
        return StepReading(
            "deepspeed", int(match.group("step")), skipped=int(match.group("skipped"))
        )
    if "MemAllocated=" in text:
        match = _THROUGHPUT.search(text) or _OLD_THROUGHPUT.search(text)
        if match is not None:
            total = match.groupdict().get("total")
            return StepReading(
                "throughput",
                int(match.group("step")),
                int(total) if total else None,
                memory_allocated=round(float(match.group("mem")) * _GIB),
                max_memory_allocated=round(float(match.group("max")) * _GIB),
            )
    if "'loss'" in text:
        match = _HF.search(text)
        if match is not None:
            return StepReading(
                "hf", None, loss=float(match.group("loss")), epoch=float(match.group("epoch"))
            )
    if "/s]" in text or "s/it]" in text or "<" in text:
        match = _TQDM.search(text)
        if match is not None:
            return StepReading("tqdm", int(match.group("step")), int(match.group("total")))
    match = _GENERIC_STEP.search(text)
    if match is not None:
        loss = _GENERIC_LOSS.search(text)
        if loss is not None and (
            "eval" in text[: loss.start()].lower() or "val_" in text[: loss.start()]
        ):
            return StepReading("generic_eval", int(match.group("step")))  # not the training loss
        if loss is not None or match.group("total") is not None:
            rank = _RANK_IN_TEXT.search(text, 0, match.start())
            return StepReading(
                "generic",
                int(match.group("step")),
                int(match.group("total")) if match.group("total") else None,
                loss=float(loss.group("loss")) if loss else None,
                rank=int(rank.group(1)) if rank else None,
            )
    return None
