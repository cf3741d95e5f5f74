"""The per-rank picture of a failed run: who failed, how, who failed first, who only died
because a peer did (computed by ``oomlens.analysis.ranks``, which says how ranks are judged)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from oomlens.facts import SourceRef
from oomlens.facts.capture import RankCapture
from oomlens.facts.kernel import KernelOomKill
from oomlens.facts.log import ExceptionEvent, LauncherExit, OomEvent, ProcessFailure


@dataclass(frozen=True, slots=True)
class RankStatus:
    """What happened to one rank (``rank`` None: output that names no rank)."""

    rank: int | None
    outcome: str
    """``oom``, ``host_oom_kill``, ``exception``, ``signal``, ``exit_code`` (failed on its
    own), ``peer_failure`` (died because of a peer), ``unknown``."""
    own_failure: bool
    died_because_of_peer: bool
    peer_evidence: str | None
    first_time: datetime | None
    """The earliest time of its own failure's evidence."""
    first_source: SourceRef | None
    exitcode: int | None
    signal: str | None
    oom_events: tuple[OomEvent, ...]
    exceptions: tuple[ExceptionEvent, ...]
    failures: tuple[ProcessFailure, ...]
    kernel_kills: tuple[KernelOomKill, ...]
    attributed: bool
    """Its evidence carried no rank and was attributed to it: to the single rank that failed
    on its own, or to rank 0 of a run that shows no sign of more than one process."""
    captured_kill: RankCapture | None = None
    """Its capture shows it disappeared while the cgroup counted an OOM kill."""


@dataclass(frozen=True, slots=True)
class RankPicture:
    ranks: tuple[RankStatus, ...]
    """Ranks that failed or died, by rank (unranked last)."""
    first_failed: RankStatus | None
    basis: str | None
    """``timestamp``, ``root_cause``, ``line_order``, ``only_one`` or None (words for each:
    ``BASIS_WORDS``)."""
    peer_victims: tuple[int, ...]
    """Ranks that only died because a peer did (never a suspected straggler; output that
    names no rank is not a rank)."""
    timed_out_ranks: tuple[int, ...]
    """Ranks whose NCCL watchdog reported a collective timeout (they were waiting)."""
    suspected_stragglers: tuple[int, ...]
    """When some ranks timed out and no rank failed on its own: the ranks seen in the logs
    that did not time out, i.e. those the others were waiting for (a hang, a slow rank)."""
    launcher_exits: tuple[LauncherExit, ...]
    """DeepSpeed launcher ``exits with return code = N`` lines: a rank failed with N, but the
    launcher does not say which (its printed command is the last spawned rank's)."""
    unranked_run: bool = False
    """The inputs name no rank and show a single process, which is taken as rank 0 (reports
    say "the only process", not "rank 0")."""
    same_time: tuple[int, ...] = ()
    """When several ranks failed on their own at the very same earliest time: those ranks (the
    first one is then chosen by ``basis``, not by time)."""


BASIS_WORDS = {
    "timestamp": "it failed earliest",
    "root_cause": "torchrun's first observed failure",
    "line_order": "it printed its failure first",
    "only_one": "the only rank that failed on its own",
}
"""How the first failed rank was decided (``RankPicture.basis``), in words."""
