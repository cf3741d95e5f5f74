"""Kernel logs (``dmesg``, ``dmesg -T``, ``journalctl -k``, syslog): OOM kills, the OOM killer's
reports, fatal signals, Xid errors (``oomlens.ingest.log.kernel``)."""

from __future__ import annotations

from typing import ClassVar

import regex

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample

_KERNEL_LINE = regex.compile(
    r"\[\s{0,12}\d{1,10}\.\d{1,9}\] |\[\w{3} \w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4}\] |"
    r"(?:\w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S{0,20}) \S{1,255} kern"
    r"el: |"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d{1,9}(?:[+-]\d\d:?\d\d|Z)? "
)


class KernelLogKind(InputKind):
    id: ClassVar[str] = "kernel_log"
    label: ClassVar[str] = "a kernel log"
    slot: ClassVar[str] = "kernel_logs"
    precedence: ClassVar[int] = 80
    order: ClassVar[int] = 30
    reader: ClassVar[str] = "oomlens.ingest.log.kernel"
    names: ClassVar[tuple[str, ...]] = (
        *(
            pattern
            for stem in ("kernel", "kern", "dmesg", "syslog", "messages")
            for pattern in (stem, f"{stem}[._-]*")
        ),
        "*.kernel.log",  # what oomlens capture's watcher writes per process
    )

    def recognise(self, sample: Sample) -> str | None:
        lines = sample.lines
        kernel_lines = sum(1 for line in lines if _KERNEL_LINE.match(line))
        if lines and kernel_lines * 2 >= len(lines):
            return f"{kernel_lines} of {len(lines)} lines are kernel log lines"
        return None

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        # imported when used (``reader``): tools that only want the kinds' names read nothing
        from oomlens.ingest.log.kernel import read_kernel_log

        kernel = read_kernel_log(found.path)
        return Reading((kernel,), f"{kernel.lines} lines")


KIND = KernelLogKind()
