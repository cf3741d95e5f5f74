"""The log reader's bulk path (issue 15) gives the facts of its per-line path, whatever the
batches, the blocks and the number of scanning processes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from oomlens.ingest.log.prefixes import strip_prefixes
from oomlens.ingest.log.series import RunningStats, Thinned
from tests.ingest.log._mixed_logs import _sources, mixed_log


def _per_line(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: object):  # type: ignore[no-untyped-def]
    with monkeypatch.context() as m:
        m.setattr(bulk, "AVAILABLE", False)
        return read_log(path, **kwargs)  # type: ignore[arg-type]


def _same(a: object, b: object) -> bool:
    """Equal facts; compared by repr, which is exact for floats and equal for NaN losses."""
    return repr(a) == repr(b)


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the lines applied in runs (the bulk path really at work)."""
    applied: list[int] = []
    original = bulk_apply.apply_run

    def counting(reader, scan, lo, hi, first_line, deferred):  # type: ignore[no-untyped-def]
        done = original(reader, scan, lo, hi, first_line, deferred)
        if done:
            applied.append(hi - lo)
        return done

    monkeypatch.setattr(batches.bulk_apply, "apply_run", counting)
    return applied


_FIXTURES = [HealthCheck.function_scoped_fixture]


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURES)
@given(
    seed=st.integers(0, 2**32 - 1),
    chunk=st.sampled_from([4096, 5000, 16384, 1 << 20]),
    ranks=st.sampled_from([1, 3, 8, 64]),
)
def test_bulk_and_per_line_paths_give_the_same_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, chunk: int, ranks: int
) -> None:
    # small blocks cut tracebacks, config dumps and memory blocks at block and batch ends
    path = tmp_path / f"mixed{seed}.log"
    path.write_text(mixed_log(seed, ranks=ranks, steps=random.Random(seed).randrange(5, 60)))
    fast = read_log(path, chunk_bytes=chunk)
    slow = _per_line(path, monkeypatch, chunk_bytes=chunk)
    assert _same(fast, slow)


def test_the_bulk_path_takes_the_dense_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dense.log"
    path.write_text(mixed_log(7, ranks=16, steps=200, odd=0.0))
    runs = _runs(monkeypatch)
    facts = read_log(path)
    memory_lines = sum(series.total_samples for series in facts.memory)
    assert memory_lines == 16 * 200 or facts.steps.total == 16 * 200
    # every line holding an anchor (all but the labels) is applied in runs, none read alone,
    # but in the input's last LINE_BY_LINE_BYTES, read line by line (``batches._read_final``)
    data = path.read_bytes()
    cut = data.find(b"\n", len(data) - reader_module.LINE_BY_LINE_BYTES - 1) + 1
    anchored = sum(1 for line in data[:cut].split(b"\n") if any(a in line for a in ANCHORS))
    assert anchored > 5000 and sum(runs) == anchored
    assert _same(facts, _per_line(path, monkeypatch))


@settings(max_examples=6, deadline=None, suppress_health_check=_FIXTURES)
@given(seed=st.integers(0, 2**32 - 1), chunk=st.sampled_from([4096, 6000, 65536]))
def test_parallel_scan_gives_the_facts_of_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, chunk: int
) -> None:
    path = tmp_path / f"par{seed}.log"
    path.write_text(mixed_log(seed, ranks=8, steps=80))
    one = read_log(path, chunk_bytes=chunk)
    # batches of one block each: the work spreads over both workers, results merge in order
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    monkeypatch.setattr(batches, "PARALLEL_MIN_BYTES", 0)
    two = read_log(path, chunk_bytes=chunk, jobs=2)
    assert _same(one, two)
    assert _same(one, _per_line(path, monkeypatch, chunk_bytes=chunk))


def test_compressed_log_reads_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    text = mixed_log(11, ranks=8, steps=60)
    plain = tmp_path / "run.log"
    plain.write_text(text)
    packed = tmp_path / "run.log.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    monkeypatch.setattr(batches, "PARALLEL_MIN_BYTES", 0)
    a, b = read_log(plain, jobs=2), read_log(packed, jobs=2)
    facts = repr((a.memory, a.steps, a.cache_flushes, a.oom_events))
    packed_facts = repr((b.memory, b.steps, b.cache_flushes, b.oom_events))
    assert facts == packed_facts.replace(str(packed), str(plain))


# --- the scan's parts against the per-line functions they mirror ------------------------------


_PREFIXES = [
    "",
    "[rank3]:",
    "[rank3]: ",
    "[rank12]:",
    "[default0]:",
    "[default0]:[rank0]:",
    "[rank1234567]:",
    "node-1: ",
    "gpu: ",
    "3: ",
    "  12: ",
    "[1,0]<stderr>:",
    "(RayWorker pid=123) ",
    "stderr: ",
    "[worker2]:",
    "［rank1］：",
    "\u00a0",
    "[rank: 1] ",
    "[rank: 12]",
    "(after 2 iterations) ",
    "worker-5: [rank: 2] ",
    "ip-10-1-2-3.ec2.internal: ",
    "a1: 3: ",
    "torch.OutOfMemoryError-2: ",
    "Python3-node: ",
    "run.sh-1: ",
    "[RANK 0] ",
    "[Rank 2] ",
    "    7: ",
    "123456: ",
    "[E1201 10:23:29.645000 1216 api.py:986] ",
    "[trainer_-x3]:",
]


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from(_PREFIXES),
    second=st.sampled_from(_PREFIXES),
    rest=st.sampled_from(
        [
            "after step 3",
            "MA 1.0 GB",
            "[2026-11-30 05:00:00,123] [INFO] x",
            "[2026 x",
            "(pid=3) x",
            "(after 10 iterations) memory (MB) | allocated: 1.0",
            "(Worker rank=1, pid=2) y",
            "(Worker_1.a-b pid=2) y",
            "(a b pid=1) x",
            "(rank=4) x",
            "(\u2113 pid=1) x",
            "(a\u2113 pid=1) x",
            "host-9: y",
            "Error: x",
            "12: y",
            "",
            "[INFO] x",
            "[[x",
            "\x1b[0mx",
            "a\rb",
            "x: y",
            "CPU Virtual Memory:  used = 1 GB, percent = 1%",
        ]
    ),
)
@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
def test_scan_keys_agree_with_the_prefix_parser(prefix: str, second: str, rest: str) -> None:
    # the extension's stream key of a line (one holding an anchor, far past its head) is the
    # per-line prefix parser's, or the scan says it is not sure
    text = prefix + second + rest
    raw = text.encode()
    if b"\r" in raw or b"\x1b" in raw or b"\n" in raw:
        return  # the scan never trusts those lines (dirty), cleaning rewrites them
    scan = native.scan(raw + b" " * 40 + b"Max_MA \n", [0], b"")
    key = int(scan.key[0])
    if key == bulk_keys.UNSURE:
        return
    cleaned_rest, found = strip_prefixes(text + " " * 40 + "Max_MA ", None)
    assert bulk_apply.stream_key(key, scan.hosts) == found.key
    assert len(text) + 47 - len(cleaned_rest) == int(scan.prefix_len[0])


def test_a_tail_handed_as_a_sequence_is_read_only_where_kept() -> None:
    # runs of 400 items, 24k in all: each run's last 32 are the tail until the next run
    # pushes them out, when only every stride-th is kept; the others are never read
    reads: list[int] = []

    class Run(Sequence[int]):
        def __init__(self, base: int, positions: list[int]) -> None:
            self.base, self.positions = base, positions

        def __len__(self) -> int:
            return len(self.positions)

        def __getitem__(self, j: int) -> int:  # type: ignore[override]
            reads.append(self.base + self.positions[j])
            return self.base + self.positions[j]

    def plain(positions: list[int], base: int) -> list[int]:
        return [base + p for p in positions]

    def lazy(positions: list[int], base: int) -> Sequence[Any]:
        return Run(base, positions)

    one, many = Thinned[int](32, 192, 32), Thinned[int](32, 192, 32)
    for run in range(60):
        base = run * 400
        for i in range(400):
            one.add(base + i)
        many.extend(400, partial(plain, base=base), partial(lazy, base=base))
    assert many.items() == one.items()
    # 60 runs' tails are 1,920 items: read were those kept past the tail (the middle's, some
    # dropped later as its stride grew), and the last tail, each once
    assert len(reads) == len(set(reads)) < 400


@settings(max_examples=200, deadline=None)
@given(
    head=st.sampled_from([0, 1, 3, 32]),
    middle=st.sampled_from([2, 3, 5, 192]),
    tail=st.sampled_from([1, 2, 32]),
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    lazy=st.booleans(),
)
def test_thinned_extend_keeps_what_adds_keep(
    head: int, middle: int, tail: int, sizes: list[int], lazy: bool
) -> None:
    from oomlens.ingest.log.series import Lazy

    built: list[int] = []

    def build(row: object) -> object:
        built.append(cast(int, row))
        return row

    def lazies(positions: list[int], base: int) -> list[Lazy]:
        return [Lazy(build, base + p) for p in positions]

    def plain(positions: list[int], base: int) -> list[int]:
        return [base + p for p in positions]

    one, many = Thinned[int](head, middle, tail), Thinned[int](head, middle, tail)
    late = Thinned[Any](head, middle, tail)  # Lazy items only, read out once, at the end
    total = 0
    for n in sizes:
        for i in range(n):
            one.add(total + i)
        many.extend(n, partial(plain, base=total), partial(lazies, base=total) if lazy else None)
        late.extend(n, partial(lazies, base=total))
        total += n
        assert many.count == one.count and many.items() == one.items()
    built.clear()  # what ``many``'s read-outs built
    assert late.items() == one.items()
    # Lazy items are built once, and only those still kept when the series is read out
    assert sorted(built) == list(one.items())
    assert late.items() == one.items() and len(built) == len(one.items())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 2**50).map(float),
            st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
            st.floats(0, 20, allow_nan=False),
        ),
        min_size=1,
        max_size=200,
    ),
    st.data(),
)
def test_running_stats_are_exact_in_any_batches(values: list[float], data: st.DataObject) -> None:
    from fractions import Fraction

    one, batched = RunningStats(), RunningStats()
    for v in values:
        one.add(v)
    i = 0
    while i < len(values):
        j = data.draw(st.integers(i + 1, len(values)))
        batched.extend(np.asarray(values[i:j]))
        i = j
    a, b = one.freeze(), batched.freeze()
    assert a == b
    n = len(values)
    total = sum(Fraction(v) for v in values)
    weighted = sum(k * Fraction(v) for k, v in enumerate(values))
    assert a.mean == float(total / n)
    if n >= 2:
        assert a.slope == float((12 * weighted - 6 * (n - 1) * total) / (n * (n * n - 1)))


def test_sources_are_real_lines() -> None:
    src = _sources()
    assert src["traceback"][0] == "Traceback (most recent call last):"
    assert src["dump"][-1].strip() == "}"


def test_reading_a_dense_log_leaves_pandas_unimported(tmp_path: Path) -> None:
    # pyarrow imports pandas when handed Python scalars or asked for numpy conversions: about
    # 40 MiB of resident memory in every reading process, against issue 15's 200 MB bound
    import subprocess
    import sys

    path = tmp_path / "dense.log"
    path.write_text(mixed_log(7, ranks=16, steps=200, odd=0.0))  # past a paste's size: bulk
    script = (
        "import sys\nfrom oomlens.ingest.log import read_log\n"
        f"facts = read_log({str(path)!r})\n"
        "print(sum(s.total_samples for s in facts.memory), 'pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    samples, imported = done.stdout.split()
    assert int(samples) == 16 * 200 and imported == "False"


@given(
    blocks=st.lists(st.binary(min_size=1, max_size=40000), min_size=1, max_size=5),
    prev=st.binary(max_size=20000),
    cuts=st.lists(st.integers(min_value=0, max_value=40000), min_size=5, max_size=5),
)
@settings(max_examples=50, deadline=None)
def test_a_batch_gives_back_its_blocks_and_tails(
    blocks: list[bytes], prev: bytes, cuts: list[int]
) -> None:
    # a batch keeps one joined copy of its blocks, given in parts (a carried line, a view of
    # the read: TextSource.block_parts), and cuts each block out again when read
    parts = [
        (block[: cut % len(block)], memoryview(block)[cut % len(block) :]) if cut else (block,)
        for block, cut in zip(blocks, cuts, strict=False)
    ]
    batch = batches._Batch(parts, prev)
    assert batch.data == b"".join(blocks) and len(batch) == len(blocks)
    assert batches._last_bytes(parts[-1], batches.TAIL_BYTES) == blocks[-1][-batches.TAIL_BYTES :]
    for b in (*range(len(blocks)), 0):
        assert batch.block(b) == blocks[b]
        expected = prev if b == 0 else blocks[b - 1][-batches.TAIL_BYTES :]
        assert batch.tail_before(b) == expected


_LABEL_TEXTS = st.sampled_from(
    [
        b"after step 12",
        b"after step 13",
        b"[2026-11-30 06:00:01,127] [INFO] [engine.py:10:step] after step 12",
        b"[2026-11-30 06:00:02,555] [INFO] [engine.py:10:step] after step 12",
        b"[2026-13-99 99:99:99,999] [INFO] [engine.py:10:step] after step 12",
        b"[INFO] [engine.py:10:step] after step 12",
        b"MA 3.8 GB         Max_MA 5.2 GB         CA 7.4 GB         Max_CA 7 GB",
        b"   ",
        b"",
        b"x" * 300,
        b"caf\xc3\xa9 \x1b[31mred\x1b[0m",
    ]
)


@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
@settings(max_examples=150, deadline=None)
@given(st.lists(_LABEL_TEXTS, max_size=80))
def test_label_ids_in_bulk_are_those_of_row_by_row_lookups(texts: list[bytes]) -> None:
    data = b"\n".join(texts) + b"\n"
    begins, ends, at = [], [], 0
    for text in texts:
        begins.append(at)
        ends.append(at + len(text))
        at += len(text) + 1
    one, in_bulk = bulk_labels.Labels(), bulk_labels.Labels()
    expected = [one.id_of(text) for text in texts]
    starts = np.asarray(begins, dtype=np.int64)
    got = native._label_ids(in_bulk, data, starts, np.asarray(ends, dtype=np.int64))
    assert got.tolist() == expected
    assert in_bulk.texts == one.texts


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 2**40), st.floats(0, 1e12)),
        max_size=60,
    )
)
def test_grouped_columns_are_the_stats_of_each_group_in_order(
    rows: list[tuple[int, int, float]],
) -> None:
    from oomlens.ingest.log.series import grouped_columns

    groups = np.asarray([g for g, _, _ in rows], dtype=np.int64)
    columns = [
        np.asarray([float(v) for _, v, _ in rows], dtype=np.float64),
        np.asarray([f for _, _, f in rows], dtype=np.float64),
    ]
    result = grouped_columns(groups, columns)
    for c, column in enumerate(columns):
        assert set(result[c]) == set(groups.tolist())
        for group, merged in result[c].items():
            one, from_merge = RunningStats(), RunningStats()
            for value in column[groups == group].tolist():
                one.add(value)
            from_merge.merge(*merged)
            assert one.freeze() == from_merge.freeze()


def test_a_lazy_sample_keeps_only_its_own_row_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # unbuilt samples stay in the series for the rest of the read (a rank that stops printing
    # keeps its tail, the middle keeps every stride-th): each must hold its own row's fields,
    # not the rows or arrays of its run
    path = tmp_path / "dense.log"
    path.write_text(mixed_log(7, ranks=16, steps=200, odd=0.0))
    made: list[tuple[object, object]] = []

    class Recording(bulk_apply.Lazy):
        def __init__(self, build, row):  # type: ignore[no-untyped-def]
            super().__init__(build, row)
            made.append((build.__self__, row))

    tails: list[bulk_apply._TailRows] = []

    class RecordingTail(bulk_apply._TailRows):
        def __init__(self, build, columns, built):  # type: ignore[no-untyped-def]
            super().__init__(build, columns, built)
            tails.append(self)

    monkeypatch.setattr(bulk_apply, "Lazy", Recording)
    monkeypatch.setattr(bulk_apply, "_TailRows", RecordingTail)
    runs = _runs(monkeypatch)
    facts = read_log(path, chunk_bytes=16384)
    assert runs and made and tails
    for builder, row in made:
        assert isinstance(builder, bulk_apply._Builder)
        assert isinstance(row, tuple) and len(row) == 13
        assert all(v is None or isinstance(v, int | float | str) for v in row)
    # a tail holds its keeper's last rows of a run alone (32 at most), all of one rank
    for tail in tails:
        assert len(tail) <= 32 and {len(column) for column in tail.columns} <= {len(tail)}
        ranks = {rank for j, rank in enumerate(tail.columns[1]) if j not in tail.built}
        assert len(ranks) <= 1
    # a tail reads as a sequence: by index or by slice, the same rows
    longest = max(tails, key=len)
    by_slice = [getattr(item, "row", item) for item in longest[1:3]]
    assert by_slice == [getattr(longest[j], "row", longest[j]) for j in (1, 2)]
    assert _same(facts, _per_line(path, monkeypatch, chunk_bytes=16384))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.one_of(
                st.integers(-(2**53) + 1, 2**53 - 1).map(float),
                st.floats(-1e15, 1e15, allow_nan=False),
            ),
        ),
        min_size=1,
        max_size=50,
    )
)
def test_grouped_sums_are_the_exact_sums(rows: list[tuple[int, float]]) -> None:
    # whole numbers take a shortcut (one exponent for all): the sums must not change
    from fractions import Fraction

    from oomlens.ingest.log.series import _SCALE, grouped_sums

    groups = np.asarray([g for g, _ in rows], dtype=np.int64)
    values = np.asarray([v for _, v in rows], dtype=np.float64)
    index = np.arange(len(rows), dtype=np.int64) * 7919 % (1 << 40)
    for chosen in (np.ones(len(rows), dtype=bool), values == np.trunc(values)):
        got = grouped_sums(groups[chosen], values[chosen], index[chosen])
        for group in set(groups[chosen].tolist()):
            mine = chosen & (groups == group)
            total = sum(Fraction(v) for v in values[mine].tolist()) * 2**_SCALE
            weighted = sum(
                i * Fraction(v)
                for i, v in zip(index[mine].tolist(), values[mine].tolist(), strict=True)
            )
            assert got[group] == (total, weighted * 2**_SCALE)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([b"it/s]", b"s/it]", b"/", b"it/s", b"s/it", b"x", b"]", b"\n"])),
    st.lists(st.integers(1, 30), max_size=5),
)
def test_progress_bar_blocks_are_those_find_finds(pieces: list[bytes], cuts: list[int]) -> None:
    from oomlens.ingest.log import steps

    data = b"".join(pieces)
    starts = sorted({0, *(c for c in np.cumsum(cuts).tolist() if c < len(data))})
    bounds = np.asarray(starts + [len(data)], dtype=np.int64)
    expected = [
        any(data.find(anchor, begin, end) >= 0 for anchor in steps.TQDM_ANCHORS)
        for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    ]
    assert bulk._progress_bars(np.frombuffer(data, dtype=np.uint8), bounds) == expected


@given(
    values=st.lists(
        st.one_of(
            st.integers(-3, 70),
            st.integers(-(1 << 40), 1 << 40),
            st.sampled_from([-(1 << 63), (1 << 63) - 1, 0, -1]),
        ),
        max_size=300,
    ),
)
def test_first_seen_groups_values_in_the_order_they_first_occur(values: list[int]) -> None:
    # the extension's hashed pass: what a loop over the values finds
    from oomlens.ingest.log.series import first_seen, small_ints

    array = np.asarray(values, dtype=np.int64)
    small = small_ints(array)
    assert small.tolist() == values
    assert np.array_equal(np.argsort(small, kind="stable"), np.argsort(array, kind="stable"))
    expected_firsts: dict[int, int] = {}
    for i, v in enumerate(values):
        expected_firsts.setdefault(v, i)
    group_of = {v: g for g, v in enumerate(expected_firsts)}
    firsts, groups = first_seen(array)
    assert firsts.dtype == groups.dtype == np.int64
    assert firsts.tolist() == list(expected_firsts.values())
    assert groups.tolist() == [group_of[v] for v in values]


def test_first_seen_grows_its_table_and_refuses_odd_bytes() -> None:
    from oomlens.ingest.log import native
    from oomlens.ingest.log.series import first_seen

    if not native.BUILT:
        pytest.skip("the C extension is not built")
    assert native._scan is not None
    rng = np.random.default_rng(3)
    array = rng.integers(-(1 << 62), 1 << 62, 50_000)[rng.integers(0, 50_000, 200_000)]
    firsts, groups = first_seen(array)
    seen: dict[int, int] = {}
    for i, v in enumerate(array.tolist()):
        seen.setdefault(v, i)
    group_of = {v: g for g, v in enumerate(seen)}
    assert firsts.tolist() == list(seen.values())
    assert groups.tolist() == [group_of[v] for v in array.tolist()]
    # values in a range under 2**16 take a table of the range (-1..65534), the rest a hash
    for top in (65534, 65535, 1 << 62):
        edge = np.asarray([top, 0, 7, top, 0, -1, 7], dtype=np.int64)
        firsts, groups = native._scan.first_seen(edge)
        assert np.frombuffer(firsts, dtype=np.int64).tolist() == [0, 1, 2, 5]
        assert np.frombuffer(groups, dtype=np.int64).tolist() == [0, 1, 2, 0, 1, 3, 2]
    with pytest.raises(ValueError, match="int64"):
        native._scan.first_seen(b"abc")  # type: ignore[arg-type]


def test_grouped_sums_of_many_groups_and_exponents() -> None:
    # hundreds of (group, exponent) pairs, zeros and subnormals among them: the extension's
    # table grows many times over
    from fractions import Fraction

    from oomlens.ingest.log.series import _SCALE, grouped_sums

    rng = np.random.default_rng(3)
    n = 4000
    groups = rng.integers(-5, 300, n).astype(np.int64) * 1_000_003
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    values[::97] = 0.0
    values[::89] = 5e-324
    index = rng.integers(0, 1 << 40, n).astype(np.int64)
    got = grouped_sums(groups, values, index)
    assert set(got) == set(groups.tolist())
    for group in sorted(set(groups.tolist()))[:40]:
        mine = groups == group
        fractions = [Fraction(v) for v in values[mine].tolist()]
        total = sum(fractions) * 2**_SCALE
        weighted = sum(i * f for i, f in zip(index[mine].tolist(), fractions, strict=True))
        assert got[group] == (total, weighted * 2**_SCALE)


def test_the_extensions_grouped_sums_refuse_what_they_cannot_sum() -> None:
    from oomlens.ingest.log import native

    if not native.BUILT:
        pytest.skip("the C extension is not built")
    assert native._scan is not None
    one = np.zeros(1, dtype=np.int64)
    for values, index, message in (
        (np.asarray([np.inf]), one, "finite"),
        (np.asarray([1.0]), np.asarray([-1], dtype=np.int64), "indices"),
        (np.asarray([1.0, 2.0]), one, "one group"),
    ):
        with pytest.raises(ValueError, match=message):
            native._scan.grouped_sums(one, values, index)


@settings(max_examples=400, deadline=None)
@given(
    hits=st.lists(
        st.tuples(
            st.sampled_from([bulk.MEMORY, bulk.MEMORY, bulk.CPU, bulk.FLUSH_LINE, bulk.PROGRESS]),
            st.booleans(),
            st.integers(0, 4),
        ),
        max_size=80,
    ),
    open_before=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_samples_close_in_the_reading_order(
    hits: list[tuple[int, bool, int]], open_before: list[bool]
) -> None:
    # the extension's one pass: the samples the per-line path closes, in its order (a
    # stream's open sample closes at the stream's next visited line, with its CPU values when
    # that is a CPU line; a memory line read with its CPU line closes at once), and the
    # samples it leaves open
    if not native.BUILT:
        pytest.skip("the C extension is not built")
    kind = np.asarray([k for k, _, _ in hits], dtype=np.int8)
    # the scan consumes a CPU line read ahead with its memory line
    consumed = np.asarray([c and k == bulk.CPU for k, c, _ in hits], dtype=bool)
    stream = np.asarray([s for _, _, s in hits], dtype=np.int64)
    before = np.asarray(open_before, dtype=np.int8)
    line, cpu, state = bulk_apply._close_order(kind, consumed, stream, before)
    assert line.dtype == cpu.dtype == state.dtype == np.int64
    left = [-2 if b else -1 for b in open_before]
    closed: list[tuple[int, int]] = []
    for i, (k, _, s) in enumerate(hits):
        if consumed[i]:
            continue
        if left[s] != -1:
            closed.append((-1 - s if left[s] == -2 else left[s], i if k == bulk.CPU else -1))
            left[s] = -1
        if k == bulk.MEMORY:
            if i + 1 < len(hits) and consumed[i + 1]:
                closed.append((i, i + 1))
            else:
                left[s] = i
    assert list(zip(line.tolist(), cpu.tolist(), strict=True)) == closed
    assert state.tolist() == left
    # every memory line visited closes once or stays open; every sample from before closes
    # at its stream's first visited line or stays open
    visited = [i for i in range(len(hits)) if not consumed[i]]
    memory = {i for i in visited if kind[i] == bulk.MEMORY}
    assert sorted([x for x in line.tolist() if x >= 0] + [x for x in state.tolist() if x >= 0]) == (
        sorted(memory)
    )
    assert all(cpu[r] < 0 or kind[cpu[r]] == bulk.CPU for r in range(len(cpu)))


def test_close_order_refuses_streams_it_was_not_told_of() -> None:
    from oomlens.ingest.log import native

    if not native.BUILT:
        pytest.skip("the C extension is not built")
    assert native._scan is not None
    one = np.asarray([bulk.MEMORY], dtype=np.int8)
    flag = np.zeros(1, dtype=bool)
    with pytest.raises(ValueError, match="streams from 0"):
        native._scan.close_order(
            one, flag, np.asarray([1], dtype=np.int64), np.zeros(1, dtype=np.int8)
        )
    with pytest.raises(ValueError, match="one consumed flag"):
        native._scan.close_order(
            one, np.zeros(2, dtype=bool), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int8)
        )


@given(
    mask=st.lists(st.booleans(), max_size=60),
    include_self=st.booleans(),
    data=st.data(),
)
def test_the_latest_marked_line_is_found_for_the_lines_asked_about(
    mask: list[bool], include_self: bool, data: st.DataObject
) -> None:
    # what the per-line path carries forward (the last timestamp, the last step) at a line
    latest = bulk_apply._Latest(np.asarray(mask, dtype=bool), include_self)
    asked = data.draw(st.lists(st.integers(0, max(len(mask) - 1, 0)), max_size=20))
    if not mask:
        asked = []
    expected = []
    for i in asked:
        marked = [j for j in range(i + 1 if include_self else i) if mask[j]]
        expected.append(marked[-1] if marked else -1)
    assert latest[np.asarray(asked, dtype=np.int64)].tolist() == expected
    assert [latest.at(i) for i in asked] == expected


def test_place_refuses_items_that_do_not_fit_the_positions() -> None:
    series = Thinned[int](2, 4, 2)
    series.extend(10, lambda positions: positions)
    positions, stride = series.wanted(10)
    split = series.tail_split(10, positions)
    with pytest.raises(ValueError, match="one item per position"):
        series.place(10, positions, stride, list(positions[:-1]))
    with pytest.raises(ValueError, match="one item per position"):
        series.place(10, positions, stride, list(positions[:split]), [0])
    with pytest.raises(ValueError, match="start where the tail does"):
        series.place(10, positions, stride, list(positions[: split - 1]), positions[split - 1 :])
    before = series.items()
    assert series.count == 10  # refused before anything changed
    series.place(10, positions, stride, list(positions[:split]), positions[split:])
    assert series.count == 20 and series.items() != before
