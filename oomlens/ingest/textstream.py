"""Open a text input (plain or compressed) as a bounded-memory stream of lines.

Training logs arrive plain or as ``.gz``/``.bz2``/``.xz``/``.zst``, whatever their names say,
so the compression is recognised by magic bytes.  Their content is hostile: invalid UTF-8,
NUL bytes, ANSI colour codes, ``\\r`` progress-bar rewrites, lines of megabytes, a last line cut
in the middle.  Nothing here raises on content; only an input that cannot be opened or
decompressed at all raises ``InputError``.

Two views of the same stream:

* ``TextSource.blocks()`` yields ``Block``\\ s: about ``chunk_bytes`` of raw bytes holding whole
  lines (each ends with ``\\n`` except a cut last line), with the number of their first line.
  The log reader scans blocks with one multi-pattern search and decodes only the lines it
  needs (``LineCleaner``).  A line longer than ``max_line_bytes`` that spans reads is cut at
  that length, counted, and the rest of it dropped while reading, so memory stays at about one
  chunk plus one capped line whatever the input.
* ``TextSource.lines()`` yields ``(line_number, text)`` for every line, cleaned (see
  ``LineCleaner.clean``).  Line numbers are 1-based and count ``\\n`` only.

NUL bytes (the holes a crash leaves in a file) are removed from the stream before it is cut
into lines.  Memory is independent of the input's size; ``TextSource.stats`` tells what was
read and what was repaired.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import IO

import regex

from oomlens.errors import InputError
from oomlens.ingest.envelope import (
    Encoding,
    Envelope,
    decode_utf16,
    sniff_encoding,
    sniff_envelopes,
    unwrap,
    without_nul_units,
)
from oomlens.ingest.files import open_regular

MAX_LINE_BYTES = 64 * 1024
"""Lines are cut to this many bytes: no OOM message or log record is anywhere near as long."""

READ_CHUNK_BYTES = 1 << 20

HEAD_BYTES = 64 * 1024
"""How much decompressed text ``read_head`` returns for content sniffing."""
HOLE_SCAN_BYTES = 64 * HEAD_BYTES
"""How far the encoding's sniff reads through a hole of zeros at the start for text."""


class Compression(StrEnum):
    """How an input's bytes are wrapped, told by its first bytes."""

    NONE = "none"
    GZIP = "gzip"
    BZIP2 = "bzip2"
    XZ = "xz"
    ZSTD = "zstd"


_MAGIC: tuple[tuple[bytes, Compression], ...] = (
    (b"\x1f\x8b", Compression.GZIP),
    (b"BZh", Compression.BZIP2),
    (b"\xfd7zXZ\x00", Compression.XZ),
    (b"\x28\xb5\x2f\xfd", Compression.ZSTD),
)


def sniff_compression(head: bytes) -> Compression:
    """The compression whose magic bytes start ``head``, else ``Compression.NONE``."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            if kind is Compression.BZIP2 and not (len(head) > 3 and head[3:4].isdigit()):
                continue
            return kind
    return Compression.NONE


@dataclass(slots=True)
class StreamStats:
    """What reading one input found: filled in while the stream is consumed."""

    bytes_read: int = 0
    """Decompressed bytes read so far."""
    lines: int = 0
    """Lines seen (the last line counts even when it has no newline)."""
    long_lines: int = 0
    """Lines cut to ``max_line_bytes``: those spanning reads, and those a consumer cleaned."""
    invalid_utf8_lines: int = 0
    """Cleaned lines whose invalid UTF-8 was replaced by U+FFFD."""
    nul_lines: int = 0
    """Cleaned lines that held NUL bytes (removed)."""
    nul_bytes: int = 0
    """NUL bytes removed from the stream before it was cut into lines (see ``_chunks``)."""
    ended_mid_line: bool = False
    """The input's last line has no newline: it was cut, or the writer died mid-line."""
    problem: str | None = None
    """Why reading stopped early (a compressed stream cut short or corrupt), if it did."""
    cut_short: bool = False
    """The compressed stream ends before its end of stream (the file was cut)."""


@dataclass(frozen=True, slots=True)
class Block:
    """Raw bytes holding whole lines; ``first_line`` is the 1-based number of the first one."""

    first_line: int
    data: bytes


_ANSI_RE = regex.compile(r"\x1b(?:\[[0-?]*+[ -/]*+[@-~]|\][^\x07\x1b]*+(?:\x07|\x1b\\)?|[@-Z\\-_])")


_NARROW = {
    **{code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)},
    0x3000: 0x20,
    0x00A0: 0x20,
    0x2007: 0x20,
    0x202F: 0x20,
}
"""Full-width forms (a CJK input method's ``：``, ``（``, ``ＧＰＵ``) and non-breaking spaces,
as the ASCII a matcher expects."""


class LineCleaner:
    """Turns one raw line into text that matchers can trust; counts the repairs in ``stats``.

    ``clean`` drops the line end, keeps the last non-blank ``\\r`` segment (what a terminal
    would show after a progress bar rewrote the line), removes NULs, decodes UTF-8 replacing
    invalid bytes, removes ANSI escape sequences, turns full-width forms and non-breaking
    spaces into ASCII, and cuts the line to ``max_line_bytes``.
    """

    __slots__ = ("max_line_bytes", "stats")

    def __init__(self, stats: StreamStats, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.stats = stats
        self.max_line_bytes = max_line_bytes

    def clean(self, raw: bytes) -> str:
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if len(raw) > self.max_line_bytes:
            raw = raw[: self.max_line_bytes]
            self.stats.long_lines += 1
        if b"\r" in raw:
            raw = last_carriage_segment(raw)
        if b"\x00" in raw:
            raw = raw.replace(b"\x00", b"")
            self.stats.nul_lines += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            self.stats.invalid_utf8_lines += 1
        if "\x1b" in text:
            text = _ANSI_RE.sub("", text)
        if not text.isascii():
            text = text.translate(_NARROW)
        return text


def last_carriage_segment(raw: bytes) -> bytes:
    """What a terminal shows of a line rewritten with ``\\r``: its last non-blank segment."""
    raw = raw.rstrip(b"\r")
    if b"\r" not in raw:
        return raw
    for segment in reversed(raw.split(b"\r")):
        if segment.strip():
            return segment
    return b""


class TextSource:
    """One text input, possibly compressed; iterate ``blocks()`` or ``lines()`` once or more.

    Construct with ``open_text``, which checks that the file can be opened.  Every iteration
    re-opens the file and resets ``stats``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        display: str | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> None:
        self.path = os.fspath(path)
        self.display = display if display is not None else self.path
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = max(chunk_bytes, 4096)
        self.stats = StreamStats()
        self.compression = Compression.NONE
        try:
            with open_regular(self.path, display=self.display) as raw:
                self.compression = sniff_compression(raw.read(8))
        except OSError as exc:
            raise _open_error(self.display, exc) from exc
        if self.compression is Compression.ZSTD:
            _zstd_available(self.display)
        head = self._raw_head(HEAD_BYTES)
        if len(head) >= HEAD_BYTES and len(without_nul_units(head)) < HEAD_BYTES // 16:
            # a hole of zeros at the start says nothing of the encoding: sniff the text after
            head = self._raw_head(HOLE_SCAN_BYTES)
        self.encoding = sniff_encoding(head)
        if self.encoding is not Encoding.UTF8:
            head = b"".join(decode_utf16(self.encoding, iter((head,))))
        self.envelopes: tuple[Envelope, ...] = sniff_envelopes(head)

    @property
    def plain(self) -> bool:
        """The bytes are the text: UTF-8 (or anything but UTF-16) in no envelope."""
        return self.encoding is Encoding.UTF8 and not self.envelopes

    def describe_envelope(self) -> str | None:
        """What was unwrapped to read the text, in words, or None for a plain text."""
        if self.plain:
            return None
        what = [f"{self.encoding.value.upper()} text"] if self.encoding is not Encoding.UTF8 else []
        what += [envelope.value for envelope in self.envelopes]
        said = "read as the log it carries: " + ", in ".join(reversed(what))
        if self.envelopes:
            said += " (line numbers count the lines it carries)"
        return said

    def _raw_head(self, limit: int) -> bytes:
        """Up to ``limit`` decompressed bytes from the start; a cut or corrupt compressed
        stream yields what could be decompressed."""
        out = bytearray()
        with self.open_binary() as stream:
            # read1, as in ``_chunks``: a decompressor's read() loses its pieces at a cut.
            read = getattr(stream, "read1", None) or stream.read
            while len(out) < limit:
                try:
                    chunk = read(min(limit - len(out), 65536))
                except (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError):
                    break
                if not chunk:
                    break
                out += chunk
        return bytes(out)

    def cut_short(self) -> bool:
        """The compressed stream ends before its end (read through to tell)."""
        self.stats = StreamStats()
        try:
            for _ in self._chunks():
                pass
        except InputError:
            return False  # not decompressible at all: corrupt, not cut
        return self.stats.cut_short

    def text_chunks(self) -> Iterator[bytes]:
        """The text as UTF-8 bytes in chunks of any length: decompressed, decoded from UTF-16,
        unwrapped from its envelopes (``oomlens.ingest.envelope``); NULs not removed yet."""
        chunks = self._chunks()
        if self.encoding is not Encoding.UTF8:
            chunks = decode_utf16(self.encoding, chunks)
        if self.envelopes:
            chunks = unwrap(self.envelopes, chunks)
        return chunks

    @contextmanager
    def open_binary(
        self,
    ) -> Iterator[IO[bytes] | gzip.GzipFile | bz2.BZ2File | lzma.LZMAFile | io.RawIOBase]:
        """The decompressed byte stream.  Raises InputError if it cannot be opened."""
        try:
            raw = open_regular(self.path, display=self.display)
        except OSError as exc:
            raise _open_error(self.display, exc) from exc
        proc: subprocess.Popen[bytes] | None = None
        try:
            stream: IO[bytes] | gzip.GzipFile | bz2.BZ2File | lzma.LZMAFile | _ProcessReader
            if self.compression is Compression.GZIP:
                stream = gzip.GzipFile(fileobj=raw, mode="rb")
            elif self.compression is Compression.BZIP2:
                stream = bz2.BZ2File(raw, mode="rb")
            elif self.compression is Compression.XZ:
                stream = lzma.LZMAFile(raw, mode="rb")
            elif self.compression is Compression.ZSTD:
                stream, proc = _open_zstd(raw, self.display)
            else:
                stream = raw
            yield stream
        finally:
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            raw.close()

    def _chunks(self) -> Iterator[bytes]:
        with self.open_binary() as stream:
            # Decompressors raise at a cut stream's end and lose what read() had gathered:
            # read1() hands over each decompressed piece as it comes.
            read = (
                getattr(stream, "read1", None) if self.compression is not Compression.NONE else None
            )
            while True:
                try:
                    chunk = (
                        _read_chunk(read, self.chunk_bytes)
                        if read is not None
                        else stream.read(self.chunk_bytes)
                    )
                except EOFError:
                    self.stats.cut_short = True
                    self.stats.problem = (
                        f"the {self.compression} stream ends early (the file was cut); "
                        "read what was there"
                    )
                    return
                except (OSError, lzma.LZMAError, zlib.error, ValueError) as exc:
                    if self.stats.bytes_read == 0:
                        raise InputError(
                            self.display,
                            f"looks {self.compression}-compressed but cannot be "
                            f"decompressed ({exc})",
                            "check that the file is complete and not corrupt",
                        ) from exc
                    self.stats.problem = (
                        f"the {self.compression} stream is corrupt after "
                        f"{self.stats.bytes_read} bytes ({exc}); read what was before"
                    )
                    return
                if not chunk:
                    return
                self.stats.bytes_read += len(chunk)
                yield chunk

    def blocks(self, *, number_lines: bool = True) -> Iterator[Block]:
        """Line-aligned raw blocks; see the module docstring for the guarantees.

        With ``number_lines=False`` the blocks' ``first_line`` is 0 and ``stats.lines`` is
        left to the consumer, which saves counting every newline twice when the consumer
        counts them anyway."""
        for first_line, parts in self.block_parts(number_lines=number_lines):
            data = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
            yield Block(first_line, data)

    def block_parts(
        self, *, number_lines: bool = True
    ) -> Iterator[tuple[int, tuple[bytes | memoryview, ...]]]:
        """``blocks()``'s blocks as ``(first_line, parts)``: the pieces whose join is the
        block's data (the line carried over from the read before, then the read's lines, a
        view of it), not joined yet.  A caller that joins many blocks at once (the log
        reader's batches) copies each byte once: joining each block cost the reading thread
        a second copy of the input (0.1-0.2 s of CPU per GiB, with its page faults)."""
        self.stats = StreamStats()
        stats = self.stats
        max_line = self.max_line_bytes
        partial = bytearray()
        dropping = False
        next_line = 1
        for chunk in self.text_chunks():
            if b"\x00" in chunk:
                # NUL is no character of a text log: it is a hole a crash left in the file
                # (space preallocated or a size set, never written; a file truncated under a
                # writer that keeps its offset).  Removed before lines are cut at
                # ``max_line_bytes``: a hole of megabytes would push the line after it past the
                # cut, and a crash's last line is just what follows such a hole.
                before = len(chunk)
                chunk = chunk.replace(b"\x00", b"")
                stats.nul_bytes += before - len(chunk)
                if not chunk:
                    continue
            pos = 0
            if dropping:
                newline = chunk.find(b"\n")
                if newline < 0:
                    continue
                pos = newline + 1
                dropping = False
            last_newline = chunk.rfind(b"\n", pos)
            if last_newline < 0:
                partial += chunk[pos:] if pos else chunk
                if len(partial) > max_line:
                    yield next_line, (bytes(partial[:max_line]) + b"\n",)
                    next_line += 1
                    stats.long_lines += 1
                    partial.clear()
                    dropping = True
                continue
            if partial:
                first_newline = chunk.find(b"\n", pos)
                if len(partial) + first_newline - pos > max_line:
                    partial += chunk[pos : pos + max_line]
                    yield next_line, (bytes(partial[:max_line]) + b"\n",)
                    next_line += 1
                    stats.long_lines += 1
                    partial.clear()
                    pos = first_newline + 1
            if last_newline + 1 > pos:
                body: bytes | memoryview = (
                    chunk
                    if pos == 0 and last_newline + 1 == len(chunk)
                    else memoryview(chunk)[pos : last_newline + 1]
                )
                carried = bytes(partial)
                partial.clear()
                yield next_line, (carried, body) if carried else (body,)
                if number_lines:
                    next_line += chunk.count(b"\n", pos, last_newline + 1)  # none carried
            partial += chunk[last_newline + 1 :]
        if partial:
            stats.ended_mid_line = True
            yield next_line, (bytes(partial),)
            next_line += 1
        elif dropping:
            stats.ended_mid_line = True
        if number_lines:
            stats.lines = next_line - 1

    def lines(self) -> Iterator[tuple[int, str]]:
        """Every line as ``(line_number, cleaned_text)``."""
        cleaner = None
        for block in self.blocks():
            if cleaner is None:
                cleaner = LineCleaner(self.stats, self.max_line_bytes)
            number = block.first_line
            parts = block.data.split(b"\n")
            if block.data.endswith(b"\n"):
                parts.pop()
            for raw in parts:
                yield number, cleaner.clean(raw)
                number += 1


def _read_chunk(read1, size: int) -> bytes:  # type: ignore[no-untyped-def]
    """Up to ``size`` bytes through ``read1``; a piece read before an error is kept for the
    next call, so that nothing decompressed is lost."""
    parts: list[bytes] = []
    total = 0
    while total < size:
        try:
            piece = read1(min(size - total, 65536))
        except (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError):
            if parts:
                break  # hand over what we have; the next call raises again
            raise
        if not piece:
            break
        parts.append(piece)
        total += len(piece)
    return b"".join(parts)


def open_text(
    path: str | os.PathLike[str],
    *,
    display: str | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    chunk_bytes: int = READ_CHUNK_BYTES,
) -> TextSource:
    """A ``TextSource`` for ``path``.

    Raises InputError when the file does not exist, is a directory, cannot be read, or is
    zstd-compressed with no zstd decoder available.
    """
    display = display if display is not None else os.fspath(path)
    if os.path.isdir(path):
        raise InputError(display, "is a directory, not a file", "pass the files inside it")
    return TextSource(path, display=display, max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes)


def read_head(
    path: str | os.PathLike[str], limit: int = HEAD_BYTES, *, display: str | None = None
) -> bytes:
    """Up to ``limit`` bytes from the start of ``path``'s text, for content sniffing:
    decompressed, and when it is UTF-16 or in an envelope (``oomlens.ingest.envelope``), the
    UTF-8 text it carries; NUL bytes are kept.

    A cut or corrupt compressed stream yields what could be decompressed.  Raises InputError
    as ``open_text`` does.
    """
    source = open_text(path, display=display, chunk_bytes=min(limit, READ_CHUNK_BYTES))
    if source.plain:
        return source._raw_head(limit)
    out = bytearray()
    chunks = source.text_chunks()
    try:
        for chunk in chunks:
            out += chunk
            if len(out) >= limit:
                break
    except InputError:
        pass  # what could be decompressed
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(out[:limit])


def _open_error(display: str, exc: OSError) -> InputError:
    reason = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        return InputError(display, "does not exist", "check the path")
    if isinstance(exc, IsADirectoryError):
        return InputError(display, "is a directory, not a file", "pass the files inside it")
    if isinstance(exc, PermissionError):
        return InputError(display, "cannot be read (permission denied)", "check its permissions")
    return InputError(display, f"cannot be read ({reason})")


def _zstd_module_available() -> bool:
    try:
        import zstandard  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def _zstd_available(display: str) -> None:
    if _zstd_module_available() or shutil.which("zstd"):
        return
    raise InputError(
        display,
        "is zstd-compressed, and neither the 'zstandard' Python module nor the 'zstd' program "
        "is available",
        "pip install zstandard (or install the zstd program), or decompress the file first",
    )


def _open_zstd(
    raw: IO[bytes], display: str
) -> tuple[IO[bytes] | _ProcessReader, subprocess.Popen[bytes] | None]:
    if _zstd_module_available():
        import zstandard

        reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return reader, None
    program = shutil.which("zstd")
    if program is None:  # pragma: no cover - checked when the source was made
        _zstd_available(display)
        raise AssertionError("unreachable")
    proc = subprocess.Popen(
        [program, "-d", "-c", "-q"],
        stdin=raw,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    return _ProcessReader(proc), proc


class _ProcessReader(io.RawIOBase):
    """A decompressor subprocess's stdout; a non-zero exit at its end reads as a cut stream."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        super().__init__()
        self._proc = proc
        assert proc.stdout is not None
        self._out = proc.stdout

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._out.read(size)
        if not data and self._proc.wait() != 0:
            raise EOFError("zstd reported an error (cut or corrupt input)")
        return data
