"""What the log reader reads around a line: the label line before a ``see_memory_usage``
line, the CPU line after it, the timestamp of the nearest line before, the input's last lines.

``LineContext`` is a base of ``LogReader`` (``reader``): it holds no state of its own, only
the reader's attributes declared below, which ``LogReader.__init__`` sets.  Every method is a
look behind or ahead from a line in the current block (``prev_tail``: the previous block's last
16 KiB); none changes a fact, and only ``cpu_line_after`` (``consumed_until``) and
``time_before`` (its reused scan, ``_time_scan``) change the reader's state.
"""

from __future__ import annotations

from datetime import datetime

from oomlens.ingest.log import deepspeed
from oomlens.ingest.log.prefixes import strip_prefixes
from oomlens.ingest.log.timestamps import leading_timestamp
from oomlens.ingest.textstream import LineCleaner

TAIL_LINES = 40


class LineContext:
    """The look-arounds of ``LogReader``; see the module docstring."""

    cleaner: LineCleaner
    quiet_cleaner: LineCleaner
    year: int | None
    last_time: datetime | None
    _time_scan: tuple[bytes, int, int, int, datetime | None] | None
    known_hosts: set[str]
    prev_tail: bytes
    end_bytes: bytes
    block_data: bytes
    prefix_chars: int
    consumed_until: int

    def _tail(self, next_line: int) -> tuple[tuple[int, str], ...]:
        """The last ``TAIL_LINES`` lines of the input, from its last 16 KiB (of however many
        blocks: the same lines whatever the block size)."""
        data = self.end_bytes
        if not data:
            return ()
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        lines = lines[1:] if len(data) >= 16384 else lines  # the first may be cut
        lines = lines[-TAIL_LINES:]
        first = next_line - len(lines)
        return tuple((first + i, self.cleaner.clean(raw)[:2000]) for i, raw in enumerate(lines))

    def label_before(
        self, data: bytes, start: int, key: tuple[object, ...], prev_tail: bytes | None = None
    ) -> str | None:
        """The previous line of the same stream (the ``see_memory_usage`` label): the line just
        before when it starts with the same raw prefix, else the nearest of the 16 lines before
        (within 16 KiB, the previous block's tail, ``prev_tail``, included) with the same
        stream key.  A look behind: it counts no repairs (the lines it reads are counted, if
        ever, when they are read themselves)."""
        clean = self.quiet_cleaner.clean
        if start > 0 and self.prefix_chars >= 0:
            # Usually the line just before, with the same raw prefix: no need to re-parse it.
            previous_start = data.rfind(b"\n", 0, start - 1) + 1
            raw_prefix = data[start : start + self.prefix_chars]
            after = previous_start + len(raw_prefix)
            if data.startswith(raw_prefix, previous_start) and data[after : after + 1] not in (
                b"[",
                b"(",
            ):
                raw = data[after : start - 1]
                label = deepspeed.strip_logger(clean(raw)).strip()
                if not label or "Max_MA" in label or "CPU Virtual Memory" in label:
                    return None
                return label[:200]
        window = data[max(0, start - 16384) : start]
        if start < 16384:
            window = (self.prev_tail if prev_tail is None else prev_tail) + window
        end = len(window)
        for _ in range(16):
            if end <= 0:
                return None
            begin = window.rfind(b"\n", 0, end - 1) + 1
            raw = window[begin:end]
            end = begin
            rest, prefix = strip_prefixes(clean(raw), self.known_hosts)
            if prefix.key != key:
                continue
            label = deepspeed.strip_logger(rest).strip()
            if not label or "Max_MA" in label or "CPU Virtual Memory" in label:
                return None
            return label[:200]
        return None

    def cpu_line_after(self, data: bytes, start: int) -> tuple[int, float] | None:
        """The ``CPU Virtual Memory`` line that follows a ``see_memory_usage`` MA line, read
        ahead when it is the next line with the same raw prefix (the scan then skips it)."""
        if self.prefix_chars < 0:
            return None
        end = data.find(b"\n", start)
        if end < 0:
            return None
        following = end + 1
        prefix = data[start : start + self.prefix_chars]
        if not data.startswith(prefix + b"CPU Virtual Memory", following):
            return None
        stop = data.find(b"\n", following)
        stop = len(data) if stop < 0 else stop
        text = data[following + len(prefix) : stop].decode("ascii", "replace")
        cpu = deepspeed.parse_cpu_line(text)
        if cpu is not None:
            self.consumed_until = stop
        return cpu

    def time_before(self, data: bytes, start: int, lines: int = 64) -> datetime | None:
        """The timestamp of the nearest line before ``start`` that has one (within ``lines``
        lines and 16 KiB), else the last time seen.  A scan from a later start in the same
        block stops where the previous one began and reuses what it found: a log of
        thousands of OOM messages in a row costs one scan of each line, not 64.  Near the
        start of a block the previous block's tail is looked through too, so that where blocks
        are cut changes no timestamp (those scans are not reused: at most 16 KiB per block)."""
        if start < 16384 and data is self.block_data and self.prev_tail:
            head = self.prev_tail[-(16384 - start) :]
            data, start = head + data[:start], len(head) + start
        floor = max(0, start - 16384)
        stop, found_at, found = floor, -1, None
        last = self._time_scan
        if last is not None and last[0] is data and last[1] == lines and floor <= last[2] <= start:
            stop, found_at, found = last[2], last[3], last[4]
        end = start
        for _ in range(lines):
            if end <= stop:
                break
            newline = data.rfind(b"\n", stop, end - 1)
            begin = newline + 1 if newline >= 0 else stop
            raw = data[begin:end]
            end = begin
            rest, _ = strip_prefixes(self.cleaner.clean(raw))
            when, _ = leading_timestamp(rest, self.year)
            if when is not None:
                found_at, found = begin, when
                break
        if found_at < floor:
            found = None
        self._time_scan = (data, lines, start, found_at, found)
        return found if found is not None else self.last_time
