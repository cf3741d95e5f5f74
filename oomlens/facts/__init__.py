"""Typed, immutable facts: what the inputs say, with where they say it.

Parsers (``oomlens.ingest``) produce facts, analysis processors derive facts from facts,
rules read only facts.  Every fact that came from a line of a file carries a ``SourceRef``
so that a diagnosis can quote it.  One module per input kind.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a fact was read: the input file, the 1-based line, and the rank/host it belongs to.

    ``line`` is None for facts about a whole file (a snapshot, a config).  ``rank`` is the
    global rank when the log says it (``[rank3]:``), else the local rank of a launcher prefix
    (``[default3]:``), else None.  ``host`` comes from a pdsh/srun ``host: `` prefix.
    """

    path: str
    line: int | None = None
    rank: int | None = None
    host: str | None = None

    def describe(self) -> str:
        """``run.log:1234 (rank 3 on node-a)``: how evidence is cited in reports."""
        text = self.path if self.line is None else f"{self.path}:{self.line}"
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.host is not None:
            where.append(f"on {self.host}")
        if where:
            text += " (" + " ".join(where) + ")"
        return text
