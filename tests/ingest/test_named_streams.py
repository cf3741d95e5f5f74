"""A stream named on the command line (``-``, ``/dev/stdin``, ``<(cmd)``, a FIFO's path) is
read once, bounded, into a private file; nothing else that is not a regular file is."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from oomlens.errors import InputError
from oomlens.ingest.files import is_named_stream, spooled_streams
from oomlens.ingest.run import collect_inputs


def _pipe_with(data: bytes) -> tuple[int, threading.Thread]:
    """The read end of a pipe another thread writes ``data`` into (in pieces, then closes)."""
    read, write = os.pipe()

    def writer() -> None:
        with os.fdopen(write, "wb") as out, contextlib.suppress(BrokenPipeError):
            for start in range(0, len(data), 100_000):
                out.write(data[start : start + 100_000])

    thread = threading.Thread(target=writer)
    thread.start()
    return read, thread


def test_a_pipe_named_by_its_fd_path_is_read_whole_into_a_file_removed_after(
    tmp_path: Path,
) -> None:
    data = b"".join(b"step %d loss 0.5\n" % i for i in range(200_000))  # > a pipe's buffer
    read, thread = _pipe_with(data)
    given = f"/dev/fd/{read}"
    try:
        assert is_named_stream(given)
        with spooled_streams([given, "other.log"], directory=str(tmp_path)) as (paths, streams):
            assert paths[1] == "other.log"  # what is no stream is left alone
            (stream,) = streams
            assert (stream.given, stream.shown, paths[0]) == (given, given, stream.path)
            assert Path(stream.path).read_bytes() == data
            files, reports = collect_inputs(paths[:1])
            assert [f.kind.id for f in files] == ["training_log"] and not reports
    finally:
        thread.join()
        os.close(read)
    assert list(tmp_path.iterdir()) == []  # the spool is gone


def test_a_stream_longer_than_the_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    read, thread = _pipe_with(b"y\n" * 600_000)
    try:
        with pytest.raises(InputError) as refused:
            with spooled_streams([f"/dev/fd/{read}"], limit=1_000_000, directory=str(tmp_path)):
                pass
    finally:
        os.close(read)  # the writer sees a broken pipe and stops
        thread.join()
    assert refused.value.message.startswith(f"/dev/fd/{read}: gives more than 976.56 KiB;")
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_nobody_writes_to_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "job.out"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            with spooled_streams([str(fifo)], directory=str(tmp_path)):
                outcome.append(None)
        except InputError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(20)
    assert outcome, "blocked on a FIFO without a writer"
    assert isinstance(outcome[0], InputError) and "nothing written to it" in str(outcome[0])


def test_one_stream_named_twice_is_refused(tmp_path: Path) -> None:
    read, thread = _pipe_with(b"step 1 loss 2\n")
    try:
        with pytest.raises(InputError, match="reads only once"):
            with spooled_streams(
                [f"/dev/fd/{read}", f"/proc/self/fd/{read}"], directory=str(tmp_path)
            ):
                pass
    finally:
        thread.join()
        os.close(read)


def test_a_fifo_inside_a_run_directory_stays_refused(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("step 1 loss 2\n")
    os.mkfifo(tmp_path / "rank1.log")
    with spooled_streams([str(tmp_path)], directory=str(tmp_path / "..")) as (paths, streams):
        assert streams == () and paths == [str(tmp_path)]
        files, _ = collect_inputs(paths)
    assert [os.path.basename(f.path) for f in files] == ["train.log"]
