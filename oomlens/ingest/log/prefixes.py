"""Strip the prefixes launchers put before worker lines, keeping what they said.

Known prefixes, stripped in a loop (they stack: ``node-1: [default0]:[rank0]: Traceback``):

* pdsh/DeepSpeed multi-node ``<host>: `` (accepted for names that look like hosts: with a
  digit or a hyphen, or already seen before a known prefix; never exception names such as
  ``torch.OutOfMemoryError: `` nor program names such as ``srun: ``);
* Open MPI ``--tag-output`` ``[1,0]<stderr>:`` (job, rank, stream);
* torchrun ``--tee`` ``[default0]:`` / ``[<role><local_rank>]:`` (no space after the colon);
* torch's excepthook and c10 logging ``[rank3]:`` / ``[rank3]: `` (global rank);
* Lightning's ``rank_prefixed_message`` ``[rank: 3] `` (lightning_utilities: the global rank,
  the same stream as ``[rank3]:``);
* Ray ``(Name pid=123)`` / ``(Name rank=1 pid=254)`` / ``(pid=1, ip=10.0.0.1)``;
* srun ``--label`` ``3: `` (task number = global rank);
* task runners' ``stderr: `` / ``stdout: ``.

``strip_prefixes`` is cheap on the common case (no prefix) and bounded (at most 8 rounds,
patterns anchored at the start with bounded repetition).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.lazyregex import lazy_regex

_HOST = lazy_regex(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62}): ")
_MPI = lazy_regex(r"\[(\d{1,6}),(\d{1,6})\]<(?:stdout|stderr|stddiag)>: ?")
_ROLE = lazy_regex(r"\[([A-Za-z_][A-Za-z_-]{0,30}?)(\d{1,6})\]: ?")
_RAY = lazy_regex(
    r"\((?:([A-Za-z_][\w.-]{0,60}) )?(?:rank=(\d{1,6}),? )?pid=(\d{1,10})(?:, ip=[0-9A-Fa-f.:]{1,"
    r"45})?\) "
)
_LIGHTNING = lazy_regex(r"\[rank: (\d{1,6})\] ")
_SRUN = lazy_regex(r" {0,4}(\d{1,5}): ")
_STREAM = lazy_regex(r"(?:stderr|stdout): ")
_KNOWN_NEXT = lazy_regex(
    r"\[(?:\d{1,6},\d{1,6}\]<|[A-Za-z_][A-Za-z_-]{0,30}?\d{1,6}\]:|\d{4}-\d\d-\d\d )|\d{1,5}: "
)

_NOT_HOSTS = frozenset(
    {
        "srun",
        "slurmstepd",
        "sbatch",
        "salloc",
        "pdsh",
        "ssh",
        "bash",
        "sh",
        "zsh",
        "env",
        "python",
        "python2",
        "python3",
        "torchrun",
        "deepspeed",
        "accelerate",
        "mpirun",
        "Traceback",
        "stderr",
        "stdout",
        "Note",
        "NOTE",
        "Warning",
        "WARNING",
        "Error",
        "ERROR",
        "INFO",
        "DEBUG",
        "CRITICAL",
        "FATAL",
        "CAUGHT",
        "Killed",
        "Aborted",
    }
)
_NOT_HOST_SUFFIXES = ("Error", "Exception", "Warning", "Exit", "Interrupt", "Iteration")


@dataclass(frozen=True, slots=True)
class LinePrefix:
    """What the stripped prefixes said about a line's origin.

    ``rank`` is a global rank (``[rankN]:``, an MPI rank, an srun task, Ray ``rank=``);
    ``local_rank`` a launcher's local rank (``[defaultN]:``).  ``key`` identifies the
    producing stream: lines with equal keys come from one process.
    """

    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    role: str | None = None
    key: tuple[object, ...] = ()


NO_PREFIX = LinePrefix()


def _looks_like_host(name: str) -> bool:
    if name in _NOT_HOSTS or name.endswith(_NOT_HOST_SUFFIXES):
        return False
    lowered = name.lower()
    if lowered.startswith("python") or lowered.endswith((".py", ".sh")):
        return False
    return any(ch.isdigit() or ch == "-" for ch in name)


_FAST = lazy_regex(
    r"\[(?:[A-Za-z_][A-Za-z_-]{0,30}?\d{1,6}\]: ?(?:\[rank\d{1,6}\]: ?)?|rank: \d{1,6}\] )"
)
_FAST_CACHE: dict[str, LinePrefix] = {}


def strip_prefixes(text: str, known_hosts: set[str] | None = None) -> tuple[str, LinePrefix]:
    """``(rest_of_line, prefix)``; see ``_strip_prefixes``.  The common torchrun/excepthook
    stack (``[default0]:``, ``[rank3]: ``, both) and Lightning's ``[rank: 3] `` are recognised
    in one match and their metadata cached."""
    if text[:1] == "[":
        match = _FAST.match(text)
        if match is not None:
            end = match.end()
            if text[end : end + 1] not in ("[", "("):
                consumed = match.group(0)
                cached = _FAST_CACHE.get(consumed)
                if cached is None:
                    cached = _strip_prefixes(consumed, None)[1]
                    if len(_FAST_CACHE) < 4096:
                        _FAST_CACHE[consumed] = cached
                return text[end:], cached
    return _strip_prefixes(text, known_hosts)


def _strip_prefixes(text: str, known_hosts: set[str] | None = None) -> tuple[str, LinePrefix]:
    """``(rest_of_line, prefix)``.  ``known_hosts`` (optional, updated) remembers hosts that
    were confirmed by a following known prefix, so that later lines from host names without
    digits or hyphens are recognised too."""
    first = text[:1]
    if not first or (
        first not in "[( 0123456789sabcdefghijklmnopqrtuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    ):
        return text, NO_PREFIX
    host = role = None
    rank = local_rank = None
    key: list[object] = []
    pos = 0
    for _ in range(8):
        ch = text[pos : pos + 1]
        if ch == "[":
            match = _MPI.match(text, pos)
            if match is not None:
                rank = int(match.group(2))
                key.append(("mpi", rank))
                pos = match.end()
                continue
            match = _ROLE.match(text, pos)
            if match is not None:
                name, number = match.group(1), int(match.group(2))
                if name == "rank":
                    rank = number
                else:
                    role, local_rank = name, number
                key.append((name, number))
                pos = match.end()
                continue
            match = _LIGHTNING.match(text, pos)
            if match is not None:
                rank = int(match.group(1))
                key.append(("rank", rank))
                pos = match.end()
                continue
            break
        if ch == "(":
            match = _RAY.match(text, pos)
            if match is None:
                break
            if match.group(2) is not None:
                rank = int(match.group(2))
            key.append(("ray", match.group(3)))
            pos = match.end()
            continue
        if ch == " " or ch.isdigit():
            match = _SRUN.match(text, pos)
            if match is None:
                break
            if rank is None:
                rank = int(match.group(1))
            key.append(("task", int(match.group(1))))
            pos = match.end()
            continue
        if ch.isalpha() or ch.isdigit():
            colon = text.find(": ", pos, pos + 66)
            if colon < 0:
                break
            match = _STREAM.match(text, pos)
            if match is not None:
                pos = match.end()
                continue
            match = _HOST.match(text, pos)
            if match is None:
                break
            name = match.group(1)
            confirmed = known_hosts is not None and name in known_hosts
            if not confirmed:
                if name in _NOT_HOSTS or name.endswith(_NOT_HOST_SUFFIXES):
                    break
                followed = _KNOWN_NEXT.match(text, match.end()) is not None
                if not (followed or _looks_like_host(name)):
                    break
                if known_hosts is not None and followed and len(known_hosts) < 4096:
                    known_hosts.add(name)
            host = name
            key.append(("host", name))
            pos = match.end()
            continue
        break
    if pos == 0:
        return text, NO_PREFIX
    return text[pos:], LinePrefix(host, rank, local_rank, role, tuple(key))
