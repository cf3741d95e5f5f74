"""The log reader's bulk scan by the C extension (``_scan.c``): ``bulk.scan_batch``'s arrays
from passes over the batch's bytes: the anchors, each anchored line's stream key, and what the
per-line matchers would read in the lines it is sure of (progress, memory, CPU, cache-flush
lines, whatever else they hold), with no object per line.

The extension is built with the package where a C compiler is found (``hatch_build.py``);
without it, or with ``OOMLENS_PURE_SCAN`` set, ``bulk`` finds the same anchors and every line
holding one takes the per-line path; the facts are the same either way
(``tests/ingest/log/test_native_scan.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oomlens.ingest.log.bulk import BatchScan
    from oomlens.ingest.log.bulk_labels import Labels

try:  # pragma: no cover - exercised where the extension was not built
    from oomlens.ingest.log import _scan
except ImportError:  # pragma: no cover
    _scan = None  # type: ignore[assignment]

BUILT = _scan is not None
"""The extension was built and imports."""
NATIVE = BUILT and not os.environ.get("OOMLENS_PURE_SCAN")
"""The scan runs in C unless ``OOMLENS_PURE_SCAN`` is set (every anchored line read line by
line: a fallback and a cross-check)."""

PIVOTS = True
"""Anchors found by their pivots (16 offsets at a time, SSSE3) where the processor can; False:
by the hash filter alone, offset by offset (what other processors do; the same hits)."""

WINDOW_BYTES = 256 << 10
"""The extension's passes go over a batch this many bytes of lines at a time, which the cache
holds from one pass to the next (half the 512 KiB L2 of the machine measured: 8 MiB batches
scanned whole ran 20-40% slower, 128 and 256 KiB windows alike).  The arrays are the same
whatever it is (tested down to a line a window)."""

_SURPRISE = (
    b"\x17\x17\x17\x17\x17\x17\x17\x17\x17\x11\x07\x17\x17\x17\x17\x17\x17\x17\x17\x17\x17\x17\x17\x17"
    b"\x17\x17\x17\x17\x17\x17\x17\x17\x03\x11\x0b\x0e\x13\x0b\x12\n\t\t\t\x0c\x07\x06\x05\t"
    b"\x05\x06\x06\x06\x07\x07\x06\x07\x07\x08\x05\x0f\x0b\x08\x0b\x10\x13\x07\x07\x08\n\n\x08\x07"
    b"\x0f\x07\x0e\x0c\n\x08\x07\x08\n\x11\t\n\x0b\n\n\n\x10\x0f\x0b\x06\x11\x06\t\x06"
    b"\x0f\x05\x08\x05\x06\x04\x06\x06\x06\x05\n\x07\x06\x06\x05\x05\x05\n\x05\x05\x05\x06\n\t"
    b"\t\x06\n\x0e\r\x0e\x12\x17"
)
"""Per ASCII byte, ``-log2`` of its frequency in the corpora's logs (fixtures, test assets, the
bench's logs), rounded: an anchor's pivot is the pair of adjacent bytes least likely together
by these figures (bytes past ASCII count as rare)."""


def _pivot(anchor: bytes) -> int:
    def surprise(byte: int) -> int:
        return _SURPRISE[byte] if byte < len(_SURPRISE) else 40

    return max(range(len(anchor) - 1), key=lambda o: surprise(anchor[o]) + surprise(anchor[o + 1]))


def prepare() -> None:
    """Make the anchor table now, before threads scan at once."""
    _anchor_table()


# The extension's label statuses (``_scan.c``).
_L_NONE, _L_DEFERRED, _L_FAST, _L_WALK, _L_TEXT = range(5)

_matcher: object = None


def _anchor_table() -> object:
    """The extension's table of the anchors (made once per process)."""
    global _matcher
    if _matcher is None:
        from oomlens.ingest.log.bits import ANCHOR_BITS, ANCHORS

        assert _scan is not None
        _matcher = _scan.make_matcher(ANCHORS, ANCHOR_BITS, tuple(map(_pivot, ANCHORS)))
    return _matcher


def scan(data: bytes, block_starts: list[int], prev_tail: bytes) -> BatchScan:
    """``scan_batch`` by the extension: the same arrays; the label texts it points at become
    ids here, as ``_labels`` makes them (the previous line's first, then the walk's)."""
    from oomlens.ingest.log import bulk, bulk_labels, steps

    assert _scan is not None
    starts = np.asarray(block_starts, dtype=np.int64).tobytes()
    (
        counts,
        line,
        bits,
        start,
        kind,
        key,
        prefix_id,
        prefix_len,
        ts,
        a,
        b,
        c,
        d,
        f,
        status,
        begin,
        end,
        consumed,
        bars,
        e,
        g,
        h,
        hosts,
        followed,
    ) = _scan.scan(
        data,
        starts,
        len(prev_tail),
        _anchor_table(),
        steps.TQDM_ANCHORS,
        PIVOTS,
        _expected(data),
        WINDOW_BYTES,
    )
    _hits_per_byte[0] = len(line) / 8 / max(len(data), 1)

    def i8(raw: bytearray) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.int64)

    result = bulk.BatchScan(
        line_counts=i8(counts).tolist(),
        hit_line=i8(line),
        hit_bits=i8(bits),
        hit_start=i8(start),
        kind=np.frombuffer(kind, dtype=np.int8),
        key=i8(key),
        prefix_id=i8(prefix_id),
        prefix_len=i8(prefix_len),
        ts=i8(ts),
        a=i8(a),
        b=i8(b),
        c=i8(c),
        d=i8(d),
        f=np.frombuffer(f, dtype=np.float64),
        e=i8(e),
        g=np.frombuffer(g, dtype=np.float64),
        h=i8(h),
        label=np.full(len(line) // 8, bulk_labels.LABEL_NONE, dtype=np.int32),
        consumed=np.frombuffer(consumed, dtype=bool),
        progress_bars=np.frombuffer(bars, dtype=bool).tolist(),
        hosts=hosts.decode("ascii").split("\n")[:-1],
        host_followed=[bool(x) for x in followed],
    )
    labels = np.frombuffer(status, dtype=np.int8)
    if (result.kind == bulk.MEMORY).any():
        texts = bulk_labels.Labels()
        begins, ends = i8(begin), i8(end)
        result.label[labels == _L_DEFERRED] = bulk_labels.LABEL_DEFERRED
        for found in (_L_FAST, _L_WALK, _L_TEXT):
            rows = np.flatnonzero(labels == found)
            if len(rows):
                exact = found == _L_TEXT  # the texts themselves, as id_of would make them
                result.label[rows] = _label_ids(texts, data, begins[rows], ends[rows], exact)
        result.labels = texts.texts
    return result


_hits_per_byte = [-1.0]
"""The last batch's anchored lines per byte (shared by the threads that scan: a hint only)."""


def _expected(data: bytes) -> int:
    """About how many anchored lines ``data`` holds, by the last batch scanned (-1: none yet):
    the room the extension makes at first, which it grows if need be (the arrays are the same
    either way; a room too large costs memory, too small copies)."""
    ratio = _hits_per_byte[0]
    return -1 if ratio < 0 else int(len(data) * ratio * 1.25)


def _label_ids(
    texts: Labels, data: bytes, begins: np.ndarray, ends: np.ndarray, exact: bool = False
) -> np.ndarray:
    """``texts.id_of`` of each text ``data[begin:end]``, as calling it row by row would give:
    the extension groups them by the labels' cache key (a hash table, in one pass without the
    GIL), ``id_of`` reads each key's first text, in the order the keys first occur.  ``exact``:
    the spans are the label texts already (``_scan.c``'s ``label_text``): grouped by their bytes,
    each distinct one decoded once."""
    assert _scan is not None
    firsts, inverse = _scan.label_keys(data, begins, ends, exact)
    first = np.frombuffer(firsts, dtype=np.int64)
    spans = zip(begins[first].tolist(), ends[first].tolist(), strict=True)
    make = texts.id_of_text if exact else texts.id_of
    ids = np.asarray([make(data[b:e]) for b, e in spans], dtype=np.int64)
    return ids[np.frombuffer(inverse, dtype=np.int64)]
