"""The bulk scan's stream keys: which stream (``[rankN]:``, ``[defaultN]:``, none) a line
belongs to, read with numpy from the first ``HEAD`` bytes of many lines at once.

``line_keys`` gives, for each line, the key ``prefixes.strip_prefixes`` would give it, or
``UNSURE`` where these rules cannot be sure (the line then goes the per-line way); it mirrors
the per-line prefix parser and must change with it.  Pure numpy, no state; the C extension
(``_scan.c``) writes these constants again (``tests/ingest/log/test_native_scan.py``).
"""

from __future__ import annotations

import numpy as np

NO_KEY = -1
"""A line's stream key is ``()`` (no prefix)."""
UNSURE = -2
"""The scan cannot tell a line's stream key without the per-line prefix parser."""
DEFAULT_ROLE = 1 << 24
"""Keys: ``N`` for ``[rankN]:``, ``DEFAULT_ROLE + N`` for ``[defaultN]:``."""

HEAD = 32


def _table(chars: bytes) -> np.ndarray:
    table = np.zeros(256, dtype=bool)
    table[np.frombuffer(chars, dtype=np.uint8)] = True
    return table


_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
DIGIT = _table(b"0123456789")
_HOST = _table(_LETTERS + b"0123456789._-")
_LETTER = _table(_LETTERS)
_SPACE = _table(b" ")
OPENS = _table(b"[(")
_DIGIT_OR_SPACE = _table(b" 0123456789")
_NOT_AFTER_BRACKET = ~_table(_LETTERS + b"_0123456789")
_ENDS_AT_ONCE = ~_table(b"[( 0123456789" + _LETTERS + b"\r\x1b\x00")
"""First bytes with which ``_strip_prefixes`` finds no prefix at once (a byte that starts no
prefix; ``\r``, ESC and NUL excepted: cleaning changes those lines)."""


def heads(window: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The first ``HEAD`` bytes from each line start (a short line's newline and the next
    line's bytes follow it: every rule below stops at a newline); ``window`` is
    ``bulk._Lines.window``."""
    return np.ascontiguousarray(window[starts])


def _run(table: np.ndarray, head: np.ndarray, first: int, most: int) -> np.ndarray:
    """How many bytes from column ``first`` on are in ``table`` (at most ``most``)."""
    block = table[head[:, first : first + most]]
    run: np.ndarray = np.cumprod(block, axis=1, dtype=np.int8).sum(axis=1, dtype=np.int64)
    return run


def _number(head: np.ndarray, first: int, count: np.ndarray) -> np.ndarray:
    value = np.zeros(len(head), dtype=np.int64)
    for j in range(int(count.max(initial=0))):
        digit = head[:, first + j].astype(np.int64) - 48
        value = np.where(j < count, value * 10 + digit, value)
    return value


def byte_at(head: np.ndarray, column: np.ndarray) -> np.ndarray:
    byte: np.ndarray = head[np.arange(len(head)), np.minimum(column, HEAD - 1)]
    return byte


def line_keys(head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each line (its ``heads`` row): the stream key ``strip_prefixes`` gives it
    (``UNSURE`` where these rules cannot tell: other prefixes, hosts, Ray, srun, a prefix
    followed by another) and the length of its ``[rankN]:``/``[defaultN]:`` prefix (0: none).

    Mirrors ``prefixes.strip_prefixes``: its fast match (``[roleN]:`` and a space, not followed
    by ``[`` or ``(``), its slow path's stop at a timestamp, and for lines without such a
    prefix, the first step of ``_strip_prefixes`` when it finds nothing."""
    n = len(head)
    c = head
    keys = np.full(n, UNSURE, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    prefixed = np.zeros(n, dtype=bool)
    bracket = c[:, 0] == 91
    rank = bracket & (c[:, 1] == 114) & (c[:, 2] == 97) & (c[:, 3] == 110) & (c[:, 4] == 107)
    default = bracket & (c[:, 1] == 100) & (c[:, 2] == 101) & (c[:, 3] == 102)
    default &= (c[:, 4] == 97) & (c[:, 5] == 117) & (c[:, 6] == 108) & (c[:, 7] == 116)
    for role, at, base in ((rank, 5, 0), (default, 8, DEFAULT_ROLE)):
        rows = np.flatnonzero(role)
        if not len(rows):
            continue
        r = c[rows]
        count = _run(DIGIT, r, at, 7)
        value = _number(r, at, np.minimum(count, 6))
        close = at + count
        ok = (count >= 1) & (count <= 6) & (byte_at(r, close) == 93) & (byte_at(r, close + 1) == 58)
        end = close + 2
        end = end + (byte_at(r, end) == 32)
        after = byte_at(r, end)
        fast = ok & ~OPENS[after]
        # "[rank3]:[2026-...": the slow path takes "[rank3]:" and stops at the timestamp
        dated = ok & (after == 91) & (end + 6 < HEAD) & (byte_at(r, end + 5) == 45)
        for j in range(1, 5):
            dated &= DIGIT[byte_at(r, end + j)]
        sure = fast | dated
        keys[rows[sure]] = base + value[sure]
        lengths[rows[ok]] = end[ok]
        prefixed[rows[ok]] = True
    # No prefix: _strip_prefixes stops at once (rules on the lines without one only).
    plain = np.flatnonzero(~prefixed)
    if len(plain):
        keys[plain[_no_prefix(c[plain])]] = NO_KEY
    # Cleaning turns full-width forms and non-breaking spaces into ASCII, which can make a
    # prefix of what was none: a head with a byte past ASCII is for the prefix parser.
    keys[(c >= 128).any(axis=1)] = UNSURE
    return keys, lengths


def _no_prefix(c: np.ndarray) -> np.ndarray:
    """Which of these lines (without a ``[roleN]:`` prefix) ``_strip_prefixes`` leaves as
    they are."""
    first = c[:, 0]
    none = _ENDS_AT_ONCE[first]
    bracket = np.flatnonzero(first == 91)
    if len(bracket):
        b = c[bracket]
        dated = (_run(DIGIT, b, 1, 4) == 4) & (b[:, 5] == 45)
        none[bracket] = dated | _NOT_AFTER_BRACKET[b[:, 1]]
    numeric = np.flatnonzero(_DIGIT_OR_SPACE[first])
    if len(numeric):
        d = c[numeric]
        spaces = _run(_SPACE, d, 0, 5)
        digits = np.zeros(len(d), dtype=np.int64)
        for count in range(5):
            here = spaces == count
            if here.any():
                digits[here] = _run(DIGIT, d[here], count, 6)
        colon = spaces + digits
        srun = (spaces <= 4) & (digits >= 1) & (digits <= 5)
        srun &= (byte_at(d, colon) == 58) & (byte_at(d, colon + 1) == 32)
        none[numeric] = ~srun
    letter = np.flatnonzero(_LETTER[first])
    if len(letter):
        e = c[letter]
        run = _run(_HOST, e, 0, HEAD)
        host_like = (byte_at(e, run) == 58) & (byte_at(e, run + 1) == 32)
        none[letter] = (run < HEAD - 2) & ~host_like
    result: np.ndarray = none
    return result
