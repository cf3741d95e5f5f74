"""The C scan (``native``, ``_scan.c``) finds the anchors the pure path finds (the same batch
scanned both ways: the corpora's logs, mixed multi-rank logs cut into blocks anywhere, lines
mutated byte by byte around every shape the extension reads), and what it reads of the lines
gives the facts the per-line path gives (the same logs read both ways)."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import reader_shapes
from oomlens.ingest.log import (
    ANCHORS,
    batches,
    bulk,
    bulk_apply,
    bulk_keys,
    bulk_labels,
    native,
    read_log,
)
from oomlens.ingest.log import reader as reader_module
from tests.ingest.log._mixed_logs import mixed_log

ROOT = Path(__file__).resolve().parents[3]

needs_extension = pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")


def _scan_both(
    data: bytes,
    starts: list[int],
    tail: bytes,
    monkeypatch: pytest.MonkeyPatch,
    pivots: bool = True,
    window: int = native.WINDOW_BYTES,
) -> tuple[bulk.BatchScan, bulk.BatchScan]:
    """The C scan's arrays (its passes ``window`` bytes of lines at a time) and the pure
    path's."""
    with monkeypatch.context() as m:
        m.setattr(native, "NATIVE", True)
        m.setattr(native, "PIVOTS", pivots)
        m.setattr(native, "WINDOW_BYTES", window)
        fast = bulk.scan_batch(data, starts, tail)
        m.setattr(native, "NATIVE", False)
        pure = bulk.scan_batch(data, starts, tail)
    return fast, pure


_FOUND = ("line_counts", "hit_line", "hit_bits", "hit_start", "progress_bars")
"""What both scans find (the pure scan finds the anchors and reads no line)."""


def _differences(fast: bulk.BatchScan, pure: bulk.BatchScan) -> list[str]:
    names = []
    for name in _FOUND:
        x, y = getattr(fast, name), getattr(pure, name)
        if isinstance(x, np.ndarray):
            same = x.dtype == y.dtype and x.shape == y.shape
            same = same and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
        else:
            same = x == y
        if not same:
            names.append(name)
    return names


def _blocks(data: bytes, rng: random.Random, size: int) -> list[int]:
    """Block starts as the reader cuts them: after a newline, about ``size`` bytes apart."""
    starts = [0]
    at = size
    while at < len(data):
        newline = data.find(b"\n", at + rng.randrange(0, max(1, size // 4)))
        if newline < 0 or newline + 1 >= len(data):
            break
        starts.append(newline + 1)
        at = newline + 1 + size
    return starts


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # the package's build compiles it (hatch_build.py): a checkout installed with a compiler
    # that reads without it would be the pure path's speed, silently
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here")
    assert native.BUILT


@needs_extension
@pytest.mark.parametrize("pivots", [True, False])
@pytest.mark.parametrize("root", ["fixtures/crash_logs", "fixtures/field_logs", "tests/assets"])
def test_corpus_logs_scan_alike(root: str, pivots: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(root)
    checked = 0
    for path in sorted((ROOT / root).rglob("*")):
        if not path.is_file() or path.suffix in (".pickle", ".gz", ".xz", ".json", ".png"):
            continue
        data = path.read_bytes()[: 4 << 20]
        if not data:
            continue
        for size in (1 << 20, rng.randrange(200, 5000)):
            starts = _blocks(data, rng, size)
            tail = data[-rng.randrange(0, 20000) :] if rng.random() < 0.5 else b""
            # the passes' windows end anywhere: a line, a few, a default window
            window = rng.choice([1, rng.randrange(50, 5000), native.WINDOW_BYTES])
            fast, pure = _scan_both(data, starts, tail, monkeypatch, pivots, window)
            assert _differences(fast, pure) == [], path
            checked += 1
    assert checked > 20


@needs_extension
@pytest.mark.parametrize("root", ["fixtures/crash_logs", "fixtures/field_logs", "tests/assets"])
def test_corpus_logs_read_to_the_same_facts_in_bulk(root: str) -> None:
    checked = 0
    for path in sorted((ROOT / root).rglob("*")):
        if path.suffix not in (".log", ".txt", ".out", ".err") or not path.is_file():
            continue
        fast, pure, _ = _facts_both(path, chunk=4096)
        assert fast == pure, path
        checked += 1
    assert checked > 20


@needs_extension
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ranks=st.sampled_from([1, 3, 8, 64]),
    size=st.sampled_from([300, 4096, 20000, 1 << 20]),
    tail=st.integers(0, 20000),
    pivots=st.booleans(),
    window=st.sampled_from([1, 200, 3000, native.WINDOW_BYTES]),
)
def test_mixed_logs_scan_alike(
    seed: int, ranks: int, size: int, tail: int, pivots: bool, window: int
) -> None:
    rng = random.Random(seed)
    data = mixed_log(seed, ranks=ranks, steps=rng.randrange(5, 60)).encode("utf-8", "replace")
    if rng.random() < 0.3:  # no newline at the end
        data = data.rstrip(b"\n")
    starts = _blocks(data, rng, size)
    previous = mixed_log(seed + 1, ranks=ranks, steps=3).encode()[-tail:] if tail else b""
    with pytest.MonkeyPatch.context() as m:
        fast, pure = _scan_both(data, starts, previous, m, pivots, window)
    assert _differences(fast, pure) == []


_SHAPES = [
    b"[rank3]:MA 3.82 GB         Max_MA 5.19 GB         CA 7.4 GB         Max_CA 7 GB \n",
    b"[rank3]:CPU Virtual Memory:  used = 4.21 GB, percent = 1.8%\n",
    b"[2026-11-30 06:00:01,407] [INFO] [utils.py:830:see_memory_usage] MA 11.76 GB         "
    b"Max_MA 11.76 GB         CA 11.77 GB         Max_CA 12 GB \n",
    b"[default0]:[2026-11-30 06:00:01,407] [INFO] [utils.py:831:see_memory_usage] CPU Virtual "
    b"Memory:  used = 12.3 GB, percent = 10.2%\n",
    b"[rank58]:[2026-11-30 06:00:01,407] [WARNING] [stage3.py:2940:step] 3 pytorch allocator "
    b"cache flushes since last step. this happens when there is high memory pressure\n",
    b"[rank4]:step 1/1000000 loss 10.5986 (1.5s)\n",
    b"rank 3 step 12 loss 2.123456789012345678 max reserved 12.5 GiB (0.81s)\n",
    b"[rank1]: [2024-01-02 03:04:05,678] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, "
    b"skipped=0, lr=[1e-05, 2.5e-06], mom=[(0.9, 0.999), (0.9, 0.999)]\n",
    b"[rank7]:after step 3\n",
    b"[default1]:after step 3[default2]:step 4 loss 1.5\n",
    b"1: [rank2]: step 5/9 loss 0.25 max reserved 1.5 GiB\n",
    b"worker-5: [rank22]: step 1/1000000 loss 10.5986 (1.5s)\n",
    b"gpu-node-01: [rank3]: MA 3.82 GB         Max_MA 5.19 GB         CA 7.4 GB         "
    b"Max_CA 7 GB \n",
    b"node7: CPU Virtual Memory:  used = 4.21 GB, percent = 1.8%\n",
    b"worker-0: 12: [2026-11-30 06:00:01,407] [WARNING] [stage3.py:2940:step] 3 pytorch allocator "
    b"cache flushes since last step. this happens when there is high memory pressure\n",
    b"[rank: 3] MA 3.82 GB         Max_MA 5.19 GB         CA 7.4 GB         Max_CA 7 GB \n",
    b"[rank: 12] Epoch 0:  0% 1/1000003 [25:04<02:36,  3.75it/s, loss=10.59, v_num=16]\n",
    b"host-a: [rank: 4] step 4 loss 1.5\n",
]
_BYTES = b"0123456789 .:[]-_,()%/\n\r\x00\x1b\xc2\xa0abMGkrnstepwoEy"


@needs_extension
@settings(max_examples=1500, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(_SHAPES) - 1), min_size=1, max_size=30),
    edits=st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.integers(0, 2),
            st.integers(0, len(_BYTES) - 1),
            st.integers(1, 45),
        ),
        max_size=12,
    ),
    pivots=st.booleans(),
    window=st.sampled_from([1, 90, native.WINDOW_BYTES]),
)
def test_mutated_shapes_scan_alike(
    picks: list[int], edits: list[tuple[int, int, int, int]], pivots: bool, window: int
) -> None:
    # bytes replaced, repeated in or deleted: a digit too many, a space too few, a date that is
    # no date, a prefix cut short, 41 spaces where 40 are the most... each shape's edges
    data = bytearray(b"".join(_SHAPES[p] for p in picks))
    for at, how, which, count in edits:
        at %= len(data) + 1
        byte = _BYTES[which : which + 1]
        if how == 0 and at < len(data):
            data[at : at + 1] = byte
        elif how == 1:
            # the byte there again (a longer number or gap), or another byte, ``count`` times
            again = data[at : at + 1] if at < len(data) and count % 2 else byte
            data[at:at] = again * count
        elif at < len(data):
            del data[at : at + count % 3 + 1]
    with pytest.MonkeyPatch.context() as m:
        fast, pure = _scan_both(bytes(data), [0], b"", m, pivots, window)
    assert _differences(fast, pure) == []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutated.log"
        path.write_bytes(bytes(data))
        read_fast, read_pure, _ = _facts_both(path, chunk=4096)
    assert read_fast == read_pure


def _facts_both(path: Path, chunk: int = 8192) -> tuple[str, str, int]:
    """The facts of ``path`` read in bulk (the C scan) and line by line (the per-line path),
    as reprs (exact for floats), and how many hits the bulk path applied in runs."""
    applied: list[int] = []
    original = bulk_apply.apply_run

    def counting(reader, scan, lo, hi, first_line, deferred):  # type: ignore[no-untyped-def]
        done = original(reader, scan, lo, hi, first_line, deferred)
        applied.append(hi - lo if done else 0)
        return done

    with pytest.MonkeyPatch.context() as m:
        m.setattr(reader_module, "LINE_BY_LINE_BYTES", 0)  # bulk whatever the size
        m.setattr(batches.bulk_apply, "apply_run", counting)
        m.setattr(native, "NATIVE", True)
        fast = repr(read_log(path, chunk_bytes=chunk))
        m.setattr(native, "NATIVE", False)
        pure = repr(read_log(path, chunk_bytes=chunk))
    return fast, pure, sum(applied)


@needs_extension
def test_a_log_reads_to_the_same_facts_either_way(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_text(mixed_log(11, ranks=16, steps=120))
    fast, pure, applied = _facts_both(path)
    assert "MemorySeries(" in fast and applied > 400 and fast == pure


@needs_extension
@pytest.mark.parametrize("density", ["dense", "sparse"])
@pytest.mark.parametrize("shape", [*reader_shapes.SHAPES, "mixed", 1, 2, 3, 4])
def test_every_frameworks_lines_read_to_the_same_facts_in_bulk(
    tmp_path: Path, shape: str | int, density: str
) -> None:
    # the bench's logs (bench/reader_shapes.py): each launcher's prefix and framework's progress
    # and memory lines, alone, mixed, and drawn at random; read in bulk, nearly every anchored
    # line is taken by the C scan, and the facts are the per-line path's
    shapes = (
        [reader_shapes.random_shape(shape)]
        if isinstance(shape, int)
        else list(reader_shapes.SHAPES.values())
        if shape == "mixed"
        else [reader_shapes.SHAPES[shape]]
    )
    path = tmp_path / "shape.log"
    reader_shapes.generate(path, 120_000, shapes, density, ranks=8)
    fast, pure, applied = _facts_both(path, chunk=16384)
    assert fast == pure
    if density == "dense" and shape != "mixed" and not isinstance(shape, int):
        assert applied > 0  # (sparse: runs shorter than batches.MIN_RUN are read line by line)


def _edge_lines() -> list[str]:
    """Every bounded part of every shape at its bound, one below and one past it."""
    numbers = ["1" * k for k in (1, 3, 4, 6, 7, 9, 10, 12, 13, 19, 20, 21)]
    numbers += ["1." + "2" * k for k in (0, 1, 6, 7, 20, 21)]
    numbers += ["1" * 9 + "." + "2" * 6, "1" * 15 + ".5", "0" * 16 + ".25", "-3", "1e5"]
    lines = []
    for n in numbers:
        for g in (0, 1, 10, 11, 40, 41):
            gap = " " * g
            lines += [
                f"MA {n} GB{gap}Max_MA 1 GB{gap}CA 1 GB{gap}Max_CA {n} GB {gap}",
                f"CPU Virtual Memory:{gap}used = {n} GB, percent = {n}%",
                f"step {n}/{n} loss {n} max reserved {n} GiB ({n}s)",
                f"rank {n} step {n} loss {n}{gap}",
                f"[rank1]:[2026-11-30 06:00:01,407] [WARNING] [stage3.py:{n}:{'a' * g}] {n} "
                "pytorch allocator cache flushes since last step.",
                f"[2024-01-02 03:04:05,678] [INFO] [logging.py:{n}:log_dist] [Rank -{n}] "
                f"step={n}, skipped={n}, lr=[{n}], mom=[({n}, 0.9)]",
            ]
    for date in ("2026-02-29", "2024-02-29", "2026-13-01", "0000-01-01", "2026-00-10"):
        for time in ("00:00:00", "23:59:59", "24:00:00", "12:60:00", "12:00:60"):
            lines.append(
                f"[rank2]:[{date} {time},999] [INFO] [utils.py:1:see_memory_usage] MA 1 GB  "
                "Max_MA 1 GB  CA 1 GB  Max_CA 1 GB"
            )
    return lines


@needs_extension
@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[rank5]:",
        "[rank5]: ",
        "[default123456]:",
        "[default1234567]:",
        "[rank: 5] ",
        "[rank: 1234567] ",
        "worker-5: [rank5]: ",
        "ip-10-0-0-1.ec2.internal: ",
        "node: [default3]:",
        "a" * 61 + "-1: ",
        "a" * 62 + "-1: ",
        "RuntimeError-1: ",
        "CUDA-Error: ",
        "python3-2: ",
    ],
)
def test_the_shapes_edges_scan_alike(prefix: str, tmp_path: Path) -> None:
    data = "".join(f"{prefix}{line}\n" for line in _edge_lines()).encode()
    fast_scan = native.scan(data, [0], b"")
    path = tmp_path / "edges.log"
    path.write_bytes(data)
    fast, pure, _ = _facts_both(path)
    assert fast == pure
    # past a prefix's bounds, or a name strip_prefixes takes for a host only once it has seen
    # it before a known prefix (or never), every line is left to the per-line path
    unkeyed = ("node: ", "a" * 62, "CUDA-", "python3")
    if not prefix.startswith(unkeyed):
        assert (fast_scan.kind != bulk.NONE).sum() > 50  # the edges are read in bulk
    assert (fast_scan.kind == bulk.NONE).sum() > 100  # ...and past them, line by line


@needs_extension
@pytest.mark.parametrize(
    ("between", "walked"),
    [
        ("{bar}", True),  # tqdm's bar, rewritten with CRs, its blocks past ASCII
        ("{bar}\r", True),
        ("{bar}\r   \r", True),
        ("[rank{other}]: \u2026 {bar}", True),  # an ellipsis right after a prefix
        ("\u2460: {bar}", True),  # a circled digit: a digit to isdigit, none to \\d
        ("\r\r", True),  # nothing before the CRs: an empty line
        ("  \r  ", False),  # every segment blank: cleaning leaves nothing
        ("\u202f[rank{other}]: x", False),  # spaces cleaning makes ASCII (textstream._NARROW)
        ("\u2007{rank}: x", False),
        ("\uff3brank{rank}\uff3d\uff1a x", False),  # full-width brackets: [rankN]: once cleaned
        ("\x1b[32m[rank{rank}]: x\x1b[0m", False),  # ANSI colours
    ],
)
def test_the_label_walk_reads_progress_bars_as_cleaning_does(
    between: str, walked: bool, tmp_path: Path
) -> None:
    # a see_memory_usage line's label is its stream's line before: the walk back to it passes
    # other streams' lines, a tqdm bar among them (the corpus's, as bench/reader_shapes makes
    # it); where cleaning only picks a CR segment or leaves symbols as they are, the scan reads
    # the walked line's stream itself, elsewhere it leaves the label to the reader
    makers = reader_shapes._Bodies().makers()
    rng = random.Random(3)
    lines = []
    for step in range(1, 40):
        for rank in range(4):
            bar = makers["tqdm_bar"](step, rank, rng)
            lines.append(f"[rank{rank}]: " + makers["script_step"](step, rank, rng))
            lines.append(between.format(bar=bar, other=(rank + 1) % 4, rank=rank))
            lines.append(f"[rank{rank}]: " + makers["memory"](step, rank, rng))
    data = ("\n".join(lines) + "\n").encode()
    scan = native.scan(data, [0], b"")
    memory = scan.kind == bulk.MEMORY
    deferred = int((scan.label[memory] == bulk_labels.LABEL_DEFERRED).sum())
    assert memory.sum() > 100 and (deferred == 0) == walked
    path = tmp_path / "bars.log"
    path.write_bytes(data)
    fast, pure, applied = _facts_both(path)
    assert fast == pure and applied > 100


def _label_lines() -> list[str]:
    """Labels at every bound of what ``Labels.id_of`` reads of them: a logger record's head
    (``deepspeed._LOGGER``: level, file, line number and function at and past their lengths),
    whitespace around, the 200-character cut, texts that are no label."""
    stamp = "[2026-11-30 06:00:01,407]"
    labels = ["after forward", "  \t after backward \x0b\x1c", "", "   ", "x" * 199, "y" * 201]
    labels += ["before Max_MA", "CPU Virtual Memory: x", "step 3: loss 1.5 (0.2s)"]
    for level in ("INFO", "A" * 10, "A" * 11, "", "info"):
        for file in ("utils.py", "f" * 120, "f" * 121, "a:b"):
            for line in ("1", "1234567", "12345678", ""):
                for func in ("see_memory_usage", "a:b", "g" * 120, "g" * 121):
                    labels.append(f"{stamp} [{level}] [{file}:{line}:{func}] before step 4")
    labels += [f"{stamp} [INFO] [utils.py:1:f]before", f"{stamp} [INFO] [utils.py:1:f]  x  "]
    labels += [f"{stamp} [INFO] [utils.py:1:f] ", f"{stamp}  [INFO] [u.py:1:f] x", f"{stamp} x"]
    return labels


@needs_extension
@pytest.mark.parametrize("prefix", ["", "[rank3]: ", "node-2: [rank1]: "])
def test_label_texts_made_in_the_scan_are_the_readers(prefix: str, tmp_path: Path) -> None:
    # the scan makes a plain label's text itself (Python makes one string per distinct text):
    # the texts, and the facts, are those of the per-line path
    memory = "MA 3.82 GB         Max_MA 5.19 GB         CA 7.4 GB         Max_CA 7 GB "
    lines = []
    for k, label in enumerate(_label_lines()):
        lines.append(prefix + label)
        if k % 3 == 0:  # the label walk: a line of another stream between
            lines.append(f"[rank{k % 7 + 10}]: step {k} loss 1.0")
        lines.append(prefix + memory)
    data = ("\n".join(lines) + "\n").encode()
    scan = native.scan(data, [0], b"")
    rows = scan.kind == bulk.MEMORY
    assert rows.sum() > 300
    texts = {scan.labels[i] for i in scan.label[rows] if i >= 0}
    assert "after forward" in texts and "x" * 199 in texts and "y" * 200 in texts
    path = tmp_path / "labels.log"
    path.write_bytes(data)
    fast, pure, applied = _facts_both(path)
    assert fast == pure and applied > 100


@needs_extension
@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(
        st.one_of(
            st.sampled_from(ANCHORS),
            st.sampled_from([a[:k] for a in ANCHORS for k in (2, 3)]),
            st.binary(max_size=6),
        ),
        max_size=40,
    )
)
def test_anchors_overlapping_and_cut_are_found_alike(words: list[bytes]) -> None:
    # anchors run together, inside one another, cut short, across 16-byte lanes: the pivots,
    # the hash filter and Aho-Corasick take the same leftmost-first matches
    data = b"".join(words)
    with pytest.MonkeyPatch.context() as m:
        one, pure = _scan_both(data, [0], b"", m, True)
        other, _ = _scan_both(data, [0], b"", m, False)
    assert _differences(one, pure) == [] and _differences(other, pure) == []


_NO_NEWLINE = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b" "))


@needs_extension
@settings(max_examples=150, deadline=None)
@given(
    heads=st.lists(_NO_NEWLINE, min_size=1, max_size=4),
    words=st.lists(
        st.one_of(
            st.sampled_from(ANCHORS),
            st.sampled_from([a[:k] for a in ANCHORS for k in (2, 5)]),
            _NO_NEWLINE,
            st.just(b"x" * 120),
        ),
        min_size=1,
        max_size=30,
    ),
    changes=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 10**6), st.integers(1, 127))),
    window=st.sampled_from([1, 700, native.WINDOW_BYTES]),
)
def test_long_tails_seen_before_are_found_alike(
    heads: list[bytes],
    words: list[bytes],
    changes: list[tuple[int, int, int]],
    window: int,
) -> None:
    # the pivot search takes the occurrences in a line's tail from the last tail of the same
    # anchor with the same bytes (the memo): lines that share a long tail after an anchor,
    # behind different heads, some with a byte changed, give what the pure path and the hash
    # filter find
    tail = b"".join(words)
    lines = [bytearray(heads[i % len(heads)] + ANCHORS[i % 3] + tail + b"\n") for i in range(200)]
    for line, at, byte in changes:
        target = lines[line % len(lines)]
        if len(target) > 1 and byte != 10:
            target[at % (len(target) - 1)] = byte
    data = b"".join(lines)
    with pytest.MonkeyPatch.context() as m:
        memo, pure = _scan_both(data, [0], b"", m, True, window)
        hashed, _ = _scan_both(data, [0], b"", m, False, window)
    assert _differences(memo, pure) == [] and _differences(hashed, pure) == []


@needs_extension
@pytest.mark.parametrize("seed", range(6))
def test_the_fuzzers_mutated_logs_scan_alike(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fuzz campaigns' own mutations of the corpus's logs (lines dropped, repeated,
    # shuffled, hostile bytes planted, cut), a batch cut into blocks anywhere
    from tests.fuzz import mutate, seeds

    rng = random.Random(seed)
    logs = seeds.logs()
    for _ in range(20):
        data, other = (rng.choice(logs).read_bytes() for _ in range(2))
        if rng.random() < 0.6:
            data = mutate.mutate_lines(data, rng, other)
        else:
            data = mutate.mutate_bytes(data, rng, other)
        data = data[: 4 << 20]
        starts = _blocks(data, rng, rng.choice([300, 4096, 1 << 20]))
        tail = other[-rng.randrange(1, 20000) :] if rng.random() < 0.5 else b""
        window = rng.choice([1, rng.randrange(100, 10000), native.WINDOW_BYTES])
        fast, pure = _scan_both(data, starts, tail, monkeypatch, rng.random() < 0.5, window)
        assert _differences(fast, pure) == []


@needs_extension
def test_the_extension_shares_the_readers_constants() -> None:
    # _scan.c writes the constants of bulk.py, bulk_keys.py and bits.py again: no drifting apart
    from oomlens.ingest.log import _scan, bits
    from oomlens.ingest.textstream import MAX_LINE_BYTES

    python = {
        "MEMORY": bulk.MEMORY,
        "CPU": bulk.CPU,
        "FLUSH_LINE": bulk.FLUSH_LINE,
        "PROGRESS": bulk.PROGRESS,
        "TASK_ROLE": bulk_keys.TASK_ROLE,
        "NO_KEY": bulk_keys.NO_KEY,
        "UNSURE": bulk_keys.UNSURE,
        "DEFAULT_ROLE": bulk_keys.DEFAULT_ROLE,
        "LABEL_WINDOW": bulk.LABEL_WINDOW,
        "LABEL_LINES": bulk.LABEL_LINES,
        "MAX_LINE_BYTES": MAX_LINE_BYTES,
        "DS_MEMORY": bits.DS_MEMORY,
        "DS_CPU": bits.DS_CPU,
        "FLUSH": bits.FLUSH,
        "STEP": bits.STEP,
        "HEAD": bulk_keys.HEAD,
        "HOST_ROLE": bulk_keys.HOST_ROLE,
        "MAX_HOSTS": bulk_keys.MAX_HOSTS,
    }
    assert {name: getattr(_scan, name) for name in python} == python


@needs_extension
@pytest.mark.parametrize("expected", [0, 1, 10**6])
def test_the_room_made_for_hits_changes_nothing(expected: int) -> None:
    # the extension makes room for the hits the last batch suggests and grows it as need be:
    # too little (copies), too much (memory), the same arrays
    from oomlens.ingest.log import _scan, steps

    data = mixed_log(5, ranks=8, steps=40).encode()
    starts = np.asarray(_blocks(data, random.Random(5), 3000), dtype=np.int64).tobytes()
    args = (data, starts, 0, native._anchor_table(), steps.TQDM_ANCHORS, True)
    plain = _scan.scan(*args, -1, 700)
    hinted = _scan.scan(*args, expected, 700)
    assert len(plain[1]) > 8 * 100 and hinted == plain


def _label_key(text: bytes) -> tuple[bool, bytes]:
    stamped = bulk_labels.STAMPED.match(text) is not None
    return stamped, text[26:] if stamped else text


@needs_extension
@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(
        st.sampled_from(
            [
                b"after step 1",
                b"after step 12",
                b"[2026-11-30 06:00:01,407] [INFO] after step 1",
                b"[2026-11-30 06:00:02,999] [INFO] after step 1",
                b"[2026-11-30 06:00:0x,999] [INFO] after step 1",
                b"[INFO] after step 1",
                b"",
                b"\xc2\xa0after",
            ]
        ),
        max_size=60,
    )
)
def test_label_keys_group_texts_as_the_labels_cache_does(texts: list[bytes]) -> None:
    # Labels.id_of keys its cache on the text less a logger record's timestamp (stamped and
    # plain texts apart): the extension groups the texts the same way, keys numbered as they
    # first occur
    from oomlens.ingest.log import _scan

    data = b"|".join(texts)
    begins, at = [], 0
    for text in texts:
        begins.append(at)
        at += len(text) + 1
    ends = [b + len(t) for b, t in zip(begins, texts, strict=True)]
    firsts, inverse = _scan.label_keys(
        data, np.asarray(begins, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    )
    numbers: dict[tuple[bool, bytes], int] = {}
    expected = [numbers.setdefault(_label_key(t), len(numbers)) for t in texts]
    first_rows = [expected.index(k) for k in range(len(numbers))]
    assert np.frombuffer(inverse, dtype=np.int64).tolist() == expected
    assert np.frombuffer(firsts, dtype=np.int64).tolist() == first_rows


@needs_extension
def test_label_keys_refuse_texts_outside_the_data() -> None:
    from oomlens.ingest.log import _scan

    one = np.asarray([0], dtype=np.int64)
    with pytest.raises(ValueError, match="outside"):
        _scan.label_keys(b"abc", one, np.asarray([4], dtype=np.int64))
    with pytest.raises(ValueError, match="one end per begin"):
        _scan.label_keys(b"abc", one, np.asarray([1, 2], dtype=np.int64))
