"""A deterministic share of the runs for one task of a job array (``--shard K/N``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import regex

from oomlens.errors import UsageError
from oomlens.triage.walk import RunSpec

_SHARD = regex.compile(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*")


@dataclass(frozen=True, slots=True)
class Shard:
    """Run ``index`` of ``count`` (1-based) of a job array."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"3/8"`` -> ``Shard(3, 8)``; raises ``UsageError`` for anything else."""
        match = _SHARD.fullmatch(text)
        if match is None:
            raise UsageError(f"--shard {text!r}: expected K/N, e.g. 3/8 (run 3 of 8)")
        index, count = int(match[1]), int(match[2])
        if not 1 <= index <= count:
            raise UsageError(
                f"--shard {text}: K must be between 1 and N (with a SLURM array --array=1-N, "
                "use --shard $SLURM_ARRAY_TASK_ID/N)"
            )
        return cls(index, count)

    def takes(self, run: RunSpec) -> bool:
        """Whether this shard analyzes ``run``: decided by the run's name alone."""
        digest = hashlib.sha256(run.name.encode("utf-8", "surrogateescape")).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index - 1
