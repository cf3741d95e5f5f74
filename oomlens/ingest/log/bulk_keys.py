"""The bulk scan's stream keys and the constants the C extension (``_scan.c``) shares with the
reader (``tests/ingest/log/test_native_scan.py`` checks them alike).

A key names the stream a line belongs to as ``prefixes.strip_prefixes`` would: ``N`` for
``[rankN]:``, ``DEFAULT_ROLE + N`` for ``[defaultN]:``, ``TASK_ROLE + N`` for srun's ``N: ``,
``NO_KEY`` for a line without a prefix; ``UNSURE`` where the scan leaves the line to the
per-line prefix parser.
"""

from __future__ import annotations

import numpy as np

NO_KEY = -1
"""A line's stream key is ``()`` (no prefix)."""
UNSURE = -2
"""The scan cannot tell a line's stream key without the per-line prefix parser."""
DEFAULT_ROLE = 1 << 24
"""Keys: ``N`` for ``[rankN]:``, ``DEFAULT_ROLE + N`` for ``[defaultN]:``."""
TASK_ROLE = 2 << 24
"""``TASK_ROLE + N`` for srun ``--label``'s ``N: `` (the task number is the global rank)."""
HEAD = 32
"""The bytes of a line's start the extension reads its prefix from."""
NO_TS = int(np.iinfo(np.int64).min)
"""No timestamp (``BatchScan.ts``)."""
