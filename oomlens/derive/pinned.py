"""Failures of page-locked (pinned) host memory.

Pinned memory is host RAM the GPU can copy from directly: DataLoader's ``pin_memory=True``
(a pin-memory thread copies every batch into it), ZeRO offload's buffers, ``tensor.pin_memory()``.
It comes from ``cudaHostAlloc`` through torch's caching host allocator; when that fails the
runtime says ``CUDA error: out of memory`` although the card may be nearly empty, and the
DataLoader reports ``Caught RuntimeError in pin memory thread``.  WSL2 caps pinned memory far
below the machine's RAM, so under WSL a runtime-level ``CUDA error: out of memory`` is taken for
a pinned allocation.  ``pinned_failure(facts)`` finds the line or frame that says a pinned
allocation failed: a pinning frame (DataLoader's pin-memory thread, or an innermost library
function that the library knowledge says pins), the message's words, or an innermost frame
whose source line pins (``t.pin_memory()``, ``torch.empty(..., pin_memory=True)``).
"""

from __future__ import annotations

import re

from oomlens.facts import SourceRef
from oomlens.facts.log import Frame
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import PinnedFailure
from oomlens.knowledge.frames import frame_role

_PINNED_TEXT = re.compile(
    r"pin memory thread|cudaHostAlloc|CachingHostAllocator|HostAllocator|pinned memory",
    re.IGNORECASE,
)
_PINNED_FRAMES = frozenset({"pin_memory", "_pin_memory_loop", "pin_memory_loop", "_pin_memory"})
_PINNING_CALL = re.compile(r"\.pin_memory\(\s*\)|\bpin_memory\s*=\s*True\b")
"""A source line that pins host memory: ``t.pin_memory()`` (a C method: no Python frame of its
own) or a factory asked for pinned memory (``torch.empty(..., pin_memory=True)``)."""


def under_wsl(facts: RunFacts) -> SourceRef | None:
    """Where the inputs show the run was under WSL (the reader's platform hint), if they do."""
    for log in facts.logs:
        for hint in log.platform_hints:
            if hint.kind == "wsl":
                return hint.source
    return None


def _pins(frame: Frame) -> bool:
    """The library knowledge says this function pins host memory (its body calls
    ``pin_memory()`` or asks a factory for ``pin_memory=True``): the innermost frame of a
    failure is then the pinned allocation."""
    known = frame_role(frame.filename, frame.function)
    return known is not None and known.role == "pinning"


def pinned_failure(facts: RunFacts) -> PinnedFailure | None:
    """The first OOM raised while pinning host memory (its text or its frames say so), else
    the first exception of a pin-memory thread."""
    for event in facts.oom_events():
        frames = event.traceback.frames if event.traceback is not None else ()
        pinning = [f for f in frames if f.function in _PINNED_FRAMES]
        if not pinning and frames and _pins(frames[-1]):
            pinning = [frames[-1]]
        current = event.traceback.current_line if event.traceback is not None else None
        if current and frames and not pinning and _PINNING_CALL.search(current):
            # the innermost frame was running a pinning call when the runtime failed: the
            # failed allocation was cudaHostAlloc's, whatever the card had free
            inner = frames[-1]
            where = f" ({inner.filename}:{inner.line} in {inner.function}: {current.strip()})"
            return PinnedFailure(event.message.text[:400] + where, event.source, True)
        if pinning or _PINNED_TEXT.search(event.message.text):
            where = (
                f" ({pinning[-1].filename}:{pinning[-1].line} in {pinning[-1].function})"
                if pinning
                else ""  # the message's own words say pinning: no frame to name
            )
            return PinnedFailure(event.message.text[:400] + where, event.source, True)
    for exception in facts.exceptions():
        if _PINNED_TEXT.search(exception.text):
            return PinnedFailure(exception.text[:400], exception.source, False)
    wsl = under_wsl(facts)
    if wsl is not None:
        for event in facts.oom_events():
            if event.message.message_format == "driver":
                # WSL2 caps page-locked memory far below the RAM: there a runtime-level OOM
                # is the pinned allocation far more often than the card.
                text = event.message.text[:400] + " (under WSL)"
                return PinnedFailure(text, event.source, True, wsl_only=True)
    return None
