"""``oomlens capture``: make the next crash leave everything ``oomlens analyze`` needs.

Runs inside the training process, with no edit to the training script::

    python -m oomlens.capture train.py ARGS
    torchrun --nproc_per_node 8 -m oomlens.capture train.py ARGS
    deepspeed --num_gpus 8 --module oomlens.capture train.py ARGS
    accelerate launch -m oomlens.capture train.py ARGS

or with one line of code: ``import oomlens.capture; oomlens.capture.install()``.

Per rank it writes, into one capture directory per run (``oomlens-capture/<run>/`` under the
working directory, or ``OOMLENS_CAPTURE_DIR``; ``<run>`` is ``slurm-<job>``,
``torchrun-<run id>`` or the launcher's start time, so the ranks of one run meet):

* ``rank<R>.events.jsonl``: what the process is and what happened to it: versions, allocator
  settings, rank and world size, the recording policy and its changes, the DeepSpeed config as
  DeepSpeed resolved it, every out-of-memory (with what NVML says about the other processes on
  the device), the exception and traceback it died of, its exit, and (written by a small
  watcher process) when it disappeared and what the cgroup's ``memory.events`` said then;
* ``rank<R>.series.jsonl``: GPU memory after every optimizer step (allocated, reserved, peaks,
  allocator retries and OOMs from ``memory_stats()``) and every second the host side (RSS,
  pinned and shared memory, the cgroup's ``memory.current`` / ``memory.max`` /
  ``memory.events``), appended and flushed as it goes;
* ``rank<R>.snapshot.pickle``: ``torch.cuda.memory._snapshot()`` taken by an out-of-memory
  observer, the moment the allocator gives up and before the exception unwinds;
* ``rank<R>.kernel.log``: the kernel's OOM-killer lines about the rank, when it was killed and
  the kernel log is readable.

Guarantees: nothing here synchronises a step or makes a collective call; no exception escapes a
hook; a full disk stops the recording with one line on stderr; the disk used per rank is
bounded (``OOMLENS_CAPTURE_MAX_MB``, 20 by default); ``torch`` and ``deepspeed`` are never
imported by the capture itself, only hooked when the script imports them.

This package imports only the standard library at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oomlens.capture.recorder import Recorder

__all__ = ["install", "active"]


def install(directory: str | None = None, **settings: Any) -> Recorder | None:
    """Start capturing in this process; returns the recorder, or None when capture is off
    (``OOMLENS_CAPTURE=0``) or could not start (one line on stderr says why).

    ``directory`` overrides ``OOMLENS_CAPTURE_DIR`` (the parent of the per-run directory);
    ``settings`` override the environment's ``OOMLENS_CAPTURE_*`` values by name (see
    ``oomlens.capture.settings.CaptureSettings``).  Calling it again returns the running
    recorder.  Never raises.
    """
    from oomlens.capture.recorder import start

    return start(directory, settings)


def active() -> Recorder | None:
    """The recorder of this process, if capture is running."""
    from oomlens.capture.recorder import current

    return current()
