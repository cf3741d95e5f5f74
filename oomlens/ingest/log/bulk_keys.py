"""The bulk scan's stream keys and the constants the C extension (``_scan.c``) shares with the
reader (``tests/ingest/log/test_native_scan.py`` checks them alike).

A key names the stream a line belongs to as ``prefixes.strip_prefixes`` would: ``N`` for
``[rankN]:`` and Lightning's ``[rank: N] ``, ``DEFAULT_ROLE + N`` for ``[defaultN]:``,
``TASK_ROLE + N`` for srun's ``N: ``, ``NO_KEY`` for a line without a prefix;
``HOST_ROLE * (h + 1) + k + 1`` for pdsh's ``host: `` before a line of key ``k`` (``h``: the
host's index in the scan's ``BatchScan.hosts``); ``UNSURE`` where the scan leaves the line to
the per-line prefix parser.
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
HOST_ROLE = 1 << 26
"""Keys from here on hold a host (above): past every key without one."""
MAX_HOSTS = 1024
"""The distinct hosts a scan keys (past them, a host's lines are left to the per-line path)."""


def split_key(key: int) -> tuple[int, int]:
    """``(host index or -1, the key without the host)`` of a scan key."""
    if key < HOST_ROLE:
        return -1, key
    return key // HOST_ROLE - 1, key % HOST_ROLE - 1


def rehost(keys: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``keys`` with each host index ``h`` replaced by ``index[h]`` (the hosts of scans put
    end to end: one table)."""
    hosted = keys >= HOST_ROLE
    if not hosted.any() or not len(index):
        return keys
    host = np.where(hosted, keys // HOST_ROLE - 1, 0)
    moved = (index[host] + 1) * HOST_ROLE + keys % HOST_ROLE
    return np.where(hosted, moved, keys)
