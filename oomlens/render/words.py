"""The report's facts in words, the same in every human format (text, Markdown, HTML).

Facts carry short machine names (``basis="only_one"``, ``origin="world_info"``,
``history="alloc_history"``) that the JSON keeps; a person reads these instead.  Nothing here
claims more than the facts do: a run whose output names no rank is "the only process", not
"rank 0"; ranks that failed at the same moment are said to, not ordered by time.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from oomlens.facts.account import Term, TermBasis
from oomlens.facts.log import OomEvent
from oomlens.facts.ranks import BASIS_WORDS, RankPicture, RankStatus
from oomlens.facts.run import WorldSizeFact
from oomlens.facts.snapshot import HistoryMode, StackDepth

OUTCOME_WORDS = {
    "oom": "out of memory",
    "host_oom_kill": "killed by the kernel for host memory",
    "exception": "an exception",
    "signal": "a signal",
    "exit_code": "a non-zero exit",
    "peer_failure": "died because a peer did",
    "unknown": "unknown",
}

_WORLD_ORIGINS = {
    "world_info": "the launcher's WORLD INFO DICT",
    "dist_world_size": "the launcher's dist_world_size",
    "config": "the world_size the log printed",
    "config_dump": "DeepSpeed's config dump",
    "torchrun_summary": "the ranks torchrun's failure summary lists",
}

HISTORY_WORDS = {
    HistoryMode.ALLOC_HISTORY: "allocation history recorded",
    HistoryMode.STATE_ONLY: "live blocks only (no allocation history)",
    HistoryMode.NONE: "no allocation history",
}

STACK_WORDS = {
    StackDepth.NONE: "no stacks",
    StackDepth.PYTHON: "Python stacks",
    StackDepth.PYTHON_AND_NATIVE: "Python and C++ stacks",
}

TERM_WORDS = {
    Term.MODEL_STATES: "model states",
    Term.ACTIVATIONS: "activations",
    Term.EVAL_OUTPUTS: "evaluation outputs",
    Term.KV_CACHE: "KV cache (generation)",
    Term.OTHER_LIVE: "other live tensors",
    Term.REQUEST: "the failed request",
    Term.CACHED_UNUSED: "cached, not allocated",
    Term.NON_PYTORCH: "outside PyTorch",
    Term.OTHER_PROCESSES: "other processes",
}
"""A memory account's terms (``oomlens.facts.account.Term``) as a table's first column."""

TERM_BASIS_WORDS = {
    TermBasis.MEASURED: "measured",
    TermBasis.MODEL: "ZeRO memory model",
    TermBasis.ARITHMETIC: "arithmetic",
    TermBasis.REMAINDER: "remainder",
}

NO_RANK = "no rank printed"
"""The rank cell of output that names no rank."""


def count(number: int, noun: str) -> str:
    """``1 block``, ``2,048 blocks``: a count and its noun, singular for one."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def term(value: Term) -> str:
    return TERM_WORDS.get(value, value.value.replace("_", " "))


def term_basis(value: TermBasis) -> str:
    return TERM_BASIS_WORDS.get(value, value.value)


def arguments(flags: Mapping[str, str]) -> str:
    """A fix's command-line arguments as one shell-quoted line: ``--flag value ...``."""
    return " ".join(f"{shlex.quote(flag)} {shlex.quote(value)}" for flag, value in flags.items())


def outcome(status: RankStatus) -> str:
    return OUTCOME_WORDS.get(status.outcome, status.outcome.replace("_", " "))


def first_failure(picture: RankPicture) -> tuple[str, str] | None:
    """Who failed first and why that one, in words: ``("rank 1", "out of memory; it failed
    earliest")``, ``("the only process", "out of memory; the log names no rank")``,
    ``("rank 0", "out of memory; ranks 0 and 1 failed at the same moment, rank 0 printed its
    failure first")``.  None when no rank is known to have failed on its own."""
    first = picture.first_failed
    if first is None or first.rank is None:
        return None
    what = outcome(first)
    if picture.unranked_run:
        return "the only process", f"{what}; the log names no rank"
    if picture.same_time:
        ranks = _and(picture.same_time)
        if picture.basis is None:
            return f"ranks {ranks}", f"{what}, at the same moment: nothing tells which was first"
        how = {
            "root_cause": f"torchrun names rank {first.rank} the root cause",
            "line_order": f"rank {first.rank} printed its failure first",
        }.get(picture.basis, BASIS_WORDS.get(picture.basis, ""))
        return f"rank {first.rank}", f"{what}; ranks {ranks} failed at the same moment, {how}"
    why = BASIS_WORDS.get(picture.basis or "", "")
    attributed = "; its error names no rank" if first.attributed else ""
    return f"rank {first.rank}", f"{what}; {why}{attributed}" if why else what + attributed


def rank_cell(status: RankStatus, picture: RankPicture) -> str:
    """A rank table's rank cell."""
    if status.rank is None:
        return NO_RANK
    if picture.unranked_run:
        return "the only process"
    return str(status.rank)


def event_rank(event: OomEvent, picture: RankPicture) -> str:
    """The rank cell of an OOM event: its own rank, else the rank it was attributed to."""
    if event.rank is not None:
        return str(event.rank)
    for status in picture.ranks:
        if status.rank is not None and any(e is event for e in status.oom_events):
            return "the only process" if picture.unranked_run else f"{status.rank} (attributed)"
    return NO_RANK


def world_size(world: WorldSizeFact | None) -> str:
    """``2 (the launcher's WORLD INFO DICT, train.log:12)``, or ``unknown``."""
    if world is None:
        return "unknown"
    origin = _WORLD_ORIGINS.get(world.origin, world.origin.replace("_", " "))
    where = f", {world.source.describe()}" if world.source is not None else ""
    at_least = "at least " if world.lower_bound else ""
    return f"{at_least}{world.value} ({origin}{where})"


def _and(ranks: tuple[int, ...]) -> str:
    names = [str(r) for r in ranks]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
