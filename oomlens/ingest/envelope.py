"""Unwrap the envelopes logs travel in, so that readers see the lines a program printed.

A training log does not always reach the user as the bytes the program wrote:

* Windows PowerShell's ``>`` writes UTF-16LE with a byte order mark (``Out-File``'s default;
  some tools write it without one, or big-endian);
* ``kubectl logs --timestamps`` puts an RFC 3339 time (``2024-01-01T00:00:00.123456789Z``) and a
  space before every line;
* the container runtime's own log files (CRI, what ``/var/log/pods`` holds) put
  ``<time> <stdout|stderr> <F|P> `` before every line, ``P`` marking a part of a long line
  that the next entry continues;
* Docker's json-file driver writes one JSON object per entry, ``{"log": "...\\n", "stream":
  "stderr", "time": "..."}``, a line over 16 KiB split into entries of which only the last
  ends with ``\\n``;
* structured logging writes one JSON object per record, its text under a message field
  (``message``, ``msg``, ``log``, ``text``, journald's ``MESSAGE``...) and a traceback, when
  there is one, under another (``exc_info``, ``exception``, ``stack_trace``...).

``sniff_envelope(head)`` tells the envelope from the first decompressed bytes of a file, by
content only (never the name), and only on strong evidence: most of the first lines must carry
it.  ``unwrap(envelope, chunks)`` turns a stream of chunks of the file into a stream of the
UTF-8 text the envelope carries (partial lines joined), in bounded memory: one chunk and one
line of at most ``MAX_ENTRY_BYTES`` are held at a time.  Lines that do not carry the envelope
(a raw traceback interleaved with JSON records, say) are passed through as they are.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from enum import StrEnum


class Envelope(StrEnum):
    """What a log's lines are wrapped in."""

    NONE = "none"
    KUBECTL = "kubectl logs --timestamps"
    CRI = "a container runtime (CRI) log file"
    DOCKER_JSON = "Docker's json-file log"
    JSON_LINES = "JSON lines (structured logging)"


class Encoding(StrEnum):
    """How the text is encoded, when not UTF-8."""

    UTF8 = "utf-8"
    UTF16LE = "utf-16-le"
    UTF16BE = "utf-16-be"


MAX_ENTRY_BYTES = 1 << 20
"""A wrapped line longer than this is passed on as it is, unparsed (its carried text is cut by
the line reader anyway)."""

_SNIFF_LINES = 200
_SNIFF_UTF16_BYTES = 4096
_ZEROS = re.compile(rb"\x00{2,}")

_RFC3339 = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
"""Go's ``time.RFC3339Nano`` as kubelet and the container runtimes write it: a ``.`` before the
fraction (dmesg's ISO times use a ``,``), trailing zeros of the fraction dropped."""
_KUBECTL = re.compile(rb"(?m)^" + _RFC3339 + rb" ")
_CRI = re.compile(rb"(?m)^" + _RFC3339 + rb" (?:stdout|stderr) (?:F |P ([^\n]*?)\r?\n)")
"""A CRI entry's prefix; a partial (``P``) entry's text is kept without its line end, so the
next entry continues it.  The runtime ends each entry with ``\\n``; a file whose line ends
became ``\\r\\n`` on its way (a Windows editor, a copy through a Windows share) has a CR
there, which would otherwise land inside the joined line, where a reader takes it for a
carriage return redraw and drops what came before it."""
_CRI_LINE = re.compile(rb"^" + _RFC3339 + rb" (?:stdout|stderr) [FP] ")

_MESSAGE_KEYS = ("message", "msg", "log", "text", "MESSAGE", "textPayload", "event")
"""Where structured loggers put a record's text: python-json-logger and GCP ``message``,
zap/logrus/pino/bunyan ``msg``, fluentd/Docker ``log``, loguru ``text``, journald's JSON output
``MESSAGE``, Cloud Logging ``textPayload``, structlog ``event``."""
_EXCEPTION_KEYS = ("exc_info", "exception", "exc_text", "stack_trace", "stacktrace", "traceback")
"""Where they put the traceback of a record logged with one."""


def without_nul_units(data: bytes) -> bytes:
    """``data`` without its two-byte units of zeros, counted from its start: a hole of zero
    bytes a crashed writer left (``oomlens.ingest.detect``), which in UTF-16 is whole NUL
    characters and in UTF-8 zeroes both halves of a unit alike, so says nothing of which it
    is; what is left is the text that does."""
    if b"\x00\x00" not in data:
        return data
    out = bytearray()
    last = 0
    for run in _ZEROS.finditer(data):
        start = run.start() + run.start() % 2  # the first unit that starts inside the run
        end = start + (run.end() - start) // 2 * 2
        if end > start:
            out += data[last:start]
            last = end
    out += data[last:]
    return bytes(out)


def _decodes_strictly(data: bytes, codec: str) -> bool:
    data = data[: len(data) - len(data) % 2]
    try:
        codecs.getincrementaldecoder(codec)("strict").decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


def sniff_encoding(head: bytes) -> Encoding:
    """UTF-16 when ``head`` says so: a byte order mark followed by text that decodes (random
    bytes after ``FF FE`` soon hold an unpaired surrogate) and whose line breaks are UTF-16's
    (a UTF-8 log after stray ``FF FE`` bytes decodes too, but its newline bytes fall anywhere,
    not as the code unit ``U+000A``), or, without a mark, the zero high bytes of mostly-ASCII
    text on every other byte; else UTF-8."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) and len(head) >= 4:
        codec = Encoding.UTF16LE if head[:1] == b"\xff" else Encoding.UTF16BE
        body = head[2 : 2 + _SNIFF_UTF16_BYTES]
        if not _decodes_strictly(head[2:], codec.value):
            return Encoding.UTF8
        breaks = b"\n" not in body or "\n" in body.decode(codec.value, "replace")
        return codec if breaks else Encoding.UTF8
    sample = without_nul_units(head)[:_SNIFF_UTF16_BYTES]
    pairs = len(sample) // 2
    if pairs < 8:
        return Encoding.UTF8
    even_zero = sample[0 : 2 * pairs : 2].count(0)
    odd_zero = sample[1 : 2 * pairs : 2].count(0)
    # Without its holes (``without_nul_units``) UTF-8 text has no zero byte; UTF-16 of mostly
    # ASCII text has one in every high byte, and in the low byte of the characters U+xx00
    # (box drawing's U+2500 of a rich traceback, Latin Extended's U+0100...): fewer there
    for codec, high, low in (
        (Encoding.UTF16LE, odd_zero, even_zero),
        (Encoding.UTF16BE, even_zero, odd_zero),
    ):
        if high >= 0.7 * pairs and 2 * low < high and _decodes_strictly(sample, codec.value):
            return codec
    return Encoding.UTF8


def _json_object(line: bytes) -> dict[str, object] | None:
    """``line`` as a JSON object, or None when it is not one."""
    if not line.startswith(b"{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _json_text(line: bytes) -> bytes | None:
    """The text a JSON record carries (its message, then its traceback), each line ended;
    None when ``line`` is no JSON object with a message field."""
    record = _json_object(line)
    if record is None:
        return None
    parts: list[str] = []
    for key in _MESSAGE_KEYS:
        value = record.get(key)
        if isinstance(value, str):
            parts.append(value)
            break
    else:
        return None
    for key in _EXCEPTION_KEYS:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            parts.append(value)
    text = "\n".join(part.rstrip("\n") for part in parts) + "\n"
    return text.encode("utf-8", "replace")


def _docker_text(line: bytes) -> bytes | None:
    """A json-file entry's ``log``, as written: a split line's parts carry no ``\\n``."""
    record = _json_object(line)
    value = record.get("log") if record is not None else None
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "replace")


def _is_docker_entry(line: bytes) -> bool:
    if not line.startswith(b'{"log":'):
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("log"), str) and "stream" in record


_LINE_PREFIXES = (Envelope.KUBECTL, Envelope.CRI)


def sniff_envelope(head: bytes) -> Envelope:
    """The envelope of a text whose first bytes (UTF-8) are ``head``: the one that most of the
    first complete lines (at least half of them, and the first) carry; else ``Envelope.NONE``."""
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()][:_SNIFF_LINES]
    if not lines:
        return Envelope.NONE
    lines = [line.rstrip(b"\r") for line in lines]
    checks = (
        (Envelope.CRI, lambda line: _CRI_LINE.match(line) is not None),
        (Envelope.KUBECTL, lambda line: _KUBECTL.match(line) is not None),
        (Envelope.DOCKER_JSON, _is_docker_entry),
        (Envelope.JSON_LINES, lambda line: _json_text(line) is not None),
    )
    for envelope, carries in checks:
        if not carries(lines[0]):
            continue
        count = sum(1 for line in lines if carries(line))
        if 2 * count >= len(lines) and (count >= 2 or envelope in _LINE_PREFIXES):
            # one JSON object is a document (a torchelastic error file), not a log of records
            return envelope
    return Envelope.NONE


def decode_utf16(encoding: Encoding, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The UTF-8 text of a UTF-16 stream (a byte order mark dropped, unpaired surrogates and a
    cut last code unit replaced by U+FFFD)."""
    decoder = codecs.getincrementaldecoder(encoding.value)("replace")
    first = True
    for chunk in chunks:
        text = decoder.decode(chunk)
        if first and text:
            text = text.removeprefix("\ufeff")
            first = False
        if text:
            yield text.encode("utf-8", "replace")
    rest = decoder.decode(b"", final=True)
    if rest:
        yield rest.encode("utf-8", "replace")


def sniff_envelopes(head: bytes) -> tuple[Envelope, ...]:
    """The envelopes around a text whose first bytes (UTF-8) are ``head``, outermost first: a
    runtime's envelope may carry a structured logger's records (a CRI file of a JSON logger)."""
    found: list[Envelope] = []
    for _ in range(2):
        envelope = sniff_envelope(head)
        if envelope is Envelope.NONE:
            break
        found.append(envelope)
        head = _unwrap_lines(envelope, head[: head.rfind(b"\n") + 1])
    return tuple(found)


def unwrap(envelopes: tuple[Envelope, ...], chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The text ``envelopes`` (outermost first) carry, from a stream of the enveloped bytes
    (any chunking)."""
    for envelope in envelopes:
        chunks = _unwrap_one(envelope, chunks)
    return chunks


def _unwrap_one(envelope: Envelope, chunks: Iterator[bytes]) -> Iterator[bytes]:
    carry = b""
    for chunk in chunks:
        data = carry + chunk if carry else chunk
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) > MAX_ENTRY_BYTES:
                yield data  # no envelope wraps lines this long: pass it on
                data = b""
            carry = data
            continue
        carry = data[end:]
        out = _unwrap_lines(envelope, data[:end])
        if out:
            yield out
    if carry:
        # a last line without its end: unwrapped as if it had one, and left without
        yield _unwrap_lines(envelope, carry + b"\n").removesuffix(b"\n")


def _unwrap_lines(envelope: Envelope, data: bytes) -> bytes:
    """``data`` (whole lines) unwrapped."""
    if envelope is Envelope.KUBECTL:
        return _KUBECTL.sub(b"", data)
    if envelope is Envelope.CRI:
        return _CRI.sub(rb"\1", data)
    carried = _docker_text if envelope is Envelope.DOCKER_JSON else _json_text
    out: list[bytes] = []
    for line in data.split(b"\n")[:-1]:
        text = carried(line.rstrip(b"\r"))
        out.append(text if text is not None else line + b"\n")
    return b"".join(out)
