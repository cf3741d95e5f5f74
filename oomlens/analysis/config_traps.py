"""Settings DeepSpeed accepts that do something other than what their author meant.

Each hazard here rests on how DeepSpeed 0.19.8 (or the integration that fills the config)
reads the key:

- ``bf16`` and ``bfloat16`` are two spellings of one block; ``get_bfloat16_config``
  (deepspeed/runtime/precision_config.py) reads ``bfloat16`` only when ``bf16`` is absent or
  null, so with both written the ``bfloat16`` block is ignored, whatever it says.  The HF
  Trainer (``HfTrainerDeepSpeedConfig.trainer_config_process``: ``fill_match("bf16.enabled",
  ...)``) and Accelerate fill ``"auto"`` under the ``bf16`` spelling only: ``bfloat16.enabled:
  "auto"`` reaches DeepSpeed as written, which drops it, and bf16 stays off.
- ``nvme_path`` is used as written: the swap folders are ``{nvme_path}/zero_stage_3/...``
  (``os.makedirs``, no ``~`` or ``$VAR`` expansion), so a placeholder copied from the docs fails
  at engine start where its root is not writable, or swaps to whatever disk holds it.
- ``fp16.initial_scale_power``: dynamic loss scaling starts at ``2**initial_scale_power``
  (``DeepSpeedFP16Config.initial_dynamic_scale``; default 16) and halves it once per overflowed
  step, skipping that step.  fp16's largest finite value is 65504 (just under 2**16): every
  power above the default costs at least one skipped step before training starts.
"""

from __future__ import annotations

import re

from oomlens.facts.config import (
    ConfigDocument,
    ConfigHazard,
    ConfigSeverity,
    EffectiveDsConfig,
)

DEFAULT_SCALE_POWER = 16
"""DeepSpeed's ``initial_scale_power`` default (precision_config.py)."""
FLOAT_MAX_POWER = 1024
"""``2**1024`` is past the largest float: DeepSpeed's ``loss * scale`` raises OverflowError."""

#: Paths the docs and tutorials write for "put your path here": ``/path/to/...``, a component in
#: angle brackets or braces, ``your_...``; and ``~``/``$VAR``, which DeepSpeed does not expand.
_PLACEHOLDER = re.compile(
    r"(?:^|/)path/to(?:/|$)|<[^>]*>|\{[^}]*\}|(?:^|/)your[_-]?\w*(?:/|$)|^~|\$", re.IGNORECASE
)
DOCS_EXAMPLE_NVME = "/local_nvme"
"""The ``nvme_path`` of DeepSpeed's and Hugging Face's ZeRO-Infinity examples."""

BF16 = "bf16"
BF16_OLD = "bfloat16"


def bf16_spelling_hazards(doc: ConfigDocument, integration: str | None) -> list[ConfigHazard]:
    """``bfloat16`` written beside a ``bf16`` block, which is the one DeepSpeed reads; or
    ``bfloat16.enabled: "auto"``, which no integration fills (``integration`` "deepspeed":
    nothing fills any "auto", and ``find_config_hazards`` says so)."""
    data = doc.data
    old = data.get(BF16_OLD)
    if (
        data.get(BF16) is None
        and isinstance(old, dict)
        and old.get("enabled") == "auto"
        and integration != "deepspeed"
    ):
        key = f"{BF16_OLD}.enabled"
        return [
            ConfigHazard(
                "bfloat16_auto_unfilled",
                f'{key} is "auto", but the HF Trainer fills "auto" only under the {BF16!r} '
                f"spelling (fill_match('bf16.enabled')): unless Accelerate writes a {BF16!r} "
                'block of its own (--mixed_precision bf16), DeepSpeed gets the "auto", drops '
                "it, and bf16 stays disabled (fp32 training, twice the parameter and gradient "
                f"memory); rename the block {BF16!r}",
                ConfigSeverity.MEDIUM,
                (key,),
                tuple(doc.source(k) for k in (key, BF16_OLD) if k in doc.key_lines)[:1],
            )
        ]
    if data.get(BF16) is None or BF16_OLD not in data:
        return []
    read, ignored = data.get(BF16), data.get(BF16_OLD)
    read_on = isinstance(read, dict) and read.get("enabled") is True
    ignored_on = isinstance(ignored, dict) and ignored.get("enabled") is True
    # Worse when the ignored block is the one that would turn bf16 on.
    severity = ConfigSeverity.MEDIUM if ignored_on and not read_on else ConfigSeverity.LOW
    return [
        ConfigHazard(
            "bfloat16_ignored",
            f"both {BF16!r} and {BF16_OLD!r} are written: DeepSpeed reads {BF16!r} only and "
            f"ignores {BF16_OLD!r} (its older spelling), so bf16 is "
            f"{'enabled' if read_on else 'not enabled'} as {BF16!r} says; keep one block",
            severity,
            (f"{BF16}.enabled", f"{BF16_OLD}.enabled"),
            tuple(
                doc.source(key)
                for key in (f"{BF16}.enabled", f"{BF16_OLD}.enabled", BF16, BF16_OLD)
                if key in doc.key_lines
            )[:2],
        )
    ]


def nvme_path_hazards(doc: ConfigDocument, effective: EffectiveDsConfig) -> list[ConfigHazard]:
    """An NVMe offload whose ``nvme_path`` is a placeholder (or the docs' example path)."""
    out: list[ConfigHazard] = []
    for block in (effective.zero.offload_param, effective.zero.offload_optimizer):
        path = block.nvme_path.value
        if block.device.value != "nvme" or path is None:
            continue
        text = str(path)
        key = block.nvme_path.key_path
        sources = tuple(doc.source(key) for k in (key,) if k in doc.key_lines)
        if _PLACEHOLDER.search(text):
            out.append(
                ConfigHazard(
                    "nvme_path_placeholder",
                    f"{key} = {text!r} is a placeholder, not a mount: DeepSpeed uses it as "
                    f"written (no ~ or $VAR expansion) and creates {text}/zero_stage_3/... at "
                    "engine start, which fails where that root is not writable or swaps to "
                    "whatever disk holds it; set the NVMe mount of every node",
                    ConfigSeverity.HIGH,
                    (key,),
                    sources,
                )
            )
        elif text.rstrip("/") == DOCS_EXAMPLE_NVME:
            out.append(
                ConfigHazard(
                    "nvme_path_docs_example",
                    f"{key} = {text!r} is the docs' example path: make sure it is an NVMe "
                    "mount on every node (DeepSpeed creates the folder on whatever disk holds it)",
                    ConfigSeverity.LOW,
                    (key,),
                    sources,
                )
            )
    return out


def loss_scale_hazards(doc: ConfigDocument) -> list[ConfigHazard]:
    """An fp16 dynamic loss scale that starts above fp16's range (``initial_scale_power``)."""
    fp16 = doc.data.get("fp16")
    if not isinstance(fp16, dict) or fp16.get("enabled") not in (True, "auto"):
        return []
    power = fp16.get("initial_scale_power")
    static = fp16.get("loss_scale", 0)
    if (
        not isinstance(power, int)
        or isinstance(power, bool)
        or power <= DEFAULT_SCALE_POWER
        or (isinstance(static, int | float) and static > 0)  # a static scale ignores it
    ):
        return []
    key = "fp16.initial_scale_power"
    when = " (if fp16 is enabled at launch)" if fp16.get("enabled") == "auto" else ""
    if power >= FLOAT_MAX_POWER:
        effect = "does not fit a float: DeepSpeed fails with OverflowError at the first step"
        severity = ConfigSeverity.HIGH
    else:
        skipped = power - DEFAULT_SCALE_POWER
        effect = (
            "overflows fp16 (largest finite value 65504, just under 2**16) at once: the "
            f"dynamic scaler skips at least {skipped} optimizer steps halving it back, "
            f"more with hysteresis {fp16.get('hysteresis', 2)}"
        )
        severity = ConfigSeverity.MEDIUM if skipped >= 4 else ConfigSeverity.LOW
    return [
        ConfigHazard(
            "initial_scale_power_too_high",
            f"{key} = {power}{when}: the first loss scale 2**{power} {effect}; DeepSpeed's "
            f"default is {DEFAULT_SCALE_POWER}",
            severity,
            (key,),
            tuple(doc.source(k) for k in (key,) if k in doc.key_lines),
        )
    ]
