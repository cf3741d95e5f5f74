"""Training-log reading: ``read_log`` (one streaming pass) and the matchers it runs.

Modules: ``reader`` (the pass), ``bits`` (the anchor table), ``matchers`` (what each kind of
line becomes), ``state`` (what the pass keeps), ``collect`` (the facts it hands back),
``prefixes`` (launcher prefixes), ``torch_oom`` (OOM messages), ``traceback`` (tracebacks and
phases), ``deepspeed``, ``torchrun``, ``kernel``, ``steps``, ``timestamps``.
"""

from __future__ import annotations

from oomlens.ingest.log.bits import ANCHORS
from oomlens.ingest.log.reader import read_log
from oomlens.ingest.log.state import ReaderLimits

__all__ = ["ANCHORS", "ReaderLimits", "read_log"]
