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

import importlib.util
from dataclasses import dataclass, field

import numpy as np

from oomlens.ingest.log import bulk_arrow, native, steps, torch_oom
from oomlens.ingest.log.bits import (
    ANCHOR_BITS,
    ANCHORS,
    DS_CPU,
    DS_MEMORY,
    FLUSH,
    OOM,
    OOM_START,
    PASTE_ANCHOR_BITS,
    PASTE_ANCHORS,
    STEP,
)
from oomlens.ingest.log.bulk_arrow import (
    NO_TS,
    arrow_indices,
    floats,
    gib,
    ints,
    numpy_bools,
    timestamps,
)
from oomlens.ingest.log.bulk_keys import HEAD, NO_KEY, OPENS, UNSURE, byte_at, heads, line_keys
from oomlens.ingest.log.bulk_labels import LABEL_DEFERRED, LABEL_NONE, Labels
from oomlens.ingest.log.state import AnchorScanner
from oomlens.ingest.textstream import MAX_LINE_BYTES

AVAILABLE = native.NATIVE or importlib.util.find_spec("pyarrow") is not None
"""The bulk path needs the extension (``native``) or pyarrow (without both every line takes the
per-line path)."""


# The kinds of bulk line.
NONE, MEMORY, CPU, FLUSH_LINE, STEP_GENERIC, STEP_DS = range(6)
KIND_BITS = {MEMORY: DS_MEMORY, CPU: DS_CPU, FLUSH_LINE: FLUSH, STEP_GENERIC: STEP, STEP_DS: STEP}

LABEL_WINDOW = 16384
LABEL_LINES = 16
"""``LogReader.label_before``'s reach: 16 lines back, within 16 KiB."""

_PREFIXED = r"^\[(?:rank|default)\d{1,6}\]: ?"
_PLAIN = r"^"
_NUM = r"\d{1,9}(?:\.\d{1,6})?"
_TS = r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d\d\d)\] "
_MEMORY_LOGGER = _TS + r"\[INFO\] \[utils\.py:\d{1,7}:see_memory_usage\] "
_BODIES: dict[int, tuple[str | None, str | None]] = {
    MEMORY: (
        rf"MA (?P<a>{_NUM}) GB {{1,40}}Max_MA (?P<b>{_NUM}) GB {{1,40}}CA (?P<c>{_NUM}) GB "
        rf"{{1,40}}Max_CA (?P<d>{_NUM}) GB *\n?$",
        _MEMORY_LOGGER,
    ),
    CPU: (
        rf"CPU Virtual Memory: {{1,10}}used = (?P<a>{_NUM}) GB, percent = "
        rf"(?P<f>\d{{1,3}}(?:\.\d{{1,6}})?)% *\n?$",
        _MEMORY_LOGGER,
    ),
    FLUSH_LINE: (
        None,
        _TS + r"\[WARNING\] \[stage3\.py:\d{1,7}:[A-Za-z_]{1,40}\] (?P<a>\d{1,12}) pytorch "
        r"allocator cache flushes since last step\.",
    ),
    STEP_GENERIC: (
        rf"(?:rank (?P<c>\d{{1,6}}) )?step (?P<a>\d{{1,12}})(?:/(?P<b>\d{{1,12}}))? loss "
        rf"(?P<f>\d{{1,20}}(?:\.\d{{1,20}})?)(?: (?:max reserved {_NUM} GiB(?: \({_NUM}s\))?|"
        rf"\({_NUM}s\)))?\n?$",
        None,
    ),
    STEP_DS: (
        None,
        _TS + r"\[INFO\] \[logging\.py:\d{1,7}:log_dist\] \[Rank (?P<c>-?\d{1,6})\] "
        r"step=(?P<a>\d{1,12}), skipped=(?P<b>\d{1,12}), lr=\[[-0-9.eE+, ]*\], "
        r"mom=\[[-0-9.eE+, ()]*\]\n?$",
    ),
}
"""Each shape as printed (see ``deepspeed``, ``steps``): the text after the line's prefix, as a
plain ``print`` (first) and as a logger record (second, which the logger's timestamp starts).
What the per-line parsers accept beyond these (other spacing, other wordings) goes the
per-line way.  The cache-flush pattern ends with the sentence the count is in: what follows
(DeepSpeed's advice, 400 bytes) is read by nothing but the glued-prefix split and cleaning, and
``_Lines`` keeps lines with a glued ``[rankN]:``, a control character or a byte past ASCII out
of the bulk path.  Every pattern is one-pass (at each byte, one way on): RE2 extracts
from those an order of magnitude faster than from ambiguous ones (measured: the flush line
10.7 microseconds a line with a trailing `` *`` after its free text, well under one without)."""


def shape(kind: int, prefixed: bool, logger: bool) -> str | None:
    """The pattern for lines of ``kind`` with or without a ``[rankN]:`` prefix, printed or
    logged; None when the kind has no such form."""
    body = _BODIES[kind][1 if logger else 0]
    if body is None:
        return None
    if logger and kind in (MEMORY, CPU):
        body = body + str(_BODIES[kind][0])
    return (_PREFIXED if prefixed else _PLAIN) + body


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
    """int64: which raw prefix text a line starts with (equal ids, equal texts)."""
    prefix_len: np.ndarray
    """int64: the length of that prefix in bytes (0: none)."""
    ts: np.ndarray
    """int64: the leading timestamp of a bulk line, microseconds since 1970 (``NO_TS``: none)."""
    a: np.ndarray
    """int64: memory: allocated; CPU: used; flush: count; steps: the step."""
    b: np.ndarray
    """int64: memory: max allocated; step: total (-1: none), DeepSpeed: skipped."""
    c: np.ndarray
    """int64: memory: reserved; step: the rank the text names (-1: none)."""
    d: np.ndarray
    """int64: memory: max reserved."""
    f: np.ndarray
    """float64: CPU percent; step: the loss (NaN: none)."""
    label: np.ndarray
    """int32: memory lines: index in ``labels``, ``LABEL_NONE`` or ``LABEL_DEFERRED``."""
    consumed: np.ndarray
    """bool: a CPU line read ahead by the memory line just before it (same block, same raw
    prefix): the per-line path never visits it."""
    labels: list[str] = field(default_factory=list)
    progress_bars: list[bool] = field(default_factory=list)
    """Per block: whether it holds a tqdm bar's anchor (``LogReader.sample_progress_bar``)."""


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


def plain_spaces(data: bytes) -> bytes:
    """A paste's non-breaking and ideographic spaces as spaces, before the anchors are searched:
    a browser or a CJK input method puts them between the words an anchor is made of."""
    for space in _SPACES:
        if space in data:
            data = data.replace(space, b" ")
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
    if AVAILABLE and len(scan.hit_line) and not paste and bulk_arrow.load():
        lines = _Lines(data, arr, starts, ends, bounds, block_first)
        _shapes(scan, lines)
        _consumed_cpu(scan, lines)
        _labels(scan, lines, prev_tail)
    return scan


_CARRIED = ("hit_bits", "kind", "key", "prefix_id", "prefix_len", "ts", "a", "b", "c", "d", "f")
"""The ``BatchScan`` arrays that carry over as they are when scans are put end to end."""


def merge_scans(scans: list[BatchScan], sizes: list[int]) -> BatchScan:
    """The scans of consecutive batches (of ``sizes`` bytes) as the scan of one batch holding
    them all: line numbers and offsets moved on by the batches before, label ids renumbered
    into one table of distinct texts (one text under two ids would be two labels)."""
    line_offset, byte_offset = 0, 0
    labels: list[str] = []
    ids: dict[str, int] = {}
    hit_line, hit_start, label = [], [], []
    for scan, size in zip(scans, sizes, strict=True):
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
    carried = {name: np.concatenate([getattr(scan, name) for scan in scans]) for name in _CARRIED}
    return BatchScan(
        line_counts=[count for scan in scans for count in scan.line_counts],
        hit_line=np.concatenate(hit_line),
        hit_start=np.concatenate(hit_start),
        label=np.concatenate(label).astype(np.int32),
        consumed=np.concatenate([scan.consumed for scan in scans]),
        labels=labels,
        progress_bars=[bar for scan in scans for bar in scan.progress_bars],
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
    scan.label = np.full(n, LABEL_NONE, dtype=np.int32)
    scan.consumed = np.zeros(n, dtype=bool)


@dataclass(slots=True)
class _Lines:
    """A batch's bytes and line index, and what the scan derives from them on demand."""

    data: bytes
    arr: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    bounds: np.ndarray
    """Block starts, then the batch's size."""
    block_first: np.ndarray
    """The first line of each block."""
    window: np.ndarray = field(init=False)
    """Every ``HEAD`` bytes from every offset (a view over the batch and a newline padding)."""
    dirty: np.ndarray = field(init=False)
    """Lines that cleaning would change (CR, NUL, ESC): never bulk, their key never sure."""
    array: bulk_arrow.pa.Array = field(init=False)
    """The lines (with their newline) as an Arrow binary array over ``data``, no copy."""

    def __post_init__(self) -> None:
        padded = np.frombuffer(self.data + b"\n" * HEAD, dtype=np.uint8)
        self.window = np.lib.stride_tricks.sliding_window_view(padded, HEAD)
        self.dirty = np.zeros(len(self.starts), dtype=bool)
        controls = _controls(self.data)
        if len(controls):
            self.dirty[np.searchsorted(self.ends, controls)] = True
        if not self.data.isascii():
            self.dirty[np.searchsorted(self.ends, np.flatnonzero(self.arr >= 128))] = True
        glued = _glued(self.arr)
        if len(glued):
            # a "[rank"/"[default" past a line's start (a prefix after the first one, or one
            # glued on by interleaved writes): the per-line path splits or re-reads those
            self.dirty[np.searchsorted(self.ends, glued)] = True
        offsets = np.concatenate((self.starts, [len(self.data)])).astype(np.int32)
        pa = bulk_arrow.pa
        self.array = pa.Array.from_buffers(
            pa.binary(), len(self.starts), [None, pa.py_buffer(offsets), pa.py_buffer(self.data)]
        )

    def block_of(self, line: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.block_first, line, side="right") - 1


def _glued(arr: np.ndarray) -> np.ndarray:
    """Offsets of ``[rank`` and ``[default`` in the batch past a line's start (not its first
    byte, not right after a newline), ascending.  The candidates narrow byte by byte, line
    starts out after the second (4 MiB batches, comparing every byte at every ``[``: 7 ms;
    this way 3 ms dense, 4 ms sparse)."""
    opens = np.flatnonzero(arr == 91)
    last = len(arr) - 1
    second = arr[np.minimum(opens + 1, last)]
    found = []
    for word in (b"[rank", b"[default"):
        candidates = opens[second == word[1]]
        candidates = candidates[(candidates > 0) & (arr[np.maximum(candidates - 1, 0)] != 10)]
        for j, byte in enumerate(word[2:], start=2):
            candidates = candidates[arr[np.minimum(candidates + j, last)] == byte]
        found.append(candidates)
    return np.sort(np.concatenate(found))


def _controls(data: bytes) -> np.ndarray:
    """Offsets of the bytes that make ``LineCleaner.clean`` change a line: CR, NUL, ESC."""
    found: list[int] = []
    for byte in (b"\r", b"\x00", b"\x1b"):
        at = data.find(byte)
        while at >= 0 and len(found) < 1 << 22:
            found.append(at)
            at = data.find(byte, at + 1)
    return np.asarray(sorted(found), dtype=np.int64)


def _shapes(scan: BatchScan, lines: _Lines) -> None:
    """Read the bulk shapes: for each kind, the hit lines holding its anchors and no other,
    with a stream key the prefix rules are sure of, routed by prefix and form to a one-pass
    pattern of at most four groups (RE2 extracts from those in its one-pass engine)."""
    head = heads(lines.window, lines.starts[scan.hit_line])
    keys, prefix_len = line_keys(head)
    logger = byte_at(head, prefix_len) == 91
    space = byte_at(head, np.maximum(prefix_len - 1, 0)) == 32
    scan.key = keys
    scan.prefix_id = ((keys + 2) * 64 + prefix_len * 2 + (space & (prefix_len > 0))).astype(
        np.int64
    )
    scan.prefix_len = prefix_len
    clean = ~lines.dirty[scan.hit_line] & (keys != UNSURE)
    for kind, wanted in KIND_BITS.items():
        of_kind = clean & (scan.hit_bits == wanted)
        for prefixed in (True, False):
            for as_logger in (False, True):
                pattern = shape(kind, prefixed, as_logger)
                if pattern is None:
                    continue
                chosen = np.flatnonzero(
                    of_kind & ((prefix_len > 0) == prefixed) & (logger == as_logger)
                )
                if len(chosen):
                    _extract(scan, lines, kind, pattern, chosen)


def _extract(scan: BatchScan, lines: _Lines, kind: int, pattern: str, chosen: np.ndarray) -> None:
    pc = bulk_arrow.pc
    table = pc.extract_regex(pc.take(lines.array, arrow_indices(scan.hit_line[chosen])), pattern)
    matched = numpy_bools(table.is_valid())
    if not matched.any():
        return
    if not matched.all():
        kept = np.flatnonzero(matched)
        chosen, table = chosen[kept], table.take(arrow_indices(kept))
    names = {f.name for f in table.type}
    valid = np.ones(len(chosen), dtype=bool)
    if "ts" in names:
        micros, good = timestamps(table, "ts")
        scan.ts[chosen] = micros
        valid &= good
    if kind in (MEMORY, CPU):
        scan.a[chosen] = gib(floats(table, "a"))
    else:
        scan.a[chosen] = ints(table, "a")
    if kind == MEMORY:
        scan.b[chosen] = gib(floats(table, "b"))
        scan.c[chosen] = gib(floats(table, "c"))
        scan.d[chosen] = gib(floats(table, "d"))
    elif kind in (STEP_GENERIC, STEP_DS):
        scan.b[chosen] = ints(table, "b")
        scan.c[chosen] = ints(table, "c")
    if kind in (CPU, STEP_GENERIC):
        scan.f[chosen] = floats(table, "f")
    scan.kind[chosen[valid]] = kind


def _consumed_cpu(scan: BatchScan, lines: _Lines) -> None:
    """``LogReader.cpu_line_after``: a line right after a memory line, in the same block, that
    starts with the memory line's raw prefix and ``CPU Virtual Memory`` is read with it.  When
    that line is a bulk CPU line of the print form, the scan pairs them; when it is a line the
    scan cannot read, the memory line goes the per-line way too."""
    memory = np.flatnonzero(scan.kind == MEMORY)
    if not len(memory):
        return
    line = scan.hit_line[memory]
    nxt = np.minimum(memory + 1, len(scan.hit_line) - 1)
    adjacent = (memory + 1 < len(scan.hit_line)) & (scan.hit_line[nxt] == line + 1)
    same_block = lines.block_of(line + 1) == lines.block_of(line)
    cpu_like = adjacent & same_block & (scan.hit_bits[nxt] & DS_CPU != 0)
    bulk_cpu = (scan.kind[nxt] == CPU) & (scan.ts[nxt] == NO_TS)
    # A print-form bulk CPU line is its prefix and then the anchor, and both lines' prefixes
    # are the longest prefix match: it starts with the memory line's prefix and the anchor
    # exactly when the prefixes are the same text.
    paired = cpu_like & bulk_cpu & (scan.prefix_id[nxt] == scan.prefix_id[memory])
    scan.consumed[nxt[paired]] = True
    data, starts = lines.data, lines.starts
    for k in np.flatnonzero(cpu_like & (scan.kind[nxt] != CPU)).tolist():
        begin = int(starts[line[k]])
        prefix = data[begin : begin + int(scan.prefix_len[memory[k]])]
        if data.startswith(prefix + b"CPU Virtual Memory", int(starts[line[k] + 1])):
            scan.kind[memory[k]] = NONE


def _labels(scan: BatchScan, lines: _Lines, prev_tail: bytes) -> None:
    """``LogReader.label_before`` for every bulk memory line: the previous line when it starts
    with the same raw prefix (not followed by ``[`` or ``(``), else the nearest of the 16 lines
    before within the 16 KiB window whose stream key is the same."""
    memory = np.flatnonzero(scan.kind == MEMORY)
    if not len(memory):
        return
    arr, starts = lines.arr, lines.starts
    line = scan.hit_line[memory]
    begin = starts[line]
    block = lines.block_of(line)
    block_start = lines.bounds[block]
    relative = begin - block_start
    prefix_len = scan.prefix_len[memory]
    texts = Labels()
    result = np.full(len(memory), LABEL_DEFERRED, dtype=np.int64)
    # 1. The line just before, with the same raw prefix, not followed by [ or (.
    prev_start = starts[np.maximum(line - 1, 0)]
    same = relative > 0
    last = len(arr) - 1
    for j in range(int(prefix_len.max(initial=0))):
        inside = j < prefix_len
        here = arr[np.minimum(begin + j, last)]
        there = arr[np.minimum(prev_start + j, last)]
        same &= ~inside | ((prev_start + j < begin) & (here == there))
    fast = same & ~OPENS[arr[np.minimum(prev_start + prefix_len, last)]]
    chosen = np.flatnonzero(fast)
    result[chosen] = texts.ids_of(arr, prev_start[chosen] + prefix_len[chosen], begin[chosen] - 1)
    # 2. The walk back over the stream keys of the lines before.
    walk = np.flatnonzero(~fast)
    if len(walk):
        _walk(
            scan, lines, memory[walk], result, walk, relative[walk], block[walk], prev_tail, texts
        )
    scan.label[memory] = result
    scan.labels = texts.texts


def _walk(
    scan: BatchScan,
    lines: _Lines,
    memory: np.ndarray,
    result: np.ndarray,
    where: np.ndarray,
    relative: np.ndarray,
    block: np.ndarray,
    prev_tail: bytes,
    texts: Labels,
) -> None:
    starts, ends = lines.starts, lines.ends
    line = scan.hit_line[memory]
    begin = starts[line]
    block_start = lines.bounds[block]
    # The window: 16 KiB back, or the previous block's last 16 KiB and this block's start.
    before = np.where(block > 0, lines.bounds[np.maximum(block - 1, 0)], -len(prev_tail))
    window = np.where(
        relative >= LABEL_WINDOW,
        begin - LABEL_WINDOW,
        np.maximum(before, block_start - LABEL_WINDOW),
    )
    lo = max(0, int(line.min()) - LABEL_LINES)
    hi = int(line.max()) + 1  # (the memory lines themselves: never a step back, but never empty)
    keys, prefix = _keys_between(scan, lines, lo, hi)
    keys[lines.dirty[lo:hi]] = UNSURE
    keys[(ends[lo:hi] - starts[lo:hi]) > MAX_LINE_BYTES] = UNSURE
    own = scan.key[memory]
    steps = line[:, None] - np.arange(1, LABEL_LINES + 1)[None, :]
    inside = steps >= lo
    candidate = np.maximum(steps, 0)
    complete = inside & (starts[candidate] >= window[:, None])
    found = np.where(complete, keys[np.clip(steps - lo, 0, len(keys) - 1)], UNSURE - 1)
    # The first line that decides: the same key (label), an unsure key (deferred), or the
    # window's start (a cut line: deferred; exactly a line start: None).
    match = complete & (found == own[:, None])
    stop = match | (complete & (found == UNSURE)) | ~complete
    first = np.argmax(stop, axis=1)
    any_stop = stop.any(axis=1)
    rows = np.arange(len(memory))
    chosen = candidate[rows, first]
    matched = any_stop & match[rows, first]
    outside = any_stop & ~complete[rows, first]
    # the window starts exactly where the last complete line starts: the walk ends there
    after_edge = np.where(first > 0, starts[candidate[rows, np.maximum(first - 1, 0)]], begin)
    at_start = outside & (window >= 0) & (after_edge == window)
    result[where[~any_stop]] = LABEL_NONE
    result[where[at_start]] = LABEL_NONE
    rows = np.flatnonzero(matched)
    target = chosen[rows]
    cut = starts[target] + prefix[target - lo]
    result[where[rows]] = texts.ids_of(lines.arr, cut, ends[target])


def _keys_between(
    scan: BatchScan, lines: _Lines, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """``line_keys`` of lines ``lo..hi``: those of the hit lines as ``_shapes`` found them,
    the others' read now (in a dense log most lines are hits: reading them again cost the walk
    a tenth of the scan)."""
    first, last = np.searchsorted(scan.hit_line, [lo, hi])
    hits = scan.hit_line[first:last] - lo
    keys = np.empty(hi - lo, dtype=np.int64)
    prefix = np.empty(hi - lo, dtype=np.int64)
    keys[hits] = scan.key[first:last]
    prefix[hits] = scan.prefix_len[first:last]
    others = np.ones(hi - lo, dtype=bool)
    others[hits] = False
    rows = np.flatnonzero(others)
    if len(rows):
        keys[rows], prefix[rows] = line_keys(heads(lines.window, lines.starts[lo + rows]))
    return keys, prefix
