"""The text stream: compression by content, bounded lines, hostile bytes."""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomlens.errors import InputError
from oomlens.ingest.textstream import Compression, open_text, read_head

ASSETS = Path(__file__).parents[1] / "assets" / "logs"
LAB = ASSETS / "lab_log_torch2.11_h200.txt"


def _plain_lines() -> list[str]:
    return LAB.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("compress", "kind"),
    [
        (gzip.compress, Compression.GZIP),
        (bz2.compress, Compression.BZIP2),
        (lzma.compress, Compression.XZ),
    ],
)
def test_compressed_logs_read_like_plain_whatever_their_name(
    tmp_path: Path, compress, kind
) -> None:
    # GIVEN the real log compressed, under a misleading name
    target = tmp_path / "run.log"
    target.write_bytes(compress(LAB.read_bytes()))
    # WHEN it is streamed
    source = open_text(target)
    lines = [text for _, text in source.lines()]
    # THEN the compression is recognised by content and the lines are the plain ones
    assert source.compression is kind
    assert lines == _plain_lines()
    assert source.stats.lines == len(lines)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")
def test_zstd_log_is_read_through_the_zstd_program_or_module(tmp_path: Path) -> None:
    target = tmp_path / "run.log.zst"
    subprocess.run(["zstd", "-q", "-o", str(target), str(LAB)], check=True)
    source = open_text(target)
    assert source.compression is Compression.ZSTD
    assert [text for _, text in source.lines()] == _plain_lines()


def test_cut_gzip_stream_yields_what_was_there_and_says_so(tmp_path: Path) -> None:
    data = gzip.compress(LAB.read_bytes())
    target = tmp_path / "cut.gz"
    target.write_bytes(data[: len(data) // 2])
    source = open_text(target)
    lines = [text for _, text in source.lines()]
    assert 10 < len(lines) < len(_plain_lines())
    assert lines[:10] == _plain_lines()[:10]
    assert source.stats.problem is not None and "ends early" in source.stats.problem


def test_megabyte_line_is_cut_counted_and_not_held(tmp_path: Path) -> None:
    target = tmp_path / "long.log"
    target.write_bytes(b"first\n" + b"x" * (3 * 1024 * 1024) + b"\nlast line\n")
    source = open_text(target, chunk_bytes=64 * 1024)
    lines = list(source.lines())
    assert [n for n, _ in lines] == [1, 2, 3]
    assert lines[0][1] == "first" and lines[2][1] == "last line"
    assert len(lines[1][1]) == source.max_line_bytes
    assert source.stats.long_lines == 1
    assert not source.stats.ended_mid_line


def test_last_line_without_newline_is_yielded_and_flagged(tmp_path: Path) -> None:
    target = tmp_path / "cut.log"
    target.write_bytes(b"a\nb\ntorch.OutOfMemoryError: CUDA out of memory. Tried to alloc")
    source = open_text(target)
    lines = list(source.lines())
    assert lines[-1] == (3, "torch.OutOfMemoryError: CUDA out of memory. Tried to alloc")
    assert source.stats.ended_mid_line


def test_carriage_returns_nuls_ansi_and_invalid_utf8_are_repaired(tmp_path: Path) -> None:
    target = tmp_path / "dirty.log"
    target.write_bytes(
        b" 10%|#  | 1/10 [00:01<00:09]\r 20%|## | 2/10 [00:02<00:08]\r\n"
        b"\x1b[93m [WARNING] \x1b[0m async_io requires the dev libaio\n"
        b"GPU \x00 has \xff\xfe bytes\r\n"
    )
    source = open_text(target)
    lines = [text for _, text in source.lines()]
    assert lines[0] == " 20%|## | 2/10 [00:02<00:08]"
    assert lines[1] == " [WARNING]  async_io requires the dev libaio"
    assert lines[2] == "GPU  has \ufffd\ufffd bytes"
    assert source.stats.invalid_utf8_lines == 1 and source.stats.nul_bytes == 1


@pytest.mark.parametrize("chunk", [4096, 5000, 65536, 1 << 20])
def test_line_numbers_do_not_depend_on_chunk_size(tmp_path: Path, chunk: int) -> None:
    source = open_text(LAB, chunk_bytes=chunk)
    numbered = list(source.lines())
    assert [n for n, _ in numbered] == list(range(1, len(_plain_lines()) + 1))
    assert [t for _, t in numbered] == _plain_lines()


def test_unreadable_inputs_raise_one_clear_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        open_text(tmp_path / "missing.log")
    with pytest.raises(InputError, match="is a directory"):
        open_text(tmp_path)
    fake = tmp_path / "fake.gz"
    fake.write_bytes(b"\x1f\x8b" + b"not gzip at all" * 10)
    with pytest.raises(InputError, match="cannot be decompressed"):
        list(open_text(fake).lines())


def test_read_head_is_bounded_and_decompressed(tmp_path: Path) -> None:
    target = tmp_path / "x"
    target.write_bytes(gzip.compress(LAB.read_bytes()))
    head = read_head(target, 1000)
    assert len(head) == 1000 and head == LAB.read_bytes()[:1000]


@pytest.mark.parametrize("compress", [gzip.compress, lzma.compress], ids=["gzip", "xz"])
def test_read_head_keeps_what_a_cut_stream_decompressed(tmp_path: Path, compress) -> None:
    # A small compressed log cut short: the head's one big read() used to raise at the cut
    # and drop everything, so the file was "data that decompresses to nothing".
    text = b"".join(b"[rank0]: step %d loss %d\n" % (s, (s * 7919) % 100003) for s in range(3000))
    data = compress(text)
    target = tmp_path / "train.log.cut"
    target.write_bytes(data[: len(data) // 2])
    head = read_head(target)
    assert len(head) > 8192 and text.startswith(head)


@given(
    lines=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=40),
    chunk=st.integers(min_value=4096, max_value=9000),  # reads are 4 KiB at least
    ends_mid_line=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_blocks_end_at_the_last_newline_of_each_read_and_come_in_parts(
    tmp_path_factory: pytest.TempPathFactory, lines: list[int], chunk: int, ends_mid_line: bool
) -> None:
    # the reader's batches join blocks' parts; its facts depend on where the blocks end
    content = b"".join(b"x" * n + b"\n" for n in lines) + (b"tail" if ends_mid_line else b"")
    path = tmp_path_factory.mktemp("blocks") / "log"
    path.write_bytes(content)
    source = open_text(path, chunk_bytes=chunk, max_line_bytes=1 << 20)
    parts = list(source.block_parts())
    joined = [b"".join(p) for _, p in parts]
    assert b"".join(joined) == content
    ends = {content.rfind(b"\n", 0, m) + 1 for m in range(chunk, len(content) + chunk, chunk)}
    expected = sorted((ends | {len(content)}) - {0})
    assert [sum(map(len, joined[: k + 1])) for k in range(len(joined))] == expected
    assert [b.data for b in open_text(path, chunk_bytes=chunk).blocks()] == joined
    assert [first for first, _ in parts] == [
        1 + b"".join(joined[:k]).count(b"\n") for k in range(len(joined))
    ]
    assert source.stats.lines == len(lines) + ends_mid_line
    assert source.stats.ended_mid_line == ends_mid_line


def test_a_long_line_cut_in_parts_is_one_block_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a\n" + b"y" * 5000 + b"\nb\nc")
    source = open_text(path, chunk_bytes=1024, max_line_bytes=2000)
    blocks = [(first, b"".join(p)) for first, p in source.block_parts()]
    assert (2, b"y" * 2000 + b"\n") in blocks
    assert b"".join(data for _, data in blocks) == b"a\n" + b"y" * 2000 + b"\nb\nc"
    assert source.stats.long_lines == 1 and source.stats.lines == 4
