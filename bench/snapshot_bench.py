"""Snapshot loading speed and memory: oomlens vs a bare ``pickle.load``, on every layout.

Generates snapshots of every layout the crash corpus and the shared samples hold
(:mod:`snapshot_bench_layouts`: stacks ``all``/``python``/none, frames shared or one list per
block, many segments, expandable segments) at each size asked for (default 1 MB and 100 MB;
``--size-mb 1000`` for 1 GB), then measures each row below on each file in a fresh process, in
interleaved rounds (round 1: every layout and row once, then round 2, ...), and prints the
medians: the time of the work itself (the process's start and imports excluded), CPU time, peak
RSS (``wait4`` on that very process) and the RSS the work added over what the process held when
it began (imports excluded: at 1 MB, oomlens' imports outweigh the snapshot).

* ``bare pickle.load``: the floor, what any reader pays (the collector on, as by default);
* ``oomlens load+analyze``: :func:`~oomlens.ingest.snapshot.load_snapshot` and
  :func:`~oomlens.analysis.allocator.analyze_snapshot` as ``oomlens analyze`` calls them
  (``oomlens/session.py``): restricted unpickling, layout checks, the analysis walk;
* ``oomlens analyze (CLI)`` (``--rows cli``): the whole command (imports, rules, JSON report);
* ``_memory_viz stats`` (``--rows memviz``): ``python -m torch.cuda._memory_viz stats FILE``.

Targets (issue 32): on every layout, oomlens load+analyze within 1.3x the bare load's time and
1.2x its peak RSS, medians of interleaved rounds on the 2-core development machine.

Usage::

    python bench/snapshot_bench.py                                  # every layout, 1 and 100 MB
    python bench/snapshot_bench.py --layouts all-per-block none --size-mb 1000 --rounds 1
    python bench/snapshot_bench.py --shape training --size-mb 200   # the synthetic loop
    python bench/snapshot_bench.py --file existing.pickle --rounds 3

Measured (3bff195, the 2 cores shared with other jobs, load average 7-9, so wall times are about
3x the CPU times; ``--baseline`` the tree before issue 32): at 114-154 MiB, medians of 3 rounds,
load + analysis over the bare load went from 2.2-2.9x to 0.57-0.82x on the three layouts with
per-block frame dicts (peak RSS 1.13-1.35x to 1.01x: the resolver classified every frame dict of
every block, and kept each), and stayed 0.87-1.43x elsewhere (no stacks 1.43x and expandable
1.31x: a million small events per 100 MB, the per-event analysis; the same code before and after
there); at about 1.1 GiB (one round) 0.47x with stacks ``all`` shared, 0.82x with no stacks,
peak 1.00x; at 1-3 MiB (medians of 5) 1.6-2.9x.  In CPU seconds the ratios are higher where the
bare load's collector walk is what the wall hides (no stacks, 1.1 GiB: 46.8 s vs 37.7 s, 1.24x).
The table is in the README's speed section.  The bare and oomlens processes exit with
``os._exit`` right after their work, so that none of them pays for freeing millions of objects
at interpreter shutdown; the CLI exits as it does.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import snapshot_bench_layouts as layouts  # noqa: E402
import snapshot_bench_training as training  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024**2

generate_snapshot = training.generate_snapshot
generate_corpus_snapshot = layouts.generate_corpus_snapshot


def __getattr__(name: str) -> Any:
    # LEAK_SITE is set by generate_snapshot in its own module; read it from there.
    return getattr(training, name)


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------

_RSS = """
def rss():
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
"""

_BARE = (
    """
import os, pickle, sys, time
"""
    + _RSS
    + """
before = rss()
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
print(f"INNER {time.perf_counter() - start:.4f} BEFORE {before}", flush=True)
os._exit(0)
"""
)

_OOMLENS = (
    """
import os, sys, time
sys.path.insert(0, sys.argv[2])
from oomlens.ingest.snapshot import load_snapshot
from oomlens.analysis.allocator import analyze_snapshot
"""
    + _RSS
    + """
before = rss()
start = time.perf_counter()
# As `oomlens analyze` calls them (oomlens/session.py): objects not frozen, then analyzed.
snapshot = load_snapshot(sys.argv[1], freeze_gc=False)
loaded = time.perf_counter()
analysis = analyze_snapshot(snapshot)
done = time.perf_counter()
print(f"INNER {done - start:.4f} BEFORE {before} LOAD {loaded - start:.4f} "
      f"ANALYZE {done - loaded:.4f}", flush=True)
d = analysis.devices[0]
peak = d.timeline and d.timeline.peak_active.active_bytes
print(f"RESULT blocks={snapshot.block_count} entries={snapshot.trace_entry_count} "
      f"allocated={d.state.allocated_bytes} peak={peak} "
      f"leak={d.leak and d.leak.bytes_per_iteration}", flush=True)
os._exit(0)
"""
)

_CLI = """
import sys, time
sys.path.insert(0, sys.argv[2])
sys.argv = ["oomlens", "analyze", sys.argv[1], "--format", "json", "-o", "/dev/null"]
from oomlens.cli import main
main()
"""

_MEMVIZ = """
import os, runpy, sys, warnings
warnings.simplefilter("ignore")
sys.argv = ["_memory_viz", "stats", sys.argv[1]]
runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
sys.stdout.flush()
os._exit(0)
"""

_ROWS = {
    "bare": ("bare pickle.load", _BARE),
    "before": ("oomlens, --baseline tree", _OOMLENS),
    "oomlens": ("oomlens load+analyze", _OOMLENS),
    "cli": ("oomlens analyze (CLI)", _CLI),
    "memviz": ("_memory_viz stats", _MEMVIZ),
}


def _field(out: str, name: str) -> float | None:
    """The number after ``name`` on the process's ``INNER`` line (None: not printed)."""
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["INNER"] and name in words[:-1]:
            return float(words[words.index(name) + 1])
    return None


def _measure(name: str, path: Path, baseline: Path | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh process: wall and CPU time, peak RSS (``wait4`` on that
    very process), the RSS before the work, and what it printed.  Row ``before`` runs the
    oomlens of the ``baseline`` tree (another checkout) instead of this one."""
    tree = baseline if name == "before" and baseline is not None else ROOT
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-c", _ROWS[name][1], str(path), str(tree)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert process.stdout is not None
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        err.seek(0)
        errors = err.read().decode(errors="replace")[-2000:]
    scale = 1 if sys.platform == "darwin" else 1024
    peak = usage.ru_maxrss * scale / MiB
    before = _field(out, "BEFORE")
    return {
        "wall_s": wall,
        "inner_s": _field(out, "INNER") or wall,
        "load_s": _field(out, "LOAD"),
        "analyze_s": _field(out, "ANALYZE"),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": peak,
        "work_rss_mb": peak - before / MiB if before is not None else peak,
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": out,
        "stderr": errors,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numeric figures of ``runs``; the text of the last run."""
    merged = dict(runs[-1])
    for key, value in runs[-1].items():
        if isinstance(value, float):
            values = [run[key] for run in runs if isinstance(run.get(key), float)]
            merged[key] = statistics.median(values)
    merged["rounds"] = len(runs)
    return merged


def measure_interleaved(
    files: list[tuple[str, Path]], rows: list[str], rounds: int, baseline: Path | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """{label: {row: medians}} over ``rounds`` rounds, each running every file's rows once."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {label: {} for label, _ in files}
    for round_number in range(rounds):
        for label, path in files:
            for row in rows:
                result = _measure(row, path, baseline)
                runs[label].setdefault(row, []).append(result)
                if result["returncode"] != 0:
                    print(f"  {label} {row}: exit {result['returncode']}: {result['stderr']}")
            print(f"  round {round_number + 1}/{rounds}: {label} done", flush=True)
    return {
        label: {row: _median(results) for row, results in by_row.items()}
        for label, by_row in runs.items()
    }


def _report(label: str, path: Path, results: dict[str, dict[str, Any]]) -> None:
    size_mb = path.stat().st_size / MiB
    print(f"\n{label}: {path.name} ({size_mb:.1f} MiB), medians of {results['bare']['rounds']}")
    print(
        f"{'':<24}{'work s':>8}{'cpu s':>8}{'peak MiB':>10}{'work MiB':>10}"
        f"{'time/bare':>11}{'peak/bare':>11}{'work MiB/bare':>15}"
    )
    bare = results["bare"]
    for name, result in results.items():
        print(
            f"{_ROWS[name][0]:<24}{result['inner_s']:>8.3f}{result['cpu_s']:>8.2f}"
            f"{result['peak_rss_mb']:>10.0f}{result['work_rss_mb']:>10.0f}"
            f"{result['inner_s'] / bare['inner_s']:>11.2f}"
            f"{result['peak_rss_mb'] / bare['peak_rss_mb']:>11.2f}"
            f"{result['work_rss_mb'] / max(bare['work_rss_mb'], 1.0):>15.2f}"
        )
    for row in ("before", "oomlens"):
        for line in results.get(row, {}).get("stdout", "").splitlines():
            print(f"    {row}: {line}")


def _summary(all_results: dict[str, dict[str, dict[str, Any]]]) -> None:
    """One line per file: the two targets."""
    print(
        f"\n{'layout':<30}{'row':<8}{'bare s':>8}{'s':>8}{'time':>7}"
        f"{'bare MiB':>10}{'MiB':>8}{'peak':>7}{'growth':>8}"
    )
    for label, results in all_results.items():
        bare = results["bare"]
        for row in ("before", "oomlens"):
            ours = results.get(row)
            if ours is None:
                continue
            print(
                f"{label:<30}{row:<8}{bare['inner_s']:>8.3f}{ours['inner_s']:>8.3f}"
                f"{ours['inner_s'] / bare['inner_s']:>6.2f}x"
                f"{bare['peak_rss_mb']:>10.0f}{ours['peak_rss_mb']:>8.0f}"
                f"{ours['peak_rss_mb'] / bare['peak_rss_mb']:>6.2f}x"
                f"{ours['work_rss_mb'] / max(bare['work_rss_mb'], 1.0):>7.2f}x"
            )


def _generate(path: Path, shape: str, layout: str, size_mb: float, seed: int) -> str:
    """Write the file in a child process (so that this one stays small); its description."""
    command = [sys.executable, __file__, "--generate-only", "--file", str(path)]
    command += ["--size-mb", str(size_mb), "--shape", shape, "--layouts", layout]
    command += ["--seed", str(seed)]
    made = subprocess.run(command, check=True, capture_output=True, text=True)
    return made.stdout.strip().rsplit(": ", 1)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, nargs="+", default=[1.0, 100.0])
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=list(layouts.LAYOUTS),
        help=f"layouts to measure (default all: {', '.join(layouts.LAYOUTS)}); with "
        "--shape training: the stacks (all or python)",
    )
    parser.add_argument("--shape", choices=("layouts", "training"), default="layouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", nargs="+", default=["bare", "oomlens"], choices=list(_ROWS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--file", type=Path, help="measure this existing snapshot instead")
    parser.add_argument("--json", type=Path, help="write the medians here")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of oomlens: adds the row 'before', its load+analyze, measured "
        "in the same interleaved rounds",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    # Kept for callers of the earlier command line (bench/reader_bench.py): the CLI and
    # _memory_viz rows now run only when --rows names them.
    parser.add_argument("--skip-memviz", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-cli", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = ["bare"] + [row for row in args.rows if row != "bare"]
    if args.baseline is not None and "before" not in rows:
        rows.insert(1, "before")

    if args.generate_only:
        _generate_to(args.file, args.shape, args.layouts[0], args.size_mb[0], args.seed)
        return
    files: list[tuple[str, Path]] = []
    made: list[Path] = []
    if args.file is not None:
        files.append((args.file.name, args.file))
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for size_mb in args.size_mb:
            for layout in args.layouts:
                label = f"{layout} {size_mb:g} MB"
                path = args.out / f"bench_snapshot_{size_mb:g}mb_{args.shape}_{layout}.pickle"
                if not path.exists():
                    start = time.perf_counter()
                    what = _generate(path, args.shape, layout, size_mb, args.seed)
                    print(f"generated {path.name} ({what}) in {time.perf_counter() - start:.1f} s")
                    made.append(path)
                files.append((label, path))
    try:
        results = measure_interleaved(files, rows, args.rounds, args.baseline)
    finally:
        if not args.keep:
            for path in made:
                path.unlink(missing_ok=True)
    for (label, path), result in zip(files, results.values(), strict=True):
        if path.exists():
            _report(label, path, result)
    _summary(results)
    if args.json is not None:
        slim = {
            label: {
                row: {k: v for k, v in r.items() if k not in ("stdout", "stderr")}
                for row, r in by_row.items()
            }
            for label, by_row in results.items()
        }
        args.json.write_text(json.dumps(slim, indent=1))


def _generate_to(path: Path, shape: str, layout: str, size_mb: float, seed: int) -> None:
    if shape == "training":
        data = training.generate_snapshot(int(size_mb * MiB), stacks=layout, seed=seed)
    else:
        data = layouts.generate_layout(int(size_mb * MiB), layouts.LAYOUTS[layout])
    with open(path, "wb") as handle:
        pickle.dump(data, handle, protocol=4)
    blocks = sum(len(segment["blocks"]) for segment in data["segments"])
    entries = sum(len(trace) for trace in data["device_traces"])
    segments = len(data["segments"])
    print(f"{path}: {segments} segments, {blocks} blocks, {entries} trace entries", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
