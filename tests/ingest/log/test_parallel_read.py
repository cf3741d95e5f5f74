"""Reading a log in batches scanned by worker processes (``--jobs``) gives the facts of one
pass, wherever the batches cut it: inside an OOM message, inside a traceback, inside a rank's
``see_memory_usage`` block; over the crash corpus's logs (read as large logs are, not line by
line as their size would have them) and over generated 64-rank logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.ingest.log import batches, native, read_log
from oomlens.ingest.log import reader as reader_module
from tests._corpus import CORPUS_DIR
from tests.ingest.log._mixed_logs import mixed_log

LOGS = sorted(p for p in CORPUS_DIR.glob("*/*.log") if p.name != "kernel.log")
MIN_CHUNK = 4096
"""The text source's smallest block."""
_MARKS = (b"out of memory", b"Tried to allocate", b"Traceback", b'File "', b"Max_MA", b"[rank")


def _facts(path: Path, **kwargs: object) -> str:
    """The facts, exactly (repr: floats exact, NaN equal to NaN)."""
    return repr(read_log(path, **kwargs))  # type: ignore[arg-type]


def _cuts(data: bytes) -> list[int]:
    """Block sizes that put a block's end just past the first, a middle and the last line of
    each mark (the source cuts a block at the line end after its size): the next block starts
    inside the message, the traceback or the memory block that line belongs to."""
    sizes: set[int] = set()
    for mark in _MARKS:
        found = [i for i in range(len(data)) if data.startswith(mark, i)][:1000]
        for at in {found[0], found[len(found) // 2], found[-1]} if found else set():
            if at >= MIN_CHUNK:
                sizes.add(at)
    return sorted(sizes)


@pytest.fixture
def as_large_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every log read as a large one: the bulk pass, workers even for small files."""
    monkeypatch.setattr(reader_module, "LINE_BY_LINE_BYTES", 0)
    monkeypatch.setattr(batches, "PARALLEL_MIN_BYTES", 0)


def test_the_corpus_has_logs_to_cut() -> None:
    assert len(LOGS) >= 20
    assert sum(bool(_cuts(p.read_bytes())) for p in LOGS) >= 8


@pytest.mark.parametrize("log", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_corpus_log_reads_alike_in_any_batches_and_workers(
    log: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_pass = _facts(log)  # one block, one batch, in this process
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    for chunk in _cuts(log.read_bytes()):
        assert _facts(log, chunk_bytes=chunk) == one_pass, f"blocks of {chunk} bytes"
    # the smallest blocks, each a batch, scanned by two workers, merged in order
    assert _facts(log, chunk_bytes=MIN_CHUNK, jobs=2) == _facts(log, chunk_bytes=MIN_CHUNK)


@pytest.mark.parametrize("seed", [3, 15, 64])
def test_a_64_rank_log_reads_alike_in_any_batches_and_workers(
    tmp_path: Path, seed: int, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ranks.log"
    # odd lines (tracebacks, OOM messages, config dumps, tqdm bars) among every rank's lines
    path.write_text(mixed_log(seed, ranks=64, steps=12, odd=0.05))
    data = path.read_bytes()
    cuts = _cuts(data)
    assert len(cuts) >= 6
    one_pass = _facts(path, chunk_bytes=len(data))
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    for chunk in cuts[:: max(1, len(cuts) // 6)]:
        # blocks of tqdm bars are sampled once per block: compare within one block size
        one = _facts(path, chunk_bytes=chunk)
        assert _facts(path, chunk_bytes=chunk, jobs=2) == one, f"blocks of {chunk} bytes"
        if b"it]" not in data:
            assert one == one_pass


class _SyncPool:
    """A pool whose scans are done when submitted, counting the batches not yet taken."""

    def __init__(self) -> None:
        self.outstanding = 0
        self.in_flight: list[int] = []

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future

        self.outstanding += 1
        self.in_flight.append(self.outstanding)
        future: Future[object] = Future()
        future.set_result(fn(*args))
        return _Taken(self, future)


class _Taken:
    def __init__(self, pool: _SyncPool, future: object) -> None:
        self.pool, self.future = pool, future

    def result(self) -> object:
        self.pool.outstanding -= 1
        return self.future.result()  # type: ignore[attr-defined]


def _read_with(
    pool: _SyncPool,
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    in_threads: bool = False,
    **kwargs: object,
) -> str:
    """The facts read with ``pool`` as the processes that scan (``_read_ahead``), or with
    ``in_threads`` as the threads that read and scan (``_read_in_threads``)."""

    def read_with_pool(reader, jobs):  # type: ignore[no-untyped-def]
        if in_threads:
            return batches._read_in_threads(reader, pool, jobs, 1)
        return batches._read_ahead(reader, pool, jobs, 1, batches.bulk.scan_batch)

    with monkeypatch.context() as m:
        m.setattr(batches, "read", read_with_pool)
        return _facts(path, **kwargs)


def test_batches_in_flight_are_bounded_whatever_the_jobs(
    tmp_path: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memory grows with the batches scanned ahead: many workers must not hold more of them
    path = tmp_path / "dense.log"
    path.write_text(mixed_log(3, ranks=16, steps=120))
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    pool = _SyncPool()
    facts = _read_with(pool, monkeypatch, path, chunk_bytes=4096, jobs=16)
    bound = max(batches.ahead(16), batches.ahead(16, sparse=True))
    assert bound <= batches.MAX_AHEAD
    assert len(pool.in_flight) > 3 * bound
    assert max(pool.in_flight) <= bound + 1  # those ahead and the one just submitted
    assert max(pool.in_flight) >= batches.ahead(16) + 1
    assert facts == _facts(path, chunk_bytes=4096)


@pytest.mark.parametrize("seed", [5, 21])
def test_batches_applied_together_give_the_facts_of_one_pass(
    tmp_path: Path, seed: int, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every group of batches the reader finds scanned is merged: runs, labels and deferred
    # label lookups cross what were batch ends
    merged: list[int] = []
    original = batches.bulk.merge_scans

    def counting(scans, sizes):  # type: ignore[no-untyped-def]
        merged.append(len(scans))
        return original(scans, sizes)

    monkeypatch.setattr(batches.bulk, "merge_scans", counting)
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    path = tmp_path / "ranks.log"
    path.write_text(mixed_log(seed, ranks=64, steps=12, odd=0.05))
    for chunk in (4096, 9000, 65536):
        one = _facts(path, chunk_bytes=chunk)
        assert _read_with(_SyncPool(), monkeypatch, path, chunk_bytes=chunk, jobs=2) == one
    if native.NATIVE:  # groups as large as GROUP_BATCHES batches' bytes
        assert merged and 2 <= max(merged) <= batches.GROUP_BATCHES
    else:
        assert merged and max(merged) == batches.MERGE


@pytest.mark.parametrize("threads", [True, False], ids=["C scan in threads", "pure in processes"])
def test_both_workers_read_alike(
    tmp_path: Path, threads: bool, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the C scan runs in threads, the pure path in processes; either gives the one pass's facts
    if threads and not native.BUILT:
        pytest.skip("the C extension is not built")
    monkeypatch.setattr(native, "NATIVE", threads)
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    import concurrent.futures

    started: list[str] = []
    for module, pool in (
        (batches, batches.ThreadPoolExecutor),
        (concurrent.futures, concurrent.futures.ProcessPoolExecutor),
    ):

        def record(*args, _pool=pool, **kwargs):  # type: ignore[no-untyped-def]
            started.append(_pool.__name__)
            return _pool(*args, **kwargs)

        monkeypatch.setattr(module, pool.__name__, record)
    path = tmp_path / "ranks.log"
    path.write_text(mixed_log(9, ranks=16, steps=40, odd=0.05))
    one = _facts(path, chunk_bytes=8192)
    assert _facts(path, chunk_bytes=8192, jobs=2) == one
    assert started == ["ThreadPoolExecutor" if threads else "ProcessPoolExecutor"]


@pytest.mark.parametrize("log", LOGS[::3], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_corpus_log_reads_alike_with_batches_applied_together(
    log: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    one = _facts(log, chunk_bytes=MIN_CHUNK)
    assert _read_with(_SyncPool(), monkeypatch, log, chunk_bytes=MIN_CHUNK, jobs=2) == one


@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
@pytest.mark.parametrize("in_threads", [True, False], ids=["threads read", "processes"])
def test_a_third_batch_is_in_flight_only_while_batches_are_sparse(
    tmp_path: Path, in_threads: bool, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with the C scan, a batch's arrays are as large as its bytes on a dense log: two in flight
    # there, three where anchored lines are few
    monkeypatch.setattr(native, "NATIVE", True)
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 1)
    dense = tmp_path / "dense.log"  # every line a step line
    dense.write_text("".join(f"[rank{s % 16}]: step {s} loss 1.{s:04d}\n" for s in range(6000)))
    sparse = tmp_path / "sparse.log"
    filler = "".join(
        f"[rank{r}]: an ordinary line of the training script, {r}\n" for r in range(90)
    )
    sparse.write_text(
        "".join(filler + f"[rank{s % 8}]: step {s} loss 1.{s:04d}\n" for s in range(300))
    )
    peaks = {}
    for path in (dense, sparse):
        pool = _SyncPool()
        facts = _read_with(pool, monkeypatch, path, in_threads, chunk_bytes=4096, jobs=16)
        assert facts == _facts(path, chunk_bytes=4096)
        peaks[path.name] = max(pool.in_flight)
    assert peaks == {
        "dense.log": batches.NATIVE_AHEAD + 1,
        "sparse.log": batches.NATIVE_AHEAD_SPARSE + 1,
    }


def test_a_batch_joins_its_blocks_once_and_lets_them_go() -> None:
    blocks = [b"a\nb\n", b"cc\n", b"ddd\n"]
    batch = batches._Batch([(b"a\n", memoryview(b"b\n")), (b"cc\n",), (b"ddd\n",)], b"tail")
    assert batch.starts == [0, 4, 7]
    data = batch.data
    assert data == b"".join(blocks) and batch.data is data
    assert batch._parts is None  # the blocks' parts are let go of once joined
    assert [batch.block(b) for b in range(3)] == blocks
    assert batch.tail_before(0) == b"tail" and batch.tail_before(2) == b"cc\n"


@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
def test_no_more_scanning_threads_than_scan_threads_whatever_the_jobs(
    tmp_path: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each thread keeps the batches it joined in a malloc arena of its own: memory grows with
    # the threads, speed does not past two
    monkeypatch.setattr(native, "NATIVE", True)
    workers: list[int] = []
    real = batches.ThreadPoolExecutor

    def record(max_workers: int) -> object:
        workers.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(batches, "ThreadPoolExecutor", record)
    path = tmp_path / "ranks.log"
    path.write_text(mixed_log(4, ranks=8, steps=30, odd=0.05))
    one = _facts(path, chunk_bytes=8192)
    for jobs in (2, 8, 64):
        assert _facts(path, chunk_bytes=8192, jobs=jobs) == one
    assert workers == [min(2, batches.SCAN_THREADS), batches.SCAN_THREADS, batches.SCAN_THREADS]


@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
def test_the_scanning_threads_read_and_join_the_batches(
    tmp_path: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reader's thread, the one that limits once there are cores to spare, applies the
    # scans and leaves reading the input and joining each batch's blocks to the threads
    import threading

    monkeypatch.setattr(native, "NATIVE", True)
    monkeypatch.setattr(batches, "BATCH_BLOCKS", 2)
    read_by: list[str] = []
    joined_by: list[str] = []
    batches_of = batches._batches
    data_of = batches._Batch.data

    def reading(reader):  # type: ignore[no-untyped-def]
        for batch in batches_of(reader):
            read_by.append(threading.current_thread().name)
            yield batch

    def joining(self):  # type: ignore[no-untyped-def]
        if self._data is None:
            joined_by.append(threading.current_thread().name)
        return data_of.fget(self)

    monkeypatch.setattr(batches, "_batches", reading)
    monkeypatch.setattr(batches._Batch, "data", property(joining))
    path = tmp_path / "ranks.log"
    path.write_text(mixed_log(6, ranks=8, steps=60, odd=0.05))
    one = _facts(path, chunk_bytes=8192)
    read_by.clear()
    joined_by.clear()
    assert _facts(path, chunk_bytes=8192, jobs=2) == one
    assert len(read_by) > 4 and len(joined_by) > 4
    assert threading.main_thread().name not in read_by + joined_by


def test_batches_are_taken_in_input_order_whichever_thread_runs_a_task() -> None:
    # tasks submitted in order to a first-in-first-out pool get the batches in order, however
    # their threads are scheduled
    import random
    import time
    from concurrent.futures import ThreadPoolExecutor

    def batches_slowly():  # type: ignore[no-untyped-def]
        for k in range(60):
            time.sleep(random.random() / 2000)
            yield k

    turns = batches._InTurn(batches_slowly())
    with ThreadPoolExecutor(max_workers=4) as pool:
        taken = [pool.submit(turns.take, k) for k in range(64)]
        assert [future.result(timeout=30) for future in taken] == [*range(60), *[None] * 4]


def test_a_failure_to_read_is_raised_by_its_task_and_the_later_tasks_end() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from oomlens.errors import InputError

    def failing():  # type: ignore[no-untyped-def]
        yield 0
        yield 1
        raise InputError("run.log", "cannot be read", "check the file")

    turns = batches._InTurn(failing())
    with ThreadPoolExecutor(max_workers=2) as pool:
        taken = [pool.submit(turns.take, k) for k in range(6)]
        assert [taken[k].result(timeout=30) for k in (0, 1)] == [0, 1]
        with pytest.raises(InputError, match="cannot be read"):
            taken[2].result(timeout=30)
        assert [future.result(timeout=30) for future in taken[3:]] == [None] * 3


@pytest.mark.skipif(not native.BUILT, reason="the C extension is not built")
def test_a_log_that_cannot_be_decompressed_fails_as_in_one_pass_with_threads(
    tmp_path: Path, as_large_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first read fails in a thread that scans: the reader raises it, nothing hangs
    from oomlens.errors import InputError

    monkeypatch.setattr(native, "NATIVE", True)
    path = tmp_path / "run.log.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 64)
    for jobs in (1, 2):
        with pytest.raises(InputError, match="cannot be decompressed"):
            read_log(path, jobs=jobs)
