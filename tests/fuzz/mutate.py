"""Mutations of real inputs: bytes, lines, JSON values, pickled structures, and hostile text.

Every function takes a seeded ``random.Random`` so that a campaign is reproducible from its
seed.  Nothing here is typed to look like a log: mutations change what real files hold.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pickle
import random
from collections.abc import Callable
from typing import Any

#: Hostile text planted in inputs; none of it may reach an output alive.
PAYLOADS = (
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(2)">',
    '"><svg onload=alert(3)>',
    "javascript:alert(4)",
    '=HYPERLINK("http://example.invalid/x","click")',
    "@SUM(1+1)",
    "+1-1",
    "-2+3",
    "\t=1+2",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "\x9b31m",
    "\u202eevil\u202c",
    "\x07\x08\x00",
    "{{ 7*7 }}",
    "'; DROP TABLE runs;--",
    "](javascript:alert(5))",
)

#: Values that break arithmetic and parsers: huge, negative, odd types.
ODD_VALUES: tuple[Any, ...] = (
    0,
    -1,
    2**63,
    2**70,
    -(2**63),
    10**400,
    1e308,
    float("inf"),
    float("nan"),
    "9" * 4301,
    "auto",
    "A",
    "",
    None,
    True,
    [],
    {},
    [[[[[]]]]],
    "1e10",
    0.5,
)


def payload(rng: random.Random) -> str:
    return rng.choice(PAYLOADS)


# -- bytes ----------------------------------------------------------------------------------


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        if out:
            out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)] if data else data


def splice(data: bytes, rng: random.Random, other: bytes) -> bytes:
    """Part of ``data`` then part of another real file."""
    if not data or not other:
        return data + other
    return data[: rng.randrange(len(data))] + other[rng.randrange(len(other)) :]


def insert_garbage(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    junk = rng.choice(
        [
            bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
            b"\x00" * rng.randint(1, 4096),
            b"\x00" * rng.randint(65_536, 300_000),  # a crash's hole, longer than the sniffed head
            b"\xff\xfe\xfd" * rng.randint(1, 100),
            b"x" * rng.randint(70_000, 300_000),  # one line longer than the reader's cap
            b"\r" * rng.randint(1, 1000),
        ]
    )
    return data[:at] + junk + data[at:]


def compress(data: bytes, rng: random.Random) -> bytes:
    how = rng.choice(["gzip", "bzip2", "xz"])
    packed = (
        gzip.compress(data, mtime=0)
        if how == "gzip"
        else bz2.compress(data)
        if how == "bzip2"
        else lzma.compress(data)
    )
    if rng.random() < 0.3:
        packed = packed[: rng.randrange(1, len(packed) + 1)]  # a cut archive
    return packed


def mutate_bytes(data: bytes, rng: random.Random, other: bytes = b"") -> bytes:
    steps: list[Callable[[bytes], bytes]] = [
        lambda d: flip_bytes(d, rng),
        lambda d: truncate(d, rng),
        lambda d: splice(d, rng, other),
        lambda d: insert_garbage(d, rng),
    ]
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(steps)(data)
    return data


# -- lines ----------------------------------------------------------------------------------


def mutate_lines(data: bytes, rng: random.Random, other: bytes = b"") -> bytes:
    """Line-level changes: drop, duplicate (up to many times), shuffle a stretch, plant hostile
    text inside a line, renumber ranks, swap in lines of another real file."""
    lines = data.split(b"\n")
    others = other.split(b"\n") if other else lines
    for _ in range(rng.randint(1, 6)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        choice = rng.randrange(8)
        if choice == 0:
            del lines[i]
        elif choice == 1:
            lines[i:i] = [lines[i]] * rng.choice([2, 10, 1000, 20_000])
        elif choice == 2:
            j = min(len(lines), i + rng.randint(2, 50))
            stretch = lines[i:j]
            rng.shuffle(stretch)
            lines[i:j] = stretch
        elif choice == 3:
            cut = rng.randrange(len(lines[i]) + 1)
            lines[i] = (
                lines[i][:cut] + payload(rng).encode("utf-8", "surrogateescape") + lines[i][cut:]
            )
        elif choice == 4:
            lines[i] = lines[i].replace(
                b"rank0", b"rank" + str(rng.choice([1, 7, 65535, 10**9])).encode()
            )
        elif choice == 5:
            lines.insert(i, rng.choice(others))
        elif choice == 6:
            lines[i] = _mutate_numbers(lines[i], rng)
        else:
            lines[i] = b"[rank" + str(rng.randint(0, 3)).encode() + b"]: " + lines[i]
    return b"\n".join(lines)


def _mutate_numbers(line: bytes, rng: random.Random) -> bytes:
    """Replace the numbers of a line (sizes, ranks, times) with odd ones."""
    import re

    odd = [b"0", b"-1", b"99999999999999999999999", b"1e308", b"nan", b"9" * 5000, b"00000.0000"]
    return re.sub(rb"\d+(?:\.\d+)?", lambda m: rng.choice(odd + [m.group(0)]), line, count=3)


# -- JSON -----------------------------------------------------------------------------------


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    """Structure-level changes of a real JSON document: odd values, deleted and unknown keys,
    hostile keys and strings, deep nesting, duplicate keys, numbers DeepSpeed never writes."""
    try:
        doc = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rng)
    paths = list(_paths(doc))
    for _ in range(rng.randint(1, 4)):
        if not paths:
            break
        path = rng.choice(paths)
        choice = rng.randrange(6)
        if choice == 0:
            _set(doc, path, rng.choice(ODD_VALUES))
        elif choice == 1:
            _delete(doc, path)
        elif choice == 2:
            _set(doc, path, payload(rng))
        elif choice == 3:
            parent = _get(doc, path[:-1]) if path else doc
            if isinstance(parent, dict):
                parent[payload(rng)] = rng.choice(ODD_VALUES)
        elif choice == 4:
            depth = rng.choice([70, 1000, 5000])
            nested: Any = 1
            for _ in range(min(depth, 900)):
                nested = [nested]
            _set(doc, path, nested)
            if depth > 900:  # deeper than json.dumps goes: written as text
                return _with_text(doc, path, "[" * depth + "]" * depth)
        else:
            text = json.dumps(doc, indent=2)
            return _duplicate_a_key(text, rng).encode()
        paths = list(_paths(doc))
    return json.dumps(doc, indent=rng.choice([None, 2]), allow_nan=True).encode()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in items:
        found.append((*prefix, key))
        found += _paths(value, (*prefix, key))
    return found


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    if path:
        _get(doc, path[:-1])[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    if path:
        del _get(doc, path[:-1])[path[-1]]


def _with_text(doc: Any, path: tuple[Any, ...], raw: str) -> bytes:
    marker = "__oomlens_fuzz_marker__"
    _set(doc, path, marker)
    return json.dumps(doc).replace(json.dumps(marker), raw).encode()


def _duplicate_a_key(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if line.strip().startswith('"') and ":" in line]
    if not keyed:
        return text
    i = rng.choice(keyed)
    line = lines[i] if lines[i].rstrip().endswith(",") else lines[i].rstrip() + ","
    lines.insert(i, line)
    return "\n".join(lines)


# -- pickles --------------------------------------------------------------------------------


def mutate_structure(data: Any, rng: random.Random) -> Any:
    """Changes of a real snapshot's plain data (dicts, lists, scalars) before re-pickling:
    odd values, dropped keys, hostile frame names, repeated segments and blocks."""
    for _ in range(rng.randint(1, 5)):
        path = _random_path(data, rng)
        if not path:
            continue
        choice = rng.randrange(6)
        try:
            target = _get(data, path[:-1])
            if choice == 0:
                target[path[-1]] = rng.choice(ODD_VALUES)
            elif choice == 1:
                del target[path[-1]]
            elif choice == 2:
                target[path[-1]] = payload(rng)
            elif choice == 3 and isinstance(target, list) and target:
                target.extend([target[0]] * rng.choice([10, 1000, 100_000]))
            elif choice == 4 and isinstance(target, dict):
                target[payload(rng)] = [target.get(path[-1])] * rng.randint(1, 100)
            else:
                target[path[-1]] = [[[]] * rng.randint(0, 10)] * rng.randint(0, 1000)
        except (KeyError, IndexError, TypeError):
            continue
    return data


def _random_path(data: Any, rng: random.Random) -> tuple[Any, ...]:
    """A random walk from the root: a path to some node, short or deep (O(depth), not O(size))."""
    path: list[Any] = []
    node = data
    while isinstance(node, dict | list) and node and (not path or rng.random() < 0.8):
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
    return tuple(path)


def repickle(data: Any, rng: random.Random) -> bytes:
    raw = pickle.dumps(data, protocol=rng.choice([2, 3, 4, 5]))
    return gzip.compress(raw, mtime=0) if rng.random() < 0.2 else raw


def hostile_pickle(rng: random.Random, marker: str) -> bytes:
    """Pickles written opcode by opcode: imports and calls (which must never run: they would
    create ``marker``), floods of containers, huge length claims, deep nesting."""
    proto = b"\x80\x04"
    command = f"touch {marker}".encode()
    choices = [
        proto + b"cos\nsystem\n(" + b"X" + len(command).to_bytes(4, "little") + command + b"tR.",
        proto
        + b"\x8c\x02os\x8c\x06system\x93X"
        + len(command).to_bytes(4, "little")
        + command
        + b"\x85R.",
        proto + b"cbuiltins\neval\n(X" + (8).to_bytes(4, "little") + b"1+1+1+1\x85R.",
        proto + b"\x8f" * rng.randint(1000, 2_000_000) + b".",  # EMPTY_SET flood
        proto + b"(" * 100_000 + b"l" * 100_000 + b".",  # nested lists
        proto + b"X" + (2**31 - 1).to_bytes(4, "little") + b"abc",  # a length it does not have
        proto + b"\x8e" + (2**40).to_bytes(8, "little") + b"x",  # BINBYTES8 claim
        proto + b"}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02(" + b"h\x02" * 10_000 + b"eu.",
    ]
    return rng.choice(choices)
