"""Times printed at the start of log lines, as naive datetimes.

Forms: DeepSpeed/Python logging ``[2026-11-30 04:59:45,737]``; glog-style agent lines
``W1130 04:59:45.737000 2167 path:line]``; c10 ``[E1130 04:58:18.033935144 File.cpp:607]``
(also after a ``[rankN]:`` prefix); ISO ``2026-11-30 04:59:45`` / ``2026-11-30T04:59:45``;
torchrun summaries ``2026-11-30_04:59:49``; ``dmesg -T`` ``[Mon Nov 30 04:58:18 2026]``;
syslog/journal ``Nov 30 04:58:18``.  Forms without a year take ``year`` (the caller's best
guess: the last full date seen, else the file's modification year).
"""

from __future__ import annotations

from datetime import datetime

from oomlens.lazyregex import lazy_regex

_ISO = lazy_regex(r"\[?(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[,.](\d{1,9}))?")
_GLOG = lazy_regex(r"\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_DMESG_T = lazy_regex(r"\[(?:\w{3}) (\w{3}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_SYSLOG = lazy_regex(r"(\w{3}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)\b")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}


def _micro(fraction: str | None) -> int:
    if not fraction:
        return 0
    return int((fraction + "000000")[:6]) if len(fraction) != 3 else int(fraction) * 1000


def _make(
    year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int
) -> datetime | None:
    try:
        return datetime(year, month, day, hour, minute, second, micro)
    except ValueError:
        return None


def leading_timestamp(text: str, year: int | None) -> tuple[datetime | None, bool]:
    """``(time, has_year)`` from the start of ``text`` (at most 2 characters in), or
    ``(None, False)``."""
    head = text[:40]
    match = _ISO.match(head) or _ISO.match(head, 1)
    if match is not None:
        g = match.groups()
        return _make(
            int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5]), _micro(g[6])
        ), True
    match = _GLOG.match(head)
    if match is not None and year is not None:
        g = match.groups()
        return _make(
            year, int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), _micro(g[5])
        ), False
    match = _DMESG_T.match(head)
    if match is not None and match.group(1) in _MONTHS:
        g = match.groups()
        return _make(int(g[5]), _MONTHS[g[0]], int(g[1]), int(g[2]), int(g[3]), int(g[4]), 0), True
    match = _SYSLOG.match(head)
    if match is not None and year is not None and match.group(1) in _MONTHS:
        g = match.groups()
        return _make(year, _MONTHS[g[0]], int(g[1]), int(g[2]), int(g[3]), int(g[4]), 0), False
    return None, False


def parse_any(text: str, year: int | None = None) -> datetime | None:
    """A time printed anywhere in a short field (e.g. torchrun's ``2026-11-30_04:59:49``)."""
    match = _ISO.search(text[:200])
    if match is None:
        return None
    g = match.groups()
    return _make(int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5]), _micro(g[6]))
