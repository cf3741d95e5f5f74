"""Settings DeepSpeed accepts that do something other than what their author meant.

Each hazard here rests on how DeepSpeed 0.19.8 (or the integration that fills the config)
reads the key:

- ``bf16`` and ``bfloat16`` are two spellings of one block; ``get_bfloat16_config``
  (deepspeed/runtime/precision_config.py) reads ``bfloat16`` only when ``bf16`` is absent or
  null, so with both written the ``bfloat16`` block is ignored, whatever it says.  The HF
  Trainer (``HfTrainerDeepSpeedConfig.trainer_config_process``: ``fill_match("bf16.enabled",
  ...)``) and Accelerate fill ``"auto"`` under the ``bf16`` spelling only: ``bfloat16.enabled:
  "auto"`` reaches DeepSpeed as written, which drops it, and bf16 stays off.
"""

from __future__ import annotations

from oomlens.facts.config import ConfigDocument, ConfigHazard, ConfigSeverity

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
