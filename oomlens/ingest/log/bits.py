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
EXCEPTION, COMPLETION, PLATFORM, SIGNAL, ALLOC_SUMMARY, GPU_TABLE, OOM_START = (
    1 << i for i in range(17, 24)
)
"""``OOM_START``: a line where the squeezed text of a paste shows an OOM message beginning."""

COMPLETION_ANCHORS: tuple[bytes, ...] = (b"exits successfully", b"inished")
"""A run that ended normally (``inished``: ``training finished``, ``Finished training``,
torchrun's ``worker group finished``)."""

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
    (COMPLETION, COMPLETION_ANCHORS),
)

_PASTE_CATEGORIES: tuple[tuple[int, tuple[bytes, ...]], ...] = (
    (
        TB,
        (
            b'File "',
            b"File ~",
            b"File /",
            "│".encode(),
            "❱".encode(),
            "╭".encode(),
            "╰".encode(),
            b"Cell In",
            b"Input In [",
            b"<ipython-input-",
            b"---->",
            b"-->",
            b"Traceback",
        ),
    ),
    (OOM, torch_oom.FRAGMENT_ANCHORS),
    (EXCEPTION, (b"Error", b"Exception", b"Interrupt", b"Failure", b"Failed: ", b"FATAL: ")),
    (COMPLETION, (b"Trainer.fit` stopped", b"train_runtime", b"raining completed")),
    (
        PLATFORM,
        (
            b"WSL",
            b"wsl",
            b"/mnt/c/",
            b"/mnt/d/",
            b"/mnt/e/",
            b"microsoft-standard",
            b"root@",
            b"/workspace",
            b"/kaggle/",
            b"/content/",
            b"docker",
            b"Docker",
            b"kubernetes",
            b"/opt/conda",
            b":\\",
        ),
    ),
    (
        SIGNAL,
        (
            b"Signals.SIG",
            b"exit status",
            b"exit code",
            b"exitcode",
            b"received by PID",
            b"by signal",
            b"Fatal Python error",
            b" killed ",
        ),
    ),
    (SUMMARY, (b"Root Cause (first observed failure)", b" FAILED")),
    (STEP, (b"step", b"Step", b"epoch", b"Epoch", b"iter")),
    (GPU_TABLE, (b"MiB /", b"MiB |", b" free of ", b"MiB  |", b" On ", b" Off ")),
    (ALLOC_SUMMARY, (b"CUDA OOMs", b"memory summary", b"Allocated memory", b"reserved memory")),
)
"""Read only on inputs small enough to read line by line (a paste, a window of a log): what is
left of cut and wrapped messages, tracebacks that lost their header, decorations."""


def _anchor_table(
    categories: tuple[tuple[int, tuple[bytes, ...]], ...] = _CATEGORIES,
) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    bits: dict[bytes, int] = {}
    for bit, anchors in categories:
        for anchor in anchors:
            bits[anchor] = bits.get(anchor, 0) | bit
    # Longer anchors first: leftmost-first matching then reports the most specific one.
    ordered = sorted(bits, key=len, reverse=True)
    return tuple(ordered), tuple(bits[a] for a in ordered)


ANCHORS, ANCHOR_BITS = _anchor_table()
"""Every literal a line must contain for some matcher to care about it."""
MAIN = 1 << 30
"""In the wider table: the anchor is also in the main one (a line the fast pass would see)."""
PASTE_ANCHORS, PASTE_ANCHOR_BITS = _anchor_table(
    _CATEGORIES + ((MAIN, ANCHORS),) + _PASTE_CATEGORIES
)
"""The wider table of inputs read line by line."""
