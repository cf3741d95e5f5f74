"""One runnable fuzz case per input kind, built from a seed file and a seeded generator.

A ``Case`` is the files to write (under ``in/``), the special files to make (FIFOs, sockets,
symbolic links, deep folders), the command line to run in the case's folder, and the outputs
it writes.  ``make_case(kind, number, seed)`` is deterministic: the same arguments give the
same case, so a finding is reproduced from ``(kind, number, seed)`` alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz import mutate, seeds

KINDS = ("log", "config", "kernel_log", "error_file", "snapshot", "tree", "triage")
"""Every input kind the campaign mutates, with its share of the cases."""
WEIGHTS = (30, 15, 8, 8, 15, 12, 12)

_FORMATS = ([], ["--format", "markdown"], ["--format", "json"], ["--redact"],
            ["--redact", "--format", "markdown"])  # fmt: skip


@dataclass
class Case:
    kind: str
    number: int
    seed: int
    description: str
    files: dict[str, bytes] = field(default_factory=dict)
    special: list[tuple[str, str]] = field(default_factory=list)
    """``(path, what)``: ``fifo``, ``socket``, ``symlink:<target>``, ``deep:<levels>``."""
    argv: list[str] = field(default_factory=list)
    stdout_format: str = "text"
    """What the command prints: ``text``, ``markdown``, ``json`` or ``none``."""
    outputs: tuple[str, ...] = ()
    """Files the command writes, checked like its standard output."""
    marker: str = "PWNED"
    """A file that exists afterwards only if a pickle ran code."""


def make_case(kind: str, number: int, seed: int) -> Case:
    rng = random.Random(f"{seed}:{kind}:{number}")
    case = Case(kind, number, seed, "")
    {
        "log": _log,
        "config": _config,
        "kernel_log": _kernel_log,
        "error_file": _error_file,
        "snapshot": _snapshot,
        "tree": _tree,
        "triage": _triage,
    }[kind](case, rng)
    return case


def plan(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` cases over the kinds by their weights, in a seeded order."""
    rng = random.Random(seed)
    total = sum(WEIGHTS)
    shares = [max(1, count * w // total) for w in WEIGHTS]
    shares[0] += count - sum(shares)
    cases = [(kind, n) for kind, share in zip(KINDS, shares, strict=True) for n in range(share)]
    rng.shuffle(cases)
    return cases


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _analyze(case: Case, rng: random.Random, target: str = "in") -> None:
    fmt = rng.choice(_FORMATS)
    case.argv = ["analyze", target, "--html", "report.html", *fmt]
    case.stdout_format = "json" if "json" in fmt else "markdown" if "markdown" in fmt else "text"
    case.outputs = ("report.html",)


def _log(case: Case, rng: random.Random) -> None:
    source = rng.choice(seeds.logs())
    data, other = _read(source), _read(rng.choice(seeds.logs()))
    how = rng.random()
    if how < 0.6:
        data = mutate.mutate_lines(data, rng, other)
    elif how < 0.85:
        data = mutate.mutate_bytes(data, rng, other)
    else:
        data = mutate.compress(mutate.mutate_lines(data, rng, other), rng)
    case.description = f"{source.relative_to(seeds.ROOT)} mutated"
    case.files["in/train.log"] = data
    _analyze(case, rng, "in/train.log")


def _config(case: Case, rng: random.Random) -> None:
    source = rng.choice(seeds.configs())
    data = _read(source)
    data = mutate.mutate_json(data, rng) if rng.random() < 0.8 else mutate.mutate_bytes(data, rng)
    case.description = f"{source.relative_to(seeds.ROOT)} mutated"
    case.files["in/ds_config.json"] = data
    if rng.random() < 0.5:
        fmt = rng.choice([[], ["--format", "json"]])
        case.argv = ["check", "in/ds_config.json", "--params", "1.3B", "--gpus",
                     str(rng.choice([1, 2, 8, 3])), "--gpu-memory", "80GiB", *fmt]  # fmt: skip
        case.stdout_format = "json" if fmt else "text"
        return
    run = rng.choice([r for r in seeds.runs() if (r / "ds_config.json").exists()])
    case.files["in/train.log"] = _read(run / "train.log")
    _analyze(case, rng)


def _kernel_log(case: Case, rng: random.Random) -> None:
    source = rng.choice(seeds.kernel_logs())
    data = _read(source)
    data = mutate.mutate_lines(data, rng) if rng.random() < 0.7 else mutate.mutate_bytes(data, rng)
    case.description = f"{source.relative_to(seeds.ROOT)} mutated"
    case.files["in/kernel.log"] = data
    if rng.random() < 0.7:
        case.files["in/train.log"] = _read(source.parent / "train.log")
    _analyze(case, rng)


def _error_file(case: Case, rng: random.Random) -> None:
    source = rng.choice(seeds.error_files())
    data = _read(source)
    data = mutate.mutate_json(data, rng) if rng.random() < 0.7 else mutate.mutate_bytes(data, rng)
    case.description = f"{source.relative_to(seeds.ROOT)} mutated"
    where = rng.choice(["in/error.json", "in/run/attempt_0/1/error.json"])
    case.files[where] = data
    if rng.random() < 0.5:
        log = rng.choice(seeds.logs())
        case.files["in/run/attempt_0/1/stderr.log"] = _read(log)[:200_000]
    _analyze(case, rng, rng.choice(["in", where]))


def _snapshot(case: Case, rng: random.Random) -> None:
    from oomlens.ingest.snapshot.unpickler import restricted_load

    source = rng.choice(seeds.snapshots())
    how = rng.random()
    if how < 0.55:
        data = mutate.mutate_structure(restricted_load(source).data, rng)
        raw = mutate.repickle(data, rng)
        case.description = f"{source.relative_to(seeds.ROOT)}: structure mutated"
    elif how < 0.85:
        raw = mutate.mutate_bytes(_read(source), rng)
        case.description = f"{source.relative_to(seeds.ROOT)}: bytes mutated"
    else:
        raw = mutate.hostile_pickle(rng, case.marker)
        case.description = "hostile pickle (imports, calls, floods, nesting)"
    case.files["in/snapshot_rank0.pickle"] = raw
    if rng.random() < 0.3:
        # the what-if replay walks the whole history: its own budgets meet the same pickles
        fmt = rng.choice([[], ["--format", "json"]])
        extra = rng.choice(
            [[], ["--allowed", "6.5GiB"], ["--alloc-conf", "expandable_segments:True"]]
        )
        case.argv = ["whatif", "in/snapshot_rank0.pickle", *extra, *fmt]
        case.stdout_format = "json" if fmt else "text"
        return
    log = source.parent / "train.log"
    if log.exists() and rng.random() < 0.5:
        case.files["in/train.log"] = _read(log)
    _analyze(case, rng)


def _hostile_name(rng: random.Random) -> str:
    name = mutate.payload(rng).replace("/", "\u2215").replace("\x00", "")
    return name[:200] or "x"


def _tree(case: Case, rng: random.Random) -> None:
    """A real run directory with hostile company: FIFOs and sockets under log names, links to
    devices and loops, very deep folders, hostile and non-UTF-8 names, many files."""
    run = rng.choice(seeds.runs())
    for path in run.rglob("*"):
        if path.is_file() and path.name != "case.json" and rng.random() < 0.8:
            case.files[f"in/{path.relative_to(run)}"] = _read(path)
    extras = [
        ("in/stderr.log", "fifo"),
        ("in/rank1.log", "socket"),
        ("in/zero.log", "symlink:/dev/zero"),
        ("in/loop", "symlink:."),
        ("in/up", "symlink:.."),
        ("in/deep", f"deep:{rng.choice([10, 60])}"),
        ("in/ds_config.json", "fifo"),
        ("in/many", f"many:{rng.choice([50, 400])}"),
    ]
    for extra in rng.sample(extras, rng.randint(1, 4)):
        if extra[0] not in case.files:
            case.special.append(extra)
    for _ in range(rng.randint(0, 3)):
        case.files[f"in/{_hostile_name(rng)}.log"] = mutate.mutate_lines(
            _read(rng.choice(seeds.logs()))[:100_000], rng
        )
    case.description = f"{run.relative_to(seeds.ROOT)} among hostile files"
    if rng.random() < 0.2:
        case.special.append(("in/fifo.log", "fifo"))
        _analyze(case, rng, "in/fifo.log")
        return
    _analyze(case, rng)
    # the deep and many folders hold logs of their own: without --one-run, analyze refuses a
    # directory of several runs (exit 2, by design since 48c5803) and reads none of the company
    case.argv.insert(2, "--one-run")


def _triage(case: Case, rng: random.Random) -> None:
    """An archive of real runs under hostile folder names, some logs mutated."""
    for n in range(rng.randint(2, 4)):
        run = rng.choice(seeds.runs())
        name = _hostile_name(rng) if rng.random() < 0.6 else f"{run.name}-{n}"
        for path in run.rglob("*"):
            if not path.is_file() or path.name == "case.json" or path.suffix == ".pickle":
                continue
            data = _read(path)
            if path.suffix == ".log" and rng.random() < 0.4:
                data = mutate.mutate_lines(data, rng)
            case.files[f"in/{n}/{name}/{path.relative_to(run)}"] = data
    if rng.random() < 0.3:
        case.special.append((f"in/0/{_hostile_name(rng)}.log", "fifo"))
    case.description = "an archive of real runs under hostile names"
    quiet = ["-q"] if rng.random() < 0.5 else []  # without: the summary of groups on stdout
    case.argv = ["triage", "in", "--no-store", "--jobs", "1", *quiet, "-o", "runs.csv",
                 "-o", "runs.jsonl", "-o", "index.html"]  # fmt: skip
    case.stdout_format = "text"
    case.outputs = ("runs.csv", "runs.jsonl", "index.html")
