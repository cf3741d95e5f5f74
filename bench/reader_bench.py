"""Issues 15 and 32's bench, in one run: the log reader on dense and sparse 64-rank logs of
every framework's line shapes against ``grep -c -E`` with the reader's anchors, then snapshot
loading against ``pickle.load``.

Logs, from the corpus's real lines:

* ``issue15`` (``bench/multirank_log.py``, ``[rankN]:`` on every line): *dense*, every rank,
  every step: a loss line, a ``see_memory_usage`` block and ZeRO-3's cache-flush warning (about
  144 bytes a line); *sparse*: nine ordinary INFO lines and one memory line;
* each shape of ``bench/reader_shapes.py`` (a launcher's prefix and a framework's progress and
  memory lines: DeepSpeed print and logger forms, torchrun with and without the space,
  ``[defaultN]:``, srun, pdsh, Lightning, accelerate, HF Trainer dicts and tqdm bars, Megatron,
  python logging), alone, all of them ``mixed`` (each rank its own), and ``random``: a shape
  drawn from those lines with ``--seed`` (drawn and printed when not given), dense and sparse.

Each row runs in a fresh process on the same page-cached file; wall time, CPU time (the
process and the workers it waited for) and peak RSS come from ``wait4``.  ``oomlens`` rows
print a digest of the facts: the same digest for every ``--jobs`` (checked here).  Snapshots:
``bench/snapshot_bench.py`` (100 MB and 1 GB, the corpus's layout: stacks='all', frames shared,
``--snapshot-layouts`` for others), its table as is.

    python bench/reader_bench.py [--size-gb 1] [--jobs 1 2] [--rounds 3] [--skip-snapshots]
                                 [--dir /tmp] [--shapes issue15 ds_print ... mixed random]
                                 [--density dense sparse] [--seed N] [--cores 2 4 8]
                                 [--ref-tree FOLDER]

``--cores``: each table again with every command held to that many of the machine's cores
(``sched_setaffinity``; grep too), to tell what a target needs where it is not met on two.
The package is byte-compiled first, as an installed one is: the rows time the reading, not the
compiling of modules changed since their bytecode was written.

Targets (issue 15): dense <= 3x grep, sparse <= 2x grep (wall), peak RSS <= 200 MiB;
snapshot <= 1.3x a bare ``pickle.load``, peak <= 1.2x.
"""

from __future__ import annotations

import argparse
import compileall
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import reader_shapes  # noqa: E402
from bench.log_bench import _ere  # noqa: E402
from oomlens.ingest.log import ANCHORS  # noqa: E402

MiB = 1024**2
DENSITIES = ("dense", "sparse")
GENERATE = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from bench import multirank_log, reader_shapes
path, size, name, density, ranks, seed = sys.argv[1:7]
if name == "issue15":
    counts = multirank_log.generate(Path(path), int(size), density, ranks=int(ranks))
else:
    shapes = (
        list(reader_shapes.SHAPES.values()) if name == "mixed"
        else [reader_shapes.random_shape(int(seed))] if name == "random"
        else [reader_shapes.SHAPES[name]]
    )
    counts = reader_shapes.generate(Path(path), int(size), shapes, density, int(ranks))
print(" ".join(f"{{k}}={{v}}" for k, v in counts.items()))
"""
READER = """
import hashlib, os, sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as oomlens.cli.main sets it
from oomlens.ingest.log import read_log
facts = read_log(sys.argv[1], jobs=int(sys.argv[2]))
digest = hashlib.sha256(repr(facts).replace(sys.argv[1], "LOG").encode()).hexdigest()[:16]
print(f"lines={facts.lines} memory_samples={sum(s.total_samples for s in facts.memory)} "
      f"ranks={len(facts.memory)} steps={facts.steps.total} flushes={facts.cache_flushes.warnings} "
      f"digest={digest}")
"""


TIME = shutil.which("time", path="/usr/bin:/bin")


def _measure(command: list[str], cpus: set[int] | None = None) -> dict[str, Any]:
    """Wall and CPU seconds (the command and the children it waited for) and peak RSS, the
    command held to ``cpus`` if given.  A process's peak RSS survives exec and starts at its
    parent's at fork, so the peak comes from GNU time where there is one (a small parent)
    rather than from this process's ``wait4``."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as sink, tempfile.NamedTemporaryFile("r") as peak:
        timed = [TIME, "-f", "%M", "-o", peak.name, *command] if TIME else command
        process = subprocess.Popen(
            timed,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        sink.seek(0)
        output = sink.read().decode(errors="replace").strip()
        kib = int(peak.read().split()[-1]) if TIME else usage.ru_maxrss
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{command[0]} failed ({code}): {output[-2000:]}")
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": kib * 1024 / MiB,
        "out": output,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(runs[0])
    for key in ("wall", "cpu", "rss"):
        row[key] = statistics.median(float(r[key]) for r in runs)
    row["out"] = " | ".join(sorted({str(r["out"]) for r in runs}))
    return row


def _cpu_sets(cores: list[int] | None) -> list[tuple[str, set[int] | None]]:
    """(title, CPUs) for each ``--cores`` count (the first that many this process may use),
    or the whole machine once."""
    if not cores:
        return [("", None)]
    mine = sorted(os.sched_getaffinity(0))
    return [(f", held to {n} cores", set(mine[:n])) for n in cores if n <= len(mine)]


def _logs(args: argparse.Namespace, workdir: Path) -> list[str]:
    summary: list[str] = []
    pattern = "|".join(_ere(a) for a in ANCHORS)
    grep = shutil.which("grep") or "grep"
    for name in args.shapes:
        for density in args.density:
            target = 3.0 if density == "dense" else 2.0
            shape = f"{name} {density}"
            path = workdir / f"{name}-{density}.log"
            start = time.perf_counter()
            # generated in a child: a child's peak RSS counts its parent's memory at fork time
            made = subprocess.run(
                [sys.executable, "-c", GENERATE, str(path), str(int(args.size_gb * 1024**3))]
                + [name, density, str(args.ranks), str(args.seed)],
                check=True,
                capture_output=True,
                text=True,
            )
            counts = {k: int(v) for k, v in (x.split("=") for x in made.stdout.split())}
            print(
                f"\n{shape}: {counts['bytes'] / MiB:.0f} MiB, {counts['lines']:,} lines, "
                f"{args.ranks} ranks (generated in {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
            commands = {"grep -c -E": [grep, "-c", "-E", pattern, str(path)]}
            for jobs in args.jobs:
                commands[f"oomlens --jobs {jobs}"] = [sys.executable, "-c", READER, str(path)]
                commands[f"oomlens --jobs {jobs}"].append(str(jobs))
            if args.ref_tree:  # another revision's package, the same file: before and after
                commands["before --jobs 1"] = ["env", f"PYTHONPATH={args.ref_tree}"]
                # -P: not the current folder first on the path (this tree when run from it)
                commands["before --jobs 1"] += [sys.executable, "-P", "-c", READER, str(path), "1"]
            for title, cpus in _cpu_sets(args.cores):
                summary.append(_table(args, shape, target, counts, commands, title, cpus))
            if not args.keep:
                path.unlink()
    return summary


def _table(
    args: argparse.Namespace,
    shape: str,
    target: float,
    counts: dict[str, int],
    commands: dict[str, list[str]],
    title: str,
    cpus: set[int] | None,
) -> str:
    """The rounds of ``commands`` on ``cpus``, their table printed; the summary line."""
    # interleaved rounds, medians: on a shared machine a load spike hits one round of
    # every row rather than every round of one row
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, command in commands.items():
            runs[name].append(_measure(command, cpus))
    rows = {name: _median(measured) for name, measured in runs.items()}
    print(f"  {args.rounds} round(s), medians{title}; load average {os.getloadavg()[0]:.1f} after")
    base = rows["grep -c -E"]
    print(f"{'':<20}{'wall s':>8}{'cpu s':>8}{'MB/s':>7}{'peak MiB':>10}{'wall/grep':>11}")
    for name, row in rows.items():
        print(
            f"{name:<20}{row['wall']:>8.2f}{row['cpu']:>8.2f}"
            f"{counts['bytes'] / MiB / row['wall']:>7.0f}{row['rss']:>10.0f}"
            f"{row['wall'] / base['wall']:>10.2f}x"
        )
    digests = set()
    for name, row in rows.items():
        if name.startswith("oomlens"):
            print(f"    {name}: {row['out']}")
            digests.add(str(row["out"]).rsplit("digest=", 1)[-1])
    ours = [row for name, row in rows.items() if name.startswith("oomlens")]
    before = rows.get("before --jobs 1")
    was = f", before {before['wall'] / base['wall']:.2f}x" if before else ""
    best = min(ours, key=lambda row: float(row["wall"]))
    verdict = "met" if best["wall"] <= target * base["wall"] else "not met"
    peak = max(float(row["rss"]) for row in ours)
    return (
        f"{shape} log {counts['bytes'] / MiB:.0f} MiB{title}: best {best['wall']:.2f} s vs grep "
        f"{base['wall']:.2f} s = {best['wall'] / base['wall']:.2f}x (target <= {target:g}x: "
        f"{verdict}), peak RSS {peak:.0f} MiB; facts identical across --jobs: "
        f"{len(digests) == 1}{was}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--dir", default=None, help="where the logs are written (made if missing; then removed)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved; medians reported")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--skip-snapshots", action="store_true")
    parser.add_argument("--snapshot-mb", type=float, nargs="+", default=[100.0, 1000.0])
    parser.add_argument("--snapshot-layouts", nargs="+", default=["all-shared"])
    shapes = ["issue15", *reader_shapes.SHAPES, "mixed", "random"]
    parser.add_argument("--shapes", nargs="+", choices=shapes, default=shapes)
    parser.add_argument("--density", nargs="+", choices=DENSITIES, default=list(DENSITIES))
    parser.add_argument(
        "--seed", type=int, default=None, help="the random shape's seed (default: drawn, printed)"
    )
    parser.add_argument("--cores", type=int, nargs="+", default=None, help="held to that many")
    parser.add_argument(
        "--ref-tree",
        default=None,
        help="a folder holding another revision's oomlens package (git archive REV oomlens): a "
        "row for it on the same files",
    )
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    print(f"random shape: seed {args.seed}: {reader_shapes.random_shape(args.seed)}")
    # as pip leaves an installed package: its modules' bytecode written
    compileall.compile_dir(ROOT / "oomlens", quiet=2)
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="oomlens-bench-", dir=args.dir))
    try:
        summary = _logs(args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not args.skip_snapshots:
        command = [sys.executable, str(ROOT / "bench" / "snapshot_bench.py"), "--skip-memviz"]
        command += ["--size-mb", *[str(s) for s in args.snapshot_mb]]
        # issue 15's snapshot (the corpus's layout): every layout at 1 GB would write ~10 GB;
        # bench/snapshot_bench.py alone measures them all
        command += ["--layouts", *args.snapshot_layouts]
        subprocess.run(command, check=True)
    print("\nsummary")
    for line in summary:
        print(f"  {line}")


if __name__ == "__main__":
    main()
