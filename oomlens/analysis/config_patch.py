"""Minimal ds_config changes, as JSON merge patches (RFC 7386), with their predicted effect.

A patch is built against the effective config so that it (1) never re-proposes a value already
in force - a change to the value DeepSpeed already uses is dropped, and a patch left with no
change is not made at all -, and (2) writes each key the way the config already spells it
(``prefetch_bucket_size`` stays ``prefetch_bucket_size``: adding ``stage3_prefetch_bucket_size``
next to it would make DeepSpeed refuse the config).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oomlens.facts.config import ConfigValue, EffectiveDsConfig
from oomlens.facts.memory_model import ConfigChange, ConfigPatch


def values_by_key_path(effective: EffectiveDsConfig) -> dict[str, ConfigValue[Any]]:
    """Every setting in force, indexed by the key path it is (or would be) written under."""
    return {value.key_path: value for value in effective.all_values()}


def make_patch(
    effective: EffectiveDsConfig,
    changes: Iterable[ConfigChange],
    *,
    summary: str,
    cost: str,
    gpu_bytes_saved: int | None = None,
    host_bytes_delta: int | None = None,
    pinned_bytes_delta: int | None = None,
) -> ConfigPatch | None:
    """A patch of the ``changes`` that differ from what is in force; None when none does.

    A change to a key whose in-force value equals ``new`` is dropped.  Deletions (``new=None``)
    are kept only for keys present in the config.
    """
    in_force = values_by_key_path(effective)
    kept: list[ConfigChange] = []
    for change in changes:
        current = in_force.get(change.key_path)
        if change.new is None:
            if current is not None and not current.is_explicit:
                continue
            kept.append(
                ConfigChange(change.key_path, None, None if current is None else current.value)
            )
            continue
        if current is not None and _same(current.value, change.new):
            continue
        kept.append(
            ConfigChange(change.key_path, change.new, None if current is None else current.value)
        )
    if not any(change.new is not None for change in kept):
        return None
    return ConfigPatch(
        changes=tuple(kept),
        summary=summary,
        cost=cost,
        gpu_bytes_saved=gpu_bytes_saved,
        host_bytes_delta=host_bytes_delta,
        pinned_bytes_delta=pinned_bytes_delta,
    )


def _same(current: Any, new: Any) -> bool:
    if isinstance(current, bool) or isinstance(new, bool):
        return current is new or (
            isinstance(current, bool) and isinstance(new, bool) and current == new
        )
    return bool(current == new)
