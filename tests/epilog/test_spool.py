"""The spool's writes: whole files or none, on a disk that fills up while they are written."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oomlens.epilog import spool
from oomlens.epilog.spool import append_line, write_new_file

_real_write = os.write


def _disk_fills_after(limit: int) -> Callable[[int, bytes], None]:
    """A ``write_all`` on a disk that takes ``limit`` more bytes, then says ``ENOSPC``."""

    def write_all(fd: int, data: bytes) -> None:
        _real_write(fd, data[:limit])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return write_all


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_full_disk_leaves_no_part_of_a_file(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a disk that fills up halfway through a report
    monkeypatch.setattr(spool, "write_all", _disk_fills_after(4096))
    # WHEN
    with pytest.raises(OSError) as caught:
        write_new_file(dir_fd, "verdict.json", b"{" + b" " * 8192 + b"}")
    # THEN it says so, and neither the report nor its temporary file is left
    assert caught.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_a_new_file_appears_whole_and_never_replaces_a_name(tmp_path: Path, dir_fd: int) -> None:
    write_new_file(dir_fd, "epilog.json", b'{"status": "analyzed"}')
    assert (tmp_path / "epilog.json").read_bytes() == b'{"status": "analyzed"}'
    with pytest.raises(FileExistsError):
        write_new_file(dir_fd, "epilog.json", b"{}")
    assert (tmp_path / "epilog.json").read_bytes() == b'{"status": "analyzed"}'
    assert os.listdir(tmp_path) == ["epilog.json"]


def test_a_log_line_the_disk_cuts_short_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a log with one line, on a disk that takes only part of the next one
    log = tmp_path / "epilog.log"
    log.write_text('{"job":"1"}\n')
    log.chmod(0o640)

    def short_write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(log):
            return _real_write(fd, bytes(data)[:5])
        return _real_write(fd, data)

    monkeypatch.setattr(os, "write", short_write)
    # WHEN
    with pytest.raises(OSError) as caught:
        append_line(log, '{"job":"2","action":"analyzed"}', spool_dir=tmp_path, spool_fd=None)
    monkeypatch.undo()
    # THEN it says so, and the log holds whole lines only, for the next line to follow
    assert caught.value.errno == errno.ENOSPC
    assert log.read_text() == '{"job":"1"}\n'
