"""How a log reaches a user, as byte transformations of a real log that keep its meaning.

A crash log that a user pastes or a collector ships is the same log with transport around it:
line ends (CRLF), terminal colours and progress bars, tab indents, the prefix each launcher
puts before a rank's lines, a Markdown paste, holes of zero bytes where a writer crashed, a
second run's lines interleaved, one very long line, compression (cut after the crash lines
are in, as a copy stopped mid-transfer), the log formats of Kubernetes (``kubectl logs
--timestamps``, CRI files), structured logging (JSON lines), Docker's json-file driver, and
UTF-16 (what Windows PowerShell's ``>`` writes).  None of them changes what the log says
happened, so none may change the verdict's direction (``oracles.direction``).

``transport(data, rng, healthy)`` applies one or two of them in the order they would happen
(inside the log first, then the container around it, then the bytes on disk) and returns the
new bytes, the file name suffix the result would carry, and the names of the shapes applied.
"""

from __future__ import annotations

import gzip
import json
import lzma
import random
import re
import subprocess
import zlib
from collections.abc import Callable

_CRASH_START = re.compile(rb"Traceback \(most recent call last\)|Error|error:|Killed|out of memory")

#: (name, tier, function): tier 0 works on the log's lines, 1 wraps them in a container
#: format, 2 changes line ends, 3 encodes the bytes.  At most one shape of tiers 1 and 3.
Shape = Callable[[bytes, random.Random, bytes], bytes]


def crash_start(lines: list[bytes]) -> int:
    """Index of the first line of the crash: the last traceback's head, else the last line
    that names an error or a kill, else three lines from the end."""
    for i in range(len(lines) - 1, -1, -1):
        if b"Traceback (most recent call last)" in lines[i]:
            return i
    for i in range(len(lines) - 1, -1, -1):
        if _CRASH_START.search(lines[i]):
            return i
    return max(0, len(lines) - 3)


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


# -- tier 0: inside the log ------------------------------------------------------------------

_SGR = (b"\x1b[31m", b"\x1b[1;31m", b"\x1b[0;33m", b"\x1b[1m", b"\x1b[38;5;196m", b"\x1b[91m")
_RESET = (b"\x1b[0m", b"\x1b[m", b"\x1b[39m")


def ansi(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Colours around words and whole lines (rich, loguru, coloredlogs), and tqdm's progress
    bars redrawn in place with carriage returns, erase-line and cursor-up sequences."""
    out = []
    how = rng.choice(["words", "lines", "tqdm", "all"])
    for line in _lines(data):
        if how in ("words", "all") and line and rng.random() < 0.5:
            words = line.split(b" ")
            for _ in range(rng.randint(1, 3)):
                k = rng.randrange(len(words))
                if words[k]:
                    words[k] = rng.choice(_SGR) + words[k] + rng.choice(_RESET)
            line = b" ".join(words)
        if how in ("lines", "all") and line and rng.random() < 0.5:
            line = rng.choice(_SGR) + line + rng.choice(_RESET)
        if how in ("tqdm", "all") and rng.random() < 0.1:
            out.append(_tqdm(rng))
        out.append(line)
    return b"\n".join(out)


def _tqdm(rng: random.Random) -> bytes:
    total = rng.choice([100, 500, 1875])
    parts = []
    for step in sorted(rng.sample(range(1, total), min(total - 1, rng.randint(2, 12)))):
        done = int(10 * step / total)
        bar = ("\u2588" * done + " " * (10 - done)).encode()
        frame = (
            f"{step * 100 // total:3d}%|".encode()
            + bar
            + f"| {step}/{total} [00:{step % 60:02d}<00:10, 4.2it/s]".encode()
        )
        parts.append(b"\r" + frame + rng.choice([b"", b"\x1b[K", b"\x1b[A", b"\x1b[2K"]))
    return b"".join(parts)


def tabs(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Indents as tabs (a traceback's four spaces per level), or one tab before each line."""
    if rng.random() < 0.5:
        return b"\n".join(b"\t" + line if line else line for line in _lines(data))
    return re.sub(rb"(?m)^((?:    )+)", lambda m: b"\t" * (len(m.group(1)) // 4), data)


def rank_prefix(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """The prefix each launcher puts before a process's lines: torchrun's ``--tee``
    (``[rank3]:``, with or without a space, ``[default0]:``), ``srun --label`` (``3: ``),
    pdsh (``host: ``), Lightning (``[rank: 0] ``)."""
    rank = rng.choice([0, 1, 3, 7, 15])
    prefix = rng.choice(
        [
            f"[rank{rank}]:",
            f"[rank{rank}]: ",
            f"[default{rank}]:",
            f"{rank}: ",
            f"{rank:>2}: ",
            f"gpu-node-{rank:02d}: ",
            f"[rank: {rank}] ",
        ]
    ).encode()
    return b"\n".join(prefix + line if line else line for line in _lines(data))


def nul_holes(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Runs of zero bytes where a crashed or preempted writer left a hole, between lines."""
    lines = _lines(data)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(lines) + 1)
        size = rng.choice([rng.randint(1, 4096), rng.randint(65_536, 300_000)])
        lines.insert(at, b"\x00" * size)
    return b"\n".join(lines)


def interleave(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Another (healthy) run's lines interleaved line by line with this log's, each log's
    order kept: two jobs writing to one file."""
    mine, theirs = _lines(data), _lines(healthy)
    out: list[bytes] = []
    i = j = 0
    while i < len(mine) or j < len(theirs):
        if j >= len(theirs) or (i < len(mine) and rng.random() < 0.5):
            out.append(mine[i])
            i += 1
        else:
            out.append(theirs[j])
            j += 1
    return b"\n".join(out)


def long_line(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """One line of 1-3 MiB before the crash: a progress bar redrawn with carriage returns and
    never ended, or a dump printed on one line."""
    lines = _lines(data)
    size = rng.randint(1 << 20, 3 << 20)
    joiner = rng.choice([b"\r", b" ", b"\\n"])
    pieces = [p for p in _lines(healthy) if p.strip()] or [b"step"]
    one = joiner.join(pieces)
    line = (one + joiner) * (size // (len(one) + 1) + 1)
    lines.insert(crash_start(lines), line[:size])
    return b"\n".join(lines)


# -- tier 1: a container around the lines ----------------------------------------------------


def markdown(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """A paste in an issue or a chat: a heading, a sentence, the log in a fenced block."""
    fence = rng.choice([b"```", b"```text", b"```python", b"```console", b"~~~"])
    close = b"~~~" if fence == b"~~~" else b"```"
    head = rng.choice(
        [b"## Training crashes after a few steps\n\n", b"### Error\n\n", b"**Logs**\n\n", b""]
    )
    sentence = rng.choice(
        [
            b"I get this error when running the script on 8 GPUs:\n\n",
            b"Full log below (the last lines are the important part).\n\n",
            b"Here is the output:\n",
        ]
    )
    tail = rng.choice([b"\n\nAny idea what is wrong?\n", b"\n", b"\n\nThanks!"])
    return head + sentence + fence + b"\n" + data.rstrip(b"\n") + b"\n" + close + tail


def _times(rng: random.Random) -> Callable[[], str]:
    ns = rng.randrange(10**9)
    second = [rng.randrange(3600)]

    def tick() -> str:
        nonlocal ns
        ns += rng.randrange(10**7)
        if ns >= 10**9:
            ns -= 10**9
            second[0] += 1
        m, s = divmod(second[0], 60)
        return f"2026-12-07T10:{m % 60:02d}:{s:02d}.{ns:09d}Z"

    return tick


def kubectl(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """``kubectl logs --timestamps``: an RFC 3339 time with nanoseconds and a space."""
    tick = _times(rng)
    return b"\n".join(tick().encode() + b" " + line for line in _lines(data))


def cri(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """A CRI log file (containerd, CRI-O): ``<time> <stream> <P|F> <text>``, a line longer
    than the runtime's buffer split into partial (``P``) parts ended by a full (``F``) one."""
    tick = _times(rng)
    part = rng.choice([80, 200, 16_384])
    start = crash_start(_lines(data))
    out = []
    for n, line in enumerate(_lines(data)):
        stream = b"stderr" if n >= start or rng.random() < 0.5 else b"stdout"
        chunks = [line[k : k + part] for k in range(0, len(line), part)] or [b""]
        for k, chunk in enumerate(chunks):
            tag = b"F" if k == len(chunks) - 1 else b"P"
            out.append(tick().encode() + b" " + stream + b" " + tag + b" " + chunk)
    return b"\n".join(out) + b"\n"


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace")


def json_lines(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Structured logging: one JSON object a line, the log line in ``message`` (or ``msg``)."""
    lines = _lines(data)
    start = crash_start(lines)
    tick = _times(rng)
    key = rng.choice(["message", "msg"])
    out = []
    for n, line in enumerate(lines):
        record: dict[str, object] = {"level": "error" if n >= start else "info", key: _text(line)}
        if rng.random() < 0.5:
            record = {"time": tick(), **record}
        out.append(json.dumps(record, ensure_ascii=rng.random() < 0.5).encode())
    return b"\n".join(out) + b"\n"


def docker(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """Docker's json-file driver: ``{"log": "<line>\\n", "stream": ..., "time": ...}``."""
    lines = _lines(data)
    start = crash_start(lines)
    tick = _times(rng)
    out = []
    for n, line in enumerate(lines):
        stream = "stderr" if n >= start or rng.random() < 0.5 else "stdout"
        out.append(json.dumps({"log": _text(line) + "\n", "stream": stream, "time": tick()}))
    return ("\n".join(out) + "\n").encode()


# -- tier 2: line ends -----------------------------------------------------------------------


def crlf(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


# -- tier 3: bytes on disk -------------------------------------------------------------------


def _zstd(data: bytes) -> bytes:
    return subprocess.run(
        ["zstd", "-q", "-c", "-3"], input=data, capture_output=True, check=True
    ).stdout


def _shortest_complete(packed: bytes, unpack: Callable[[bytes], bytes], full: int) -> int:
    """The shortest prefix of ``packed`` a streaming decompressor turns into all ``full``
    bytes (so that a cut after it loses none of the log, only the stream's end)."""
    low, high = 1, len(packed)
    while low < high:
        mid = (low + high) // 2
        if len(unpack(packed[:mid])) >= full:
            high = mid
        else:
            low = mid + 1
    return low


def _gunzip_prefix(data: bytes) -> bytes:
    return zlib.decompressobj(wbits=31).decompress(data)


def _unxz_prefix(data: bytes) -> bytes:
    try:
        return lzma.LZMADecompressor().decompress(data)
    except lzma.LZMAError:
        return b""


def compressed(data: bytes, rng: random.Random, healthy: bytes) -> tuple[bytes, str]:
    """Gzip, xz or zstd; half of them cut after the log's last byte is in (the stream's end,
    its check and its index lost), as a copy stopped mid-transfer."""
    how = rng.choice(["gz", "xz", "zst"])
    if how == "gz":
        packed = gzip.compress(data, mtime=0)
    elif how == "xz":
        packed = lzma.compress(data)
    else:
        packed = _zstd(data)
    if rng.random() < 0.5:
        if how == "gz":
            keep = _shortest_complete(packed, _gunzip_prefix, len(data))
        elif how == "xz":
            keep = _shortest_complete(packed, _unxz_prefix, len(data))
        else:
            keep = len(packed) - 4  # the frame's checksum: zstd writes one by default
        if keep < len(packed):
            packed = packed[: rng.randint(keep, len(packed) - 1)]
            return packed, f".{how}"
    return packed, f".{how}"


def utf16(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """UTF-16LE, with a BOM (PowerShell 5's ``>``) or without."""
    text = data.decode("utf-8", "replace").encode("utf-16-le")
    return (b"\xff\xfe" + text) if rng.random() < 0.5 else text


TIER0: dict[str, Shape] = {
    "ansi": ansi,
    "tabs": tabs,
    "rank_prefix": rank_prefix,
    "nul_holes": nul_holes,
    "interleave": interleave,
    "long_line": long_line,
}
TIER1: dict[str, Shape] = {
    "markdown": markdown,
    "kubectl": kubectl,
    "cri": cri,
    "json_lines": json_lines,
    "docker": docker,
}
TIER3 = ("compressed", "utf16")
SHAPES = (*TIER0, *TIER1, "crlf", *TIER3)


def transport(data: bytes, rng: random.Random, healthy: bytes) -> tuple[bytes, str, list[str]]:
    """One or two shapes applied in the order they happen; returns the bytes, the name
    suffix the file gets (``.gz``, ``.xz``, ``.zst`` or ``""``) and the shapes' names."""
    chosen = rng.sample(SHAPES, rng.randint(1, 2))
    if sum(name in TIER1 for name in chosen) > 1 or sum(name in TIER3 for name in chosen) > 1:
        chosen = chosen[:1]
    order = {name: (0 if name in TIER0 else 1 if name in TIER1 else 2 if name == "crlf" else 3)
             for name in chosen}  # fmt: skip
    chosen.sort(key=order.__getitem__)
    suffix = ""
    for name in chosen:
        if name in TIER0:
            data = TIER0[name](data, rng, healthy)
        elif name in TIER1:
            data = TIER1[name](data, rng, healthy)
        elif name == "crlf":
            data = crlf(data, rng, healthy)
        elif name == "compressed":
            data, suffix = compressed(data, rng, healthy)
        else:
            data = utf16(data, rng, healthy)
    return data, suffix, chosen


def pad(data: bytes, rng: random.Random, healthy: bytes) -> bytes:
    """The log after 1.1-2.6 MiB of another run's real healthy lines (a long run before its
    crash): past the paste path's 1 MiB, onto the bulk path."""
    size = rng.randint(1_150_000, 2_700_000)
    body = healthy.rstrip(b"\n") + b"\n"
    padding = body * (size // max(1, len(body)) + 1)
    return padding[:size].rsplit(b"\n", 1)[0] + b"\n" + data
