"""The anchor table of the log reader: the literals a line must hold for some matcher to want
it, and the kind of line (one bit each) every anchor signals."""

from __future__ import annotations

from oomlens.ingest.log import deepspeed, kernel, params, steps, torch_oom, torchrun

TRACEBACK_ANCHORS: tuple[bytes, ...] = (
    b"Traceback (most recent call last)",
    b"During handling of the above exception",
    b"direct cause of the following exception",
)
TERMINATE_ANCHORS: tuple[bytes, ...] = (b"terminate called after throwing",)

# One bit per kind of line; a line's bits are those of the anchors found in it.
TB, OOM, TERMINATE, DS_MEMORY, DS_CPU, FLUSH, CONFIG_DUMP, BATCH, CONFIG_ERROR = (
    1 << i for i in range(9)
)
LAUNCHER, WORLD, AGENT, SUMMARY, PEER, KERNEL, STEP, PARAMS = (1 << i for i in range(9, 17))

_CATEGORIES: tuple[tuple[int, tuple[bytes, ...]], ...] = (
    (TB, TRACEBACK_ANCHORS),
    (TERMINATE | PEER, TERMINATE_ANCHORS),
    (OOM, torch_oom.ANCHORS),
    (DS_MEMORY, deepspeed.MEMORY_ANCHORS),
    (DS_CPU, deepspeed.CPU_ANCHORS),
    (FLUSH, deepspeed.FLUSH_ANCHORS),
    (CONFIG_DUMP, deepspeed.CONFIG_DUMP_ANCHORS),
    (BATCH, deepspeed.BATCH_ANCHORS),
    (CONFIG_ERROR, deepspeed.CONFIG_ERROR_ANCHORS),
    (LAUNCHER, deepspeed.LAUNCHER_ANCHORS),
    (WORLD, deepspeed.WORLD_ANCHORS),
    (AGENT, torchrun.AGENT_ANCHORS),
    (SUMMARY, torchrun.SUMMARY_ANCHORS),
    (PEER, torchrun.PEER_ANCHORS),
    (KERNEL, kernel.ANCHORS),
    (STEP, steps.ANCHORS),
    (PARAMS, params.ANCHORS),
)


def _anchor_table() -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    bits: dict[bytes, int] = {}
    for bit, anchors in _CATEGORIES:
        for anchor in anchors:
            bits[anchor] = bits.get(anchor, 0) | bit
    # Longer anchors first: leftmost-first matching then reports the most specific one.
    ordered = sorted(bits, key=len, reverse=True)
    return tuple(ordered), tuple(bits[a] for a in ordered)


ANCHORS, ANCHOR_BITS = _anchor_table()
"""Every literal a line must contain for some matcher to care about it."""
