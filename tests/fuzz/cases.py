"""One runnable fuzz case per input kind, built from a seed file and a seeded generator.

A ``Case`` is the files to write (under ``in/``), the special files to make (FIFOs, sockets,
symbolic links, deep folders), the command line to run in the case's folder, and the outputs
it writes.  ``make_case(kind, number, seed)`` is deterministic: the same arguments give the
same case, so a finding is reproduced from ``(kind, number, seed)`` alone.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz import documents, hostile, mutate, seeds, shapes

KINDS = (
    "log", "config", "kernel_log", "error_file", "snapshot", "tree", "triage",
    "transport", "document", "hostile2",
)  # fmt: skip
"""Every input kind the campaign mutates, with its share of the cases."""
WEIGHTS = (30, 15, 8, 8, 15, 12, 12, 20, 12, 12)
NEW_KINDS = ("transport", "document", "hostile2")
"""The shapes of issue 33's campaign: logs as they reach users, documents that quote an OOM,
and its hostile inputs."""

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
    expect: str = ""
    """What the verdict may not become (``oracles.direction``): ``direction`` (a failure
    stays a failure, an OOM stays an OOM or becomes uncertain) or ``no_oom`` (the case
    quotes an OOM it did not have).  Needs ``--format json``."""
    baseline: dict[str, str | bytes] = field(default_factory=dict)
    """The untransformed inputs (files, or ``path -> seed path`` to copy) the verdict is
    compared with; empty: compared with nothing (``no_oom`` only)."""
    baseline_argv: list[str] = field(default_factory=list)
    baseline_key: str = ""
    """The baseline's verdict is computed once per key (per seed file) and cached."""


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
        "transport": _transport,
        "document": _document,
        "hostile2": _hostile2,
    }[kind](case, rng)
    return case


def plan(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[tuple[str, int]]:
    """``count`` cases over ``kinds`` by their weights, in a seeded order."""
    rng = random.Random(seed)
    weights = [w for k, w in zip(KINDS, WEIGHTS, strict=True) if k in kinds]
    chosen = [k for k in KINDS if k in kinds]
    total = sum(weights)
    shares = [max(1, count * w // total) for w in weights]
    shares[0] += count - sum(shares)
    cases = [(kind, n) for kind, share in zip(chosen, shares, strict=True) for n in range(share)]
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


# -- issue 33: logs as they reach users, documents that quote an OOM, hostile shapes ----------


def _json_analyze(case: Case, rng: random.Random, target: str) -> None:
    case.argv = ["analyze", target, "--format", "json", "--html", "report.html"]
    if rng.random() < 0.2:
        case.argv.append("--redact")
    case.stdout_format = "json"
    case.outputs = ("report.html",)


def _compare_with(case: Case, key: str, files: dict[str, str | bytes], target: str) -> None:
    case.expect = "direction"
    case.baseline = files
    case.baseline_argv = ["analyze", target, "--format", "json"]
    case.baseline_key = key


def _transport(case: Case, rng: random.Random) -> None:
    """A failed run's real log re-shaped as logs reach users (``shapes``), small (the paste
    path) or padded past 1 MiB with another run's healthy lines (the bulk path)."""
    source = rng.choice(seeds.failure_logs())
    healthy = [r / "train.log" for r in seeds.healthy_runs()]
    original = _read(source)
    data, padded = original, ""
    if rng.random() < 0.3:
        data = shapes.pad(data, rng, _read(rng.choice(healthy)))
        padded = f", after {len(data) / 2**20:.1f} MiB of healthy lines"
    data, suffix, names = shapes.transport(data, rng, _read(rng.choice(healthy)))
    name = rng.choice(["train.log", "paste.txt", "output.log", "slurm-1234.out"]) + suffix
    case.description = f"{source.relative_to(seeds.ROOT)}: {' + '.join(names)}{padded}"
    case.files[f"in/{name}"] = data
    _json_analyze(case, rng, f"in/{name}")
    _compare_with(case, f"log:{source}", {"in/train.log": str(source)}, "in/train.log")


def _run_files(run: Path) -> dict[str, str | bytes]:
    return {
        f"in/{p.relative_to(run)}": str(p)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != "case.json" and p.suffix not in (".py",)
    }


def _document(case: Case, rng: random.Random) -> None:
    """A real OOM message or traceback quoted in a document that is not a log (``documents``),
    named alone on the command line or dropped into a healthy run's folder."""
    source = rng.choice(seeds.oom_logs())
    quote = documents.quote_of(_read(source), rng)
    how, name, data = documents.document(quote, rng)
    case.expect = "no_oom"
    if rng.random() < 0.5:
        case.description = f"{how} document quoting {source.relative_to(seeds.ROOT)}, alone"
        if how in documents.PASTES:
            case.expect = ""  # a ticket's paste, read as the log it holds (``PASTES``)
        case.files[f"in/{name}"] = data
        _json_analyze(case, rng, f"in/{name}")
        return
    run = rng.choice(seeds.healthy_runs())
    case.description = (
        f"{how} document quoting {source.relative_to(seeds.ROOT)}, in healthy run "
        f"{run.relative_to(seeds.ROOT)}"
    )
    files = _run_files(run)
    case.files.update({k: _read(Path(v)) for k, v in files.items() if isinstance(v, str)})
    case.files[f"in/{name}"] = data
    _json_analyze(case, rng, "in")
    case.baseline, case.baseline_argv = files, ["analyze", "in", "--format", "json"]
    case.baseline_key = f"run:{run}"


def _any_format(case: Case, rng: random.Random, target: str) -> None:
    if rng.random() < 0.5:
        _analyze(case, rng, target)
    else:
        _json_analyze(case, rng, target)
    if rng.random() < 0.3:
        case.argv += ["-o", "report.md"]
        case.stdout_format = "none"
        case.outputs = (*case.outputs, "report.md")


def _hostile2(case: Case, rng: random.Random) -> None:
    from oomlens.ingest.snapshot.unpickler import restricted_load

    how = rng.choice(["memo", "memo", "fields", "capture", "names", "names", "config"])
    if how in ("memo", "fields"):
        source = rng.choice(seeds.snapshots())
        if how == "memo":
            what, raw = hostile.memo_pickle(rng, lambda: restricted_load(source).data)
        else:
            data = restricted_load(source).data
            what = ", ".join(hostile.odd_fields(data, rng)) or "nothing"
            raw = pickle.dumps(data, protocol=rng.choice([2, 4]))
            raw = gzip.compress(raw, mtime=0) if rng.random() < 0.3 else raw
        case.description = f"{source.relative_to(seeds.ROOT)}: {what}"
        case.files["in/snapshot_rank0.pickle"] = raw
        if rng.random() < 0.4:
            fmt = rng.choice([[], ["--format", "json"]])
            case.argv = ["whatif", "in/snapshot_rank0.pickle", *fmt]
            case.stdout_format = "json" if fmt else "text"
        else:
            _any_format(case, rng, "in")
    elif how == "capture":
        _nested_capture(case, rng)
    elif how == "names":
        _hostile_names(case, rng)
    else:
        _hostile_config(case, rng)


def _nested_capture(case: Case, rng: random.Random) -> None:
    """A real capture with one line nested 10,000-100,000 deep: it must cost that line only,
    so the verdict keeps its direction."""
    run = rng.choice(seeds.captured_runs())
    files = {
        k: v
        for k, v in _run_files(run).items()
        if not (k.endswith(".pickle") and rng.random() < 0.7)
        and (k.endswith(".jsonl") or "oomlens-capture" in k or rng.random() < 0.5)
    }
    target = rng.choice([k for k in files if k.endswith(".jsonl")])
    lines = _read(Path(str(files[target]))).split(b"\n")
    depth = rng.choice([10_000, 30_000, 100_000])
    at = rng.randint(1, max(1, len(lines) - 1))
    lines.insert(at, hostile.nested_line(rng, depth))
    case.files.update({k: _read(Path(str(v))) for k, v in files.items()})
    case.files[target] = b"\n".join(lines)
    case.description = (
        f"{run.relative_to(seeds.ROOT)}: line {at} of {Path(target).name} nested {depth:,} deep"
    )
    _json_analyze(case, rng, "in")
    _compare_with(case, f"capture:{run}:{sorted(files)}", files, "in")


def _hostile_names(case: Case, rng: random.Random) -> None:
    """A real crash log under a name with bidi controls, Markdown and non-UTF-8 bytes."""
    source = rng.choice(seeds.failure_logs())
    name = hostile.hostile_name(rng)
    case.description = f"{source.relative_to(seeds.ROOT)} named {name!a}"
    if rng.random() < 0.25:
        case.files[f"in/{name}/train.log"] = _read(source)
        run = rng.choice(seeds.runs())
        case.files[f"in/{run.name}/train.log"] = _read(run / "train.log")
        case.argv = ["triage", "in", "--no-store", "--jobs", "1", "-q", "-o", "runs.csv",
                     "-o", "runs.jsonl", "-o", "index.html"]  # fmt: skip
        case.stdout_format = "text"
        case.outputs = ("runs.csv", "runs.jsonl", "index.html")
        return
    where = rng.choice([f"in/{name}.log", f"in/{name}/train.log"])
    case.files[where] = _read(source)
    _any_format(case, rng, rng.choice([where, "in"]))


def _hostile_config(case: Case, rng: random.Random) -> None:
    source = rng.choice(seeds.configs())
    try:
        config = json.loads(_read(source))
    except ValueError:
        config = {}
    if not isinstance(config, dict):
        config = {}
    if rng.random() < 0.5:
        what, config = hostile.many_keys(config, rng)
        data = json.dumps(config).encode()
    else:
        what, data = hostile.lone_surrogates(config, rng)
    case.description = f"{source.relative_to(seeds.ROOT)}: {what}"
    case.files["in/ds_config.json"] = data
    if rng.random() < 0.5:
        fmt = rng.choice([[], ["--format", "json"]])
        case.argv = ["check", "in/ds_config.json", "--params", "1.3B", "--gpus", "8",
                     "--gpu-memory", "80GiB", *fmt]  # fmt: skip
        case.stdout_format = "json" if fmt else "text"
        return
    run = rng.choice([r for r in seeds.runs() if (r / "ds_config.json").exists()])
    case.files["in/train.log"] = _read(run / "train.log")
    _any_format(case, rng, "in")
