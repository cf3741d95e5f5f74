"""Hostile inputs of the shapes an outside campaign used (issue 33): each must cost one clear
line and a documented exit code, within the time and memory limits, and put nothing a
terminal, a page or a Markdown viewer would act on into an output.

* pickles whose memo opcodes (``PUT``, ``BINPUT``, ``LONG_BINPUT``, ``MEMOIZE``) name huge or
  sparse indices (an unpickler that sizes its memo by the largest index allocates gigabytes),
  alone or before a real snapshot, plain or gzip;
* a real snapshot whose numeric fields hold huge integers, ``None``, floats or strings;
* capture files (``rank<R>.events.jsonl``, ``.series.jsonl``) with a line nested 10,000 to
  100,000 deep;
* file names with bidi controls, Markdown metacharacters and bytes that are not UTF-8;
* ds_configs with 100,000 and more unknown keys, or lone surrogate escapes.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
from collections.abc import Callable
from typing import Any

HUGE_INDICES = (0x10000000, 0x7FFFFFFF, 0xFFFFFFFF, 0x00100000, 0x0FFFFFFF)


def _put(rng: random.Random, index: int) -> tuple[str, bytes]:
    how = rng.choice(["PUT", "BINPUT", "LONG_BINPUT"])
    if how == "PUT":
        return how, b"p" + str(index).encode() + b"\n"
    if how == "BINPUT":
        return how, b"q" + bytes([min(index, 255)])
    return how, b"r" + index.to_bytes(4, "little")


def memo_pickle(rng: random.Random, snapshot: Callable[[], Any]) -> tuple[str, bytes]:
    """A pickle whose memo names a huge or sparse index: alone (a few bytes), in protocol 0,
    with ``MEMOIZE`` after it, as a fetch of an index never stored, or as a sparse entry put
    before a real snapshot's data (which then loads as it would)."""
    index = rng.choice(HUGE_INDICES)
    shape = rng.choice(["alone", "protocol0", "memoize", "get", "before_snapshot"])
    how, put = _put(rng, index)
    if shape == "alone":
        raw = b"\x80\x02]" + put + b"."
    elif shape == "protocol0":
        how, raw = "PUT", b"(lp" + str(index).encode() + b"\n."
    elif shape == "memoize":
        how, raw = (
            "LONG_BINPUT+MEMOIZE",
            (b"\x80\x04N" + b"r" + index.to_bytes(4, "little") + b"0" + b"]\x94" * 3 + b"."),
        )
    elif shape == "get":
        how, raw = (
            "LONG_BINGET",
            b"\x80\x02]r\x00\x00\x00\x00j" + index.to_bytes(4, "little") + b".",
        )
    else:
        protocol = rng.choice([2, 4])
        body = pickle.dumps(snapshot(), protocol=protocol)
        # after PROTO and before protocol 4's first FRAME: outside every frame
        raw = body[:2] + b"N" + put + b"0" + body[2:]
    if rng.random() < 0.5:
        raw = gzip.compress(raw, mtime=0)
        shape += " gzip"
    return f"{how} {index:#x} ({shape})", raw


_NUMERIC = {
    "segments": ("address", "total_size", "allocated_size", "active_size", "requested_size",
                 "device", "stream"),
    "blocks": ("address", "size", "requested_size"),
    "device_traces": ("addr", "size", "time_us", "stream"),
}  # fmt: skip
ODD_NUMBERS: tuple[Any, ...] = (
    10**5000,
    -(10**5000),
    2**64,
    -1,
    None,
    float("nan"),
    float("inf"),
    1e308,
    0.5,
    "0x7f0000000000",
    "",
    True,
)


def odd_fields(data: Any, rng: random.Random) -> list[str]:
    """Set one to three numeric fields of a real snapshot to a huge int, None, a float or a
    string; returns what was set where."""
    done = []
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(sorted(_NUMERIC))
        try:
            if where == "segments":
                record = rng.choice(data["segments"])
            elif where == "blocks":
                record = rng.choice(rng.choice(data["segments"])["blocks"])
            else:
                record = rng.choice(rng.choice([t for t in data["device_traces"] if t]))
        except (IndexError, KeyError, TypeError):
            continue
        key = rng.choice(_NUMERIC[where])
        value = rng.choice(ODD_NUMBERS)
        record[key] = value
        huge = isinstance(value, int) and abs(value) > 2**70
        shown = f"a {value.bit_length()}-bit int" if huge else repr(value)
        done.append(f"{where}.{key}={shown}")
    return done


def nested_line(rng: random.Random, depth: int) -> bytes:
    """A JSON line nested ``depth`` deep, as a capture record or as one of its values."""
    if rng.random() < 0.5:
        inner = b"[" * depth + b"]" * depth
    else:
        inner = b'{"a":' * depth + b"1" + b"}" * depth
    if rng.random() < 0.5:
        return inner
    return (
        b'{"t": 1796123312.5, "kind": "'
        + rng.choice([b"sample", b"oom", b"step"])
        + b'", "data": '
        + inner
        + b"}"
    )


_BIDI = ("\u200e", "\u200f", "\u061c", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
         "\u2066", "\u2067", "\u2068", "\u2069")  # fmt: skip
_MARKDOWN = ("*bold*", "_x_", "`code`", "[x](javascript:alert(1))", "# ", "|a|b|", "<b>",
             "![i](http://example.invalid/i.png)", "\\", "~~s~~", "> ")  # fmt: skip
_NOT_UTF8 = ("\udcff\udcfe", "\udc80", "caf\udce9", "\udcc3\udcc3\udca9")
"""Bytes that are not UTF-8, as Python spells them in a file name (surrogate escapes)."""


def hostile_name(rng: random.Random) -> str:
    count = rng.randint(1, 4)
    pieces = ["train"] + [
        rng.choice(rng.choice([_BIDI, _MARKDOWN, _NOT_UTF8])) for _ in range(count)
    ]
    return "".join(pieces).replace("/", "_")


def many_keys(config: dict[str, Any], rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A real config with 100,000 to 250,000 unknown keys, at the top or in a section."""
    count = rng.randint(100_000, 250_000)
    extra = {f"unknown_option_{n}": n % 7 for n in range(count)}
    where = rng.choice(["top", "zero_optimization", "new section"])
    if where == "top":
        config.update(extra)
    elif where == "zero_optimization" and isinstance(config.get("zero_optimization"), dict):
        config["zero_optimization"].update(extra)
    else:
        config["unknown_section"] = extra
    return f"{count:,} unknown keys ({where})", config


def lone_surrogates(config: dict[str, Any], rng: random.Random) -> tuple[str, bytes]:
    """A real config with a lone surrogate escape (``\\ud800``) in a key, a string value, or
    a value that should be a number."""
    bad = rng.choice(["\ud800", "\udc80", "\udfff", "x\ud83d"])
    where = rng.choice(["key", "value", "number"])
    if where == "key":
        config[bad + "optimizer"] = {"type": "Adam"}
    elif where == "value":
        config.setdefault("optimizer", {"type": "Adam"})
        if isinstance(config["optimizer"], dict):
            config["optimizer"]["type"] = "Adam" + bad
    else:
        config["train_micro_batch_size_per_gpu"] = "4" + bad
    return f"lone surrogate {bad!a} in a {where}", json.dumps(config, indent=2).encode()
