"""The labels of ``see_memory_usage`` memory lines in the bulk scan: the cleaned text of the
line a memory line names as its label, computed once per distinct text.

``Labels`` gives each distinct label text an id (``LABEL_NONE``: no label) as
``LogReader.label_before`` would read it; ``BatchScan.label`` holds those ids and
``BatchScan.labels`` the texts (``native``: the extension groups the texts by key,
``_scan.label_keys``, and asks ``id_of`` once per key).
"""

from __future__ import annotations

import re

from oomlens.ingest.log import deepspeed
from oomlens.ingest.textstream import LineCleaner, StreamStats

LABEL_NONE = -1
LABEL_DEFERRED = -2
"""A memory line whose label the reader must look up itself (the walk met a line whose stream
the scan could not tell, or left the bytes the scan has)."""

STAMPED = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d\d\d\] \[")


class Labels:
    """``label_before``'s text for a label line's bytes after its prefix, computed once per
    distinct text (``strip_logger(clean(raw)).strip()``, None when empty or itself a memory
    line, cut to 200 characters)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}
        self._raw: dict[bytes, int] = {}
        self._cleaner = LineCleaner(StreamStats())

    def id_of(self, raw: bytes) -> int:
        # a logger record's timestamp does not change its message: key the cache on the rest
        key = raw[26:] if STAMPED.match(raw) else raw
        found = self._raw.get(key)
        if found is not None:
            return found
        label = deepspeed.strip_logger(self._cleaner.clean(raw)).strip()
        if not label or "Max_MA" in label or "CPU Virtual Memory" in label:
            ident = LABEL_NONE
        else:
            label = label[:200]
            ident = self._ids.setdefault(label, len(self.texts))
            if ident == len(self.texts):
                self.texts.append(label)
        if len(self._raw) < 65536:
            self._raw[key] = ident
        return ident

    def id_of_text(self, raw: bytes) -> int:
        """The id of a label text ``id_of`` would make of its line (ASCII: ``_scan.c``'s
        ``label_text`` made it so)."""
        text = raw.decode("ascii")
        ident = self._ids.setdefault(text, len(self.texts))
        if ident == len(self.texts):
            self.texts.append(text)
        return ident
