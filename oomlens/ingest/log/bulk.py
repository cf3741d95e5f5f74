"""The log reader's bulk scan: a batch of blocks, read without visiting its lines in Python.

``scan_batch`` is a pure function of a batch's bytes (several of the reader's blocks, whole
lines) and returns ``BatchScan``: every line that holds an anchor, with its kinds of line
(``bits``), and for the lines of the high-frequency shapes -- ``see_memory_usage`` memory and
CPU lines, ZeRO-3's cache-flush warning, DeepSpeed's ``step=`` line and the training scripts'
``step S/N loss X`` lines -- what the per-line matchers would make of them, as arrays.  The
reader applies runs of such lines to its state at once (``bulk_apply``); every other line keeps
the per-line path.  Being pure, the scan runs in worker processes as well (``parallel``).

The engines, chosen by measurement (2-core machine, CPU seconds per 100 MB, best of five):

* anchors: ``ahocorasick_rs`` over the batch, 0.09 s on a sparse log and 0.29 s (hits turned
  into arrays included) on one where four lines in five hold an anchor; pyarrow's RE2 over the
  lines, 0.24 s and 0.17 s, and it says only *whether* a line holds one (the per-line path
  needs which).  Aho-Corasick it is, for both;
* line prefixes (``[rankN]:``, ``[defaultN]:``): numpy over the first bytes of every line
  (a strided view, no copy of the batch); RE2 extraction over all lines took 0.4 s;
* the shapes: RE2 through ``pyarrow.compute.extract_regex``, one pattern per shape, run only on
  the lines that hold that shape's anchor and nothing else: 0.07 microseconds a line when the
  lines match, several times more on lines that do not, hence the preselection; decimals are
  cast by Arrow (correctly rounded, as ``float()``: checked by the tests);
* ``see_memory_usage`` labels: numpy over the stream keys of the sixteen lines before each
  memory line, text cleaned in Python once per distinct label.

A line goes to the bulk path only when the scan is sure the per-line path would read it the
same way: its text is plain printable ASCII in one of the shapes below (so cleaning leaves it
as it is), it holds that shape's anchor and no other, its prefix is one of the forms above or
none, its timestamp is a valid date.  Anything else is a line for the per-line path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oomlens.ingest.log import bulk_keys, native, steps, torch_oom
from oomlens.ingest.log.bits import (
    ANCHOR_BITS,
    ANCHORS,
    OOM,
    OOM_START,
    PASTE_ANCHOR_BITS,
    PASTE_ANCHORS,
)
from oomlens.ingest.log.bulk_keys import NO_KEY, NO_TS
from oomlens.ingest.log.bulk_labels import LABEL_NONE
from oomlens.ingest.log.state import AnchorScanner

AVAILABLE = native.NATIVE
"""The bulk path is the extension's (``native``): without it every line holding an anchor takes
the per-line path."""


# The kinds of bulk line.
NONE, MEMORY, CPU, FLUSH_LINE, PROGRESS = range(5)
FORMS = ("", "deepspeed", "throughput", "hf", "tqdm", "generic", "generic_eval")
"""A progress line's form (``d & FORM_MASK``): ``StepSample.kind``; "": the line reports none."""
FORM_MASK, HAS_STEP, HAS_LOSS, HAS_EPOCH = 15, 16, 32, 64

LABEL_WINDOW = 16384
LABEL_LINES = 16
"""``LogReader.label_before``'s reach: 16 lines back, within 16 KiB."""


@dataclass(slots=True)
class BatchScan:
    """What ``scan_batch`` found in a batch; arrays in line order, indices batch-relative."""

    line_counts: list[int]
    """Lines per block (a last line without newline counts)."""
    hit_line: np.ndarray
    """int64: the lines that hold an anchor, ascending."""
    hit_bits: np.ndarray
    """int64: their kinds of line (``bits``)."""
    hit_start: np.ndarray
    """int64: where each starts in the batch."""
    kind: np.ndarray
    """int8: the bulk shape of each hit line, ``NONE`` for the per-line path."""
    key: np.ndarray
    """int64: the stream key of each bulk line (``NO_KEY``, ``N``, ``DEFAULT_ROLE + N``)."""
    prefix_id: np.ndarray
    """int64: which raw prefix text a line starts with (equal ids, equal texts): its key, its
    length, whether it ends with a space, its form (``_scan.c``'s ``shape_hits``)."""
    prefix_len: np.ndarray
    """int64: the length of that prefix in bytes (0: none)."""
    ts: np.ndarray
    """int64: the leading timestamp of a bulk line, microseconds since 1970 (``NO_TS``: none)."""
    a: np.ndarray
    """int64: memory: allocated; CPU: used; flush: count; progress: the step."""
    b: np.ndarray
    """int64: memory: max allocated; progress: total (-1: none), DeepSpeed: skipped."""
    c: np.ndarray
    """int64: memory: reserved; progress: the rank a logger record's ``[Rank N]`` tag or the
    text names (-1: none)."""
    d: np.ndarray
    """int64: memory: max reserved; progress: the form (``FORMS``) and what it holds
    (``HAS_STEP``, ``HAS_LOSS``, ``HAS_EPOCH``)."""
    f: np.ndarray
    """float64: CPU percent; progress: the loss (see ``d``)."""
    e: np.ndarray
    """int64: progress: the memory allocated a line reports (-1: none)."""
    g: np.ndarray
    """float64: progress: the epoch (see ``d``)."""
    h: np.ndarray
    """int64: progress: the max memory allocated a line reports (-1: none)."""
    label: np.ndarray
    """int32: memory lines: index in ``labels``, ``LABEL_NONE`` or ``LABEL_DEFERRED``."""
    consumed: np.ndarray
    """bool: a CPU line read ahead by the memory line just before it (same block, same raw
    prefix): the per-line path never visits it."""
    labels: list[str] = field(default_factory=list)
    progress_bars: list[bool] = field(default_factory=list)
    """Per block: whether it holds a tqdm bar's anchor (``LogReader.sample_progress_bar``)."""
    label_index: dict[str, int] | None = None
    """``labels``'s ids by text, once asked for (``label_ids``)."""
    hosts: list[str] = field(default_factory=list)
    """The pdsh hosts the keys name (``bulk_keys.HOST_ROLE``), by index."""
    host_followed: list[bool] = field(default_factory=list)
    """Per host: whether a hit line gave it before a known prefix (``strip_prefixes`` then
    remembers it in ``known_hosts``)."""


def label_ids(scan: BatchScan) -> dict[str, int]:
    """The id of each of ``scan.labels`` by its text (distinct texts: one id each), made once."""
    if scan.label_index is None or len(scan.label_index) != len(scan.labels):
        scan.label_index = {text: k for k, text in enumerate(scan.labels)}
    return scan.label_index


def _empty_scan(line_counts: list[int]) -> BatchScan:
    i8 = np.zeros(0, dtype=np.int64)
    return BatchScan(
        line_counts,
        i8,
        i8,
        i8,
        np.zeros(0, dtype=np.int8),
        i8,
        i8,
        i8,
        i8,
        i8,
        i8,
        i8,
        i8,
        np.zeros(0, dtype=np.float64),
        i8,
        np.zeros(0, dtype=np.float64),
        i8,
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=bool),
    )


class _Anchors:
    _scanner: AnchorScanner | None = None
    _paste: AnchorScanner | None = None

    @classmethod
    def hits(cls, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets and bits of every anchor in ``data``, in order."""
        if cls._scanner is None:
            cls._scanner = AnchorScanner(ANCHORS, ANCHOR_BITS)
        return cls._scanner.arrays(data)

    @classmethod
    def paste_scanner(cls) -> AnchorScanner:
        """The wider table's scanner (``bits.PASTE_ANCHORS``), made once."""
        if cls._paste is None:
            cls._paste = AnchorScanner(PASTE_ANCHORS, PASTE_ANCHOR_BITS)
        return cls._paste

    @classmethod
    def paste_hits(cls, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """The same with the wider table of inputs read line by line, and the starts of the
        lines where an OOM message begins in the paste's squeezed text (an anchor a wrap cut in
        two is found there), as ``OOM | OOM_START`` hits."""
        offsets, bits = cls.paste_scanner().arrays(data)
        text = data.decode("utf-8", "replace")
        starts = torch_oom.message_starts(text)
        if not starts:
            return offsets, bits
        newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        extra = []
        line = previous = 0
        for start in starts:  # ascending: the newlines before each, counted on from the last
            line += text.count("\n", previous, start)  # decoding keeps every newline
            previous = start
            extra.append(int(newlines[line - 1]) + 1 if line else 0)
        offsets = np.concatenate((offsets, np.asarray(extra, dtype=np.int64)))
        bits = np.concatenate((bits, np.full(len(extra), OOM | OOM_START, dtype=np.int64)))
        order = np.argsort(offsets, kind="stable")
        return offsets[order], bits[order]


_SPACES = (b"\xc2\xa0", b"\xe2\x80\xaf", b"\xe2\x80\x87", b"\xe3\x80\x80")


def paste_scanner() -> AnchorScanner:
    """The anchor scanner of the wider table of inputs read line by line, made once."""
    return _Anchors.paste_scanner()


_TERMINAL_CONTROLS = re.compile(
    rb"\x1b(?:\[[0-?]{0,32}[ -/]{0,4}[@-~]|\][^\x07\x1b\n]{0,512}(?:\x07|\x1b\\))"
)
"""ECMA-48's control sequences (CSI: colours, ``\\x1b[1;31m``) and operating system commands
(OSC: a window title, ``\\x1b]0;train\\x07``), which no line end is part of."""


def plain_spaces(data: bytes) -> bytes:
    """A paste's non-breaking and ideographic spaces as spaces, and a terminal's colour and
    title sequences removed, before the anchors are searched: a browser or a CJK input method
    puts such spaces between the words an anchor is made of, and a coloured log (``rich``,
    ``colorama``, a logger's level colours, a terminal's copy) puts a sequence between them
    (``terminated \\x1b[91mwith\\x1b[39m signal``); the line cleaner drops both from the text the
    reader reads, but the anchors are searched in the bytes."""
    for space in _SPACES:
        if space in data:
            data = data.replace(space, b" ")
    if b"\x1b" in data:
        data = _TERMINAL_CONTROLS.sub(b"", data)
    return data


def scan_batch(
    data: bytes, block_starts: list[int], prev_tail: bytes, *, paste: bool = False
) -> BatchScan:
    """Scan ``data`` (whole lines: the reader's blocks, starting at ``block_starts``, one after
    another); ``prev_tail`` is the last 16 KiB of the block before the batch (``b""`` at the
    start of the input).  See the module docstring.  ``paste``: the anchors of the wider table
    (``bits.PASTE_ANCHORS``) of inputs read line by line, and no bulk lines."""
    if native.NATIVE and AVAILABLE and not paste:
        return native.scan(data, block_starts, prev_tail)
    arr = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(arr == 10)
    size = len(data)
    ends = newlines if data.endswith(b"\n") else np.append(newlines, size)
    starts = np.concatenate(([0], newlines + 1))[: len(ends)]
    bounds = np.asarray(list(block_starts) + [size], dtype=np.int64)
    block_first = np.searchsorted(starts, bounds[:-1])
    line_counts = np.diff(np.append(block_first, len(starts))).tolist()
    scan = _empty_scan(line_counts)
    scan.progress_bars = _progress_bars(arr, bounds)
    if not len(starts):
        return scan
    _find_hits(scan, data, ends, paste)
    scan.hit_start = starts[scan.hit_line]
    return scan


_CARRIED: tuple[str, ...] = ("hit_bits", "kind", "prefix_len", "ts")
_CARRIED += ("a", "b", "c", "d", "e", "f", "g", "h")
"""The ``BatchScan`` arrays that carry over as they are when scans are put end to end."""


def merge_scans(scans: list[BatchScan], sizes: list[int]) -> BatchScan:
    """The scans of consecutive batches (of ``sizes`` bytes) as the scan of one batch holding
    them all: line numbers and offsets moved on by the batches before, label ids renumbered
    into one table of distinct texts (one text under two ids would be two labels), and host
    indices into one table of hosts (in keys and prefix ids)."""
    line_offset, byte_offset = 0, 0
    labels: list[str] = []
    ids: dict[str, int] = {}
    hosts: list[str] = []
    followed: list[bool] = []
    host_ids: dict[str, int] = {}
    hit_line, hit_start, label, key, prefix_id = [], [], [], [], []
    for scan, size in zip(scans, sizes, strict=True):
        index = []
        for text, was in zip(scan.hosts, scan.host_followed, strict=True):
            at = host_ids.get(text)
            if at is None:
                at = host_ids[text] = len(hosts)
                hosts.append(text)
                followed.append(False)
            followed[at] = followed[at] or was
            index.append(at)
        moved = np.asarray(index, dtype=np.int64)
        key.append(bulk_keys.rehost(scan.key, moved))
        # a prefix id: ((key + 2) * 512 + length * 2 + space) * 2 + form
        low, pid_key = scan.prefix_id % 1024, scan.prefix_id // 1024 - 2
        prefix_id.append((bulk_keys.rehost(pid_key, moved) + 2) * 1024 + low)
        hit_line.append(scan.hit_line + line_offset)
        hit_start.append(scan.hit_start + byte_offset)
        for text in scan.labels:
            if text not in ids:
                ids[text] = len(labels)
                labels.append(text)
        renumber = np.asarray([ids[text] for text in scan.labels] + [0], dtype=np.int32)
        own = scan.label >= 0
        label.append(np.where(own, renumber[np.where(own, scan.label, 0)], scan.label))
        line_offset += sum(scan.line_counts)
        byte_offset += size
    carried: dict[str, Any] = {
        name: np.concatenate([getattr(scan, name) for scan in scans]) for name in _CARRIED
    }
    return BatchScan(
        line_counts=[count for scan in scans for count in scan.line_counts],
        hit_line=np.concatenate(hit_line),
        hit_start=np.concatenate(hit_start),
        label=np.concatenate(label).astype(np.int32),
        consumed=np.concatenate([scan.consumed for scan in scans]),
        labels=labels,
        progress_bars=[bar for scan in scans for bar in scan.progress_bars],
        key=np.concatenate(key),
        prefix_id=np.concatenate(prefix_id),
        hosts=hosts,
        host_followed=followed,
        **carried,
    )


def _progress_bars(arr: np.ndarray, bounds: np.ndarray) -> list[bool]:
    """Per block (``bounds``: block starts, then the end), whether a tqdm anchor lies wholly in
    it (``data.find(anchor, begin, end) >= 0``).  Found from the positions of the anchor's
    rarest byte, ``/``: ``bytes.find`` took 3 ms per anchor and 4 MiB batch, a sixth of the
    scan of a sparse log."""
    found = np.zeros(len(bounds) - 1, dtype=bool)
    where: dict[int, np.ndarray] = {}
    for anchor in steps.TQDM_ANCHORS:
        key = max(anchor.find(b"/"), 0)
        if anchor[key] not in where:
            where[anchor[key]] = np.flatnonzero(arr == anchor[key])
        start = where[anchor[key]] - key
        for j, byte in enumerate(anchor):
            if not len(start):
                break
            at = start + j
            inside = (at >= 0) & (at < len(arr))
            start = start[inside & (arr[np.where(inside, at, 0)] == byte)]
        block = np.searchsorted(bounds, start, side="right") - 1
        whole = start + len(anchor) <= bounds[block + 1]
        found[block[whole]] = True
    result: list[bool] = found.tolist()
    return result


def _find_hits(scan: BatchScan, data: bytes, ends: np.ndarray, paste: bool) -> None:
    offsets, bits = (_Anchors.paste_hits if paste else _Anchors.hits)(data)
    if not len(offsets):
        return
    lines = np.searchsorted(ends, offsets)
    first = np.flatnonzero(np.concatenate(([True], lines[1:] != lines[:-1])))
    scan.hit_line = lines[first]
    scan.hit_bits = np.bitwise_or.reduceat(bits, first)
    n = len(first)
    scan.kind = np.zeros(n, dtype=np.int8)
    scan.key = np.full(n, NO_KEY, dtype=np.int64)
    scan.prefix_id = np.zeros(n, dtype=np.int64)
    scan.prefix_len = np.zeros(n, dtype=np.int64)
    scan.ts = np.full(n, NO_TS, dtype=np.int64)
    scan.a = np.zeros(n, dtype=np.int64)
    scan.b = np.full(n, -1, dtype=np.int64)
    scan.c = np.full(n, -1, dtype=np.int64)
    scan.d = np.zeros(n, dtype=np.int64)
    scan.f = np.full(n, np.nan, dtype=np.float64)
    scan.e = np.full(n, -1, dtype=np.int64)
    scan.g = np.full(n, np.nan, dtype=np.float64)
    scan.h = np.full(n, -1, dtype=np.int64)
    scan.label = np.full(n, LABEL_NONE, dtype=np.int32)
    scan.consumed = np.zeros(n, dtype=bool)
