"""The labels of ``see_memory_usage`` memory lines in the bulk scan: the cleaned text of the
line a memory line names as its label, computed once per distinct text.

``Labels`` gives each distinct label text an id (``LABEL_NONE``: no label) as
``LogReader.label_before`` would read it; ``BatchScan.label`` holds those ids and
``BatchScan.labels`` the texts.  Used by the pure scan (``bulk``) and the extension's
(``native``).
"""

from __future__ import annotations

import re

import numpy as np

from oomlens.ingest.log import deepspeed
from oomlens.ingest.log.bulk_keys import DIGIT
from oomlens.ingest.textstream import LineCleaner, StreamStats

LABEL_NONE = -1
LABEL_DEFERRED = -2
"""A memory line whose label the reader must look up itself (the walk met a line whose stream
the scan could not tell, or left the bytes the scan has)."""

STAMPED = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d\d\d\] \[")


_DEDUPE_MAX = 256
_DEDUPE_MIN = 8
"""Texts are looked up one by one when longer than ``_DEDUPE_MAX`` bytes (numpy would compare
them a byte column at a time) or when fewer than ``_DEDUPE_MIN`` texts have their length."""


class Labels:
    """``label_before``'s text for a label line's bytes after its prefix, computed once per
    distinct text (``strip_logger(clean(raw)).strip()``, None when empty or itself a memory
    line, cut to 200 characters)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}
        self._raw: dict[bytes, int] = {}
        self._cleaner = LineCleaner(StreamStats())

    def id_of(self, raw: bytes) -> int:
        # a logger record's timestamp does not change its message: key the cache on the rest
        key = raw[26:] if STAMPED.match(raw) else raw
        found = self._raw.get(key)
        if found is not None:
            return found
        label = deepspeed.strip_logger(self._cleaner.clean(raw)).strip()
        if not label or "Max_MA" in label or "CPU Virtual Memory" in label:
            ident = LABEL_NONE
        else:
            label = label[:200]
            ident = self._ids.setdefault(label, len(self.texts))
            if ident == len(self.texts):
                self.texts.append(label)
        if len(self._raw) < 65536:
            self._raw[key] = ident
        return ident

    def ids_of(self, arr: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """``id_of`` of each ``arr[begin:end]``, as calling it row by row would give, but called
        once per distinct cache key (the text, less a logger record's timestamp), in the order
        the keys first occur.  Memory lines of many ranks share few labels ("after step 12"
        on 64 ranks, one logger record at different times): numpy tells the keys apart, a
        length at a time, rather than a dictionary lookup per line (dense 64-rank log: 0.4 s
        of the scan's 2.6 s per 100 MiB went to those lookups)."""
        out = np.full(len(begins), LABEL_NONE, dtype=np.int64)
        if not len(begins):
            return out
        stamped = are_stamped(arr, begins, ends)
        keys_from = begins + 26 * stamped
        # stamped and plain texts apart: id_of's cache holds either, whichever came first
        groups = (ends - keys_from) * 2 + stamped
        firsts: list[np.ndarray] = []
        inverses: list[tuple[np.ndarray, np.ndarray]] = []
        for group in np.unique(groups).tolist():
            rows = np.flatnonzero(groups == group)
            length = group // 2
            if length <= 0 or length > _DEDUPE_MAX or len(rows) < _DEDUPE_MIN:
                first, inverse = rows, np.arange(len(rows))
            else:
                texts = arr[keys_from[rows][:, None] + np.arange(length)]
                keys = np.ascontiguousarray(texts).view(np.dtype((np.void, length))).ravel()
                _, first_at, inverse = np.unique(keys, return_index=True, return_inverse=True)
                first = rows[first_at]
            inverses.append((rows, inverse.ravel()))
            firsts.append(first)
        every_first = np.concatenate(firsts)
        ids = np.empty(len(every_first), dtype=np.int64)
        data = arr.data
        for at in np.argsort(every_first, kind="stable").tolist():
            row = int(every_first[at])
            ids[at] = self.id_of(bytes(data[int(begins[row]) : int(ends[row])]))
        offset = 0
        for (rows, inverse), first in zip(inverses, firsts, strict=True):
            out[rows] = ids[offset + inverse]
            offset += len(first)
        return out


_STAMP = b"[0000-00-00 00:00:00,000] ["
_STAMP_DIGITS = np.frombuffer(_STAMP, dtype=np.uint8) == ord("0")
_STAMP_BYTES = np.frombuffer(_STAMP, dtype=np.uint8)


def are_stamped(arr: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which ``arr[begin:end]`` ``STAMPED`` matches (a logger record's timestamp, then ``[``):
    0 or 1 per text."""
    result = np.zeros(len(begins), dtype=np.int64)
    rows = np.flatnonzero(ends - begins >= len(_STAMP))
    if len(rows):
        head = arr[begins[rows][:, None] + np.arange(len(_STAMP))]
        ok = np.where(_STAMP_DIGITS, DIGIT[head], head == _STAMP_BYTES).all(axis=1)
        result[rows[ok]] = 1
    return result
