"""Training-log reading: ``read_log`` (one streaming pass) and the matchers it runs.

Modules: ``reader`` (the pass), ``prefixes`` (launcher prefixes), ``torch_oom`` (OOM
messages), ``traceback`` (tracebacks and phases), ``deepspeed``, ``torchrun``, ``kernel``,
``steps``, ``timestamps``.
"""

from __future__ import annotations

from oomlens.ingest.log.reader import ANCHORS, ReaderLimits, read_log

__all__ = ["ANCHORS", "ReaderLimits", "read_log"]
