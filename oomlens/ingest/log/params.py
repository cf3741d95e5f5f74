"""Lines that state the model's parameter count: what the ZeRO memory model needs.

Recognised (each as printed by the tool named):

* DeepSpeed ``zero.Init``: ``finished initializing model - num_params = 291, num_elems = 1.34B``
  and the older ``finished initializing model with 1.34B parameters``;
* Hugging Face Trainer: ``Number of trainable parameters = 124,439,808`` (and
  ``Number of parameters = ...``);
* PEFT ``print_trainable_parameters``: ``trainable params: 4,194,304 || all params: ...``;
* Lightning's model summary: ``Total params: 368 M`` (``K``/``M``/``B``/``T`` are powers of
  ten; a plain number below a thousand);
* free-form training-script lines: ``model: 1.34B parameters``, ``220M params``.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.lazyregex import lazy_regex

ANCHORS: tuple[bytes, ...] = (b"parameters", b"params")

_NUM_ELEMS = lazy_regex(r"num_elems = (?P<n>[0-9]{1,6}(?:\.[0-9]{1,4})?)B\b")
_OLD_DS = lazy_regex(
    r"finished initializing model with (?P<n>[0-9]{1,6}(?:\.[0-9]{1,4})?)B parameters"
)
_HF = lazy_regex(r"Number of (?P<t>trainable )?parameters = (?P<n>[0-9][0-9,]{0,20})")
_PEFT = lazy_regex(
    r"trainable params: (?P<t>[0-9][0-9,]{0,20}) \|\| all params: (?P<n>[0-9][0-9,]{0,20})"
)
_FREE = lazy_regex(
    r"(?<![\w.])(?P<n>[0-9]{1,6}(?:\.[0-9]{1,4})?)\s?(?P<u>[KMBT])\s(?:trainable\s)?"
    r"param(?:eter)?s\b"
)
_LIGHTNING = lazy_regex(
    r"\s{0,4}Total params:? {1,40}(?P<n>[0-9][0-9,]{0,20}(?:\.[0-9]{1,4})?) ?(?P<u>[KMBT])?"
    r"\s{0,80}\Z"
)
_UNITS = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


@dataclass(frozen=True, slots=True)
class ParamCountReading:
    total: int
    trainable: int | None
    origin: str
    """``deepspeed``, ``hf_trainer``, ``peft``, ``lightning`` or ``script``."""


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_param_count(text: str) -> ParamCountReading | None:
    """The parameter count a line states, or None."""
    if (m := _NUM_ELEMS.search(text, timeout=1.0)) or (m := _OLD_DS.search(text, timeout=1.0)):
        return ParamCountReading(round(float(m.group("n")) * 10**9), None, "deepspeed")
    if m := _PEFT.search(text, timeout=1.0):
        return ParamCountReading(_int(m.group("n")), _int(m.group("t")), "peft")
    if "Total params" in text and (m := _LIGHTNING.match(text, timeout=1.0)):
        factor = _UNITS[m.group("u")] if m.group("u") else 1
        return ParamCountReading(
            round(float(m.group("n").replace(",", "")) * factor), None, "lightning"
        )
    if m := _HF.search(text, timeout=1.0):
        count = _int(m.group("n"))
        trainable = count if m.group("t") else None
        return ParamCountReading(count, trainable, "hf_trainer")
    if m := _FREE.search(text, timeout=1.0):
        return ParamCountReading(round(float(m.group("n")) * _UNITS[m.group("u")]), None, "script")
    return None
