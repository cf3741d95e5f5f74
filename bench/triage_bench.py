"""Benchmark: ``oomlens triage`` over an archive of 1,000 runs made from the real crash corpus.

Builds ``<dir>/archive/<date>/<case>-<n>/``: every run is a copy of one corpus case
(its snapshots, configs, per-rank logs, kernel log and cgroup counters as they are), with its
``train.log`` grown to several MB by inserting, before the failure, the chatter a long run
prints: NCCL ``INFO`` channel lines, torch's checkpoint ``UserWarning`` and tqdm progress
rewrites (the line shapes of the logs in ``../shared/samples`` and the reader's own bench).
A few runs get a log that is binary garbage, to show that a broken run is a row with its
error.  File times are spread over a month, one run a few minutes after the other.

Then it runs the CLI as a user would (``python -m oomlens triage``, a fresh process each time)
and prints:

* the first triage of the whole archive (``--jobs 2``, a new store);
* the re-run with nothing changed;
* the re-run after 10 logs got one more line (only those are analyzed again);
* the speed-up from ``--jobs 1`` to ``--jobs 2`` on half of the archive (``--shard 1/2``,
  no store, so both do all the work);
* how many rows agree with their case's expected verdict.

    python bench/triage_bench.py [--runs 1000] [--min-mb 1] [--max-mb 6] [--dir /tmp] [--keep]
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "crash_logs"
BASE_TIME = 1_795_000_000  # 2026-11-18, the month the corpus was made in
_CRASH_START = (
    "Traceback (most recent call last)",
    "[memdebug] OOM",
    "OutOfMemoryError",
    "out of memory",
    "Killed",
    "exits with return code",
    "AssertionError",
    "Watchdog caught",
    "device-side assert",
    "ChildFailedError",
)


_STEP = re.compile(r"\bstep[ =]\d")


def _filler_blocks(count: int, rng: random.Random) -> list[str]:
    """``count`` blocks of about 64 KiB of a healthy run's chatter, each with its own numbers."""
    blocks = []
    step = 0
    for _ in range(count):
        lines: list[str] = []
        size = 0
        while size < 64 * 1024:
            step += 1
            pid = 2200 + step % 2
            chunk = [
                f"node-0:{pid}:{pid + 100} [{step % 2}] NCCL INFO Channel {c:02d}/24 : 0 1 via"
                " P2P/CUMEM/read\n"
                for c in range(4)
            ]
            if step % 7 == 0:
                chunk.append(
                    "/opt/torch/.venv/lib/python3.12/site-packages/torch/utils/checkpoint.py:85:"
                    " UserWarning: None of the inputs have requires_grad=True. Gradients will be"
                    " None\n  warnings.warn(\n"
                )
            pct = step % 100
            rate = 1.5 + rng.random()
            chunk.append(
                f" {pct}%|{'#' * (pct // 10):<10}| {step % 1000}/1000 [12:10<14:52, {rate:.2f}s/it]"
                f"\r {pct}%|{'#' * (pct // 10):<10}| {step % 1000 + 1}/1000 [12:11<14:51,"
                f" {rate:.2f}s/it]\n"
            )
            text = "".join(chunk)
            lines.append(text)
            size += len(text)
        blocks.append("".join(lines))
    return blocks


def _grow_log(source: Path, dest: Path, size: int, blocks: list[str], rng: random.Random) -> None:
    lines = source.read_text(errors="surrogateescape").splitlines(keepends=True)
    # A long run's chatter comes before its last steps: the case's own training lines and its
    # failure stay together at the end, as they would be in a real multi-MB log.
    cut = next(
        (
            i
            for i, line in enumerate(lines)
            if _STEP.search(line) or any(mark in line for mark in _CRASH_START)
        ),
        max(0, len(lines) - 5),
    )
    with open(dest, "w", errors="surrogateescape") as out:
        out.writelines(lines[:cut])
        written = sum(len(x) for x in lines)
        start = rng.randrange(len(blocks))
        i = 0
        while written < size:
            block = blocks[(start + i) % len(blocks)]
            out.write(block)
            written += len(block)
            i += 1
        out.writelines(lines[cut:])


def build_archive(
    archive: Path, runs: int, min_mb: float, max_mb: float, broken_every: int
) -> dict[str, dict[str, object]]:
    """The archive of ``runs`` runs; returns run name -> the case's ``expected`` (empty for a
    run whose log is garbage)."""
    rng = random.Random(20261130)
    cases = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith("_"))
    expected = {c: json.loads((CORPUS / c / "case.json").read_text())["expected"] for c in cases}
    blocks = _filler_blocks(32, rng)
    truth: dict[str, dict[str, object]] = {}
    for n in range(runs):
        case = cases[n % len(cases)]
        moment = BASE_TIME + n * 2400
        name = f"{time.strftime('%Y-%m-%d', time.gmtime(moment))}/{case}-{n:04d}"
        run = archive / name
        shutil.copytree(CORPUS / case, run, copy_function=shutil.copyfile)
        if broken_every and n % broken_every == broken_every - 1:
            (run / "train.log").write_bytes(rng.randbytes(256 * 1024))
            for other in run.rglob("*"):
                if other.is_file() and other.name != "train.log":
                    other.unlink()
            truth[name] = {}
        else:
            size = int(rng.uniform(min_mb, max_mb) * 1024 * 1024)
            _grow_log(CORPUS / case / "train.log", run / "train.log", size, blocks, rng)
            truth[name] = expected[case]
        for path in run.rglob("*"):
            os.utime(path, (moment, moment))
    return truth


def _triage(*args: str, cwd: Path) -> tuple[float, str]:
    command = [sys.executable, "-m", "oomlens", "triage", *args]
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"triage failed ({done.returncode}):\n{done.stderr}")
    return elapsed, done.stderr.strip().splitlines()[-1]


def _burn(_: object) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - started


def parallel_capacity() -> float:
    """How many CPU-bound Python processes' worth of work this machine does at once with two
    (2.0 on two free cores; less on a shared or throttled VM)."""
    alone = min(_burn(0) for _ in range(2))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        together = max(pool.map(_burn, [0, 1]))
    return 2 * alone / together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--min-mb", type=float, default=1.0)
    parser.add_argument("--max-mb", type=float, default=6.0)
    parser.add_argument("--broken-every", type=int, default=200, help="every Nth run is garbage")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--keep", action="store_true", help="keep the archive and outputs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="oomlens-triage-bench-", dir=args.dir))
    archive = work / "archive"
    try:
        started = time.perf_counter()
        truth = build_archive(archive, args.runs, args.min_mb, args.max_mb, args.broken_every)
        # Write the archive out before timing: a real archive is not 4 GB of dirty pages
        # that the kernel flushes while triage reads it.
        os.sync()
        size = sum(p.stat().st_size for p in archive.rglob("*") if p.is_file())
        logs = sum(p.stat().st_size for p in archive.rglob("train.log"))
        print(
            f"archive: {args.runs} runs, {size / 1e9:.2f} GB ({logs / 1e9:.2f} GB of train.log,"
            f" {logs / args.runs / 1e6:.1f} MB per log on average), built in"
            f" {time.perf_counter() - started:.0f} s"
        )
        jobs = str(args.jobs)
        store = str(work / "store.sqlite")
        table = str(work / "runs.csv")
        first, line = _triage(str(archive), "--jobs", jobs, "--store", store, "-o", table, cwd=work)
        print(f"first triage (--jobs {jobs}):     {first:6.1f} s   [{line}]")
        again, line = _triage(str(archive), "--jobs", jobs, "--store", store, "-o", table, cwd=work)
        print(f"re-run, nothing changed:     {again:6.1f} s   [{line}]")
        for log in sorted(archive.rglob("train.log"))[::100][:10]:
            with open(log, "a") as out:
                out.write("step 1/1 loss 1.0 (0.1s)\n")
        touched, line = _triage(
            str(archive), "--jobs", jobs, "--store", store, "-o", table, cwd=work
        )
        print(f"re-run, 10 logs changed:     {touched:6.1f} s   [{line}]")

        with open(table, newline="") as stream:
            rows = list(csv.DictReader(stream))
        verdicts = diagnoses = errors = 0
        for row in rows:
            want = truth.get(row["run"])
            if want == {}:
                errors += bool(row["error"])
            elif want:
                verdicts += row["verdict"] == want["verdict"]
                allowed = {want["diagnosis"], *want.get("acceptable", [])}  # type: ignore[misc]
                diagnoses += (row["diagnosis"] or None) in allowed
        broken = sum(1 for want in truth.values() if want == {})
        print(
            f"rows: {len(rows)} for {len(truth)} runs; expected verdict {verdicts}, expected"
            f" diagnosis {diagnoses} of {len(truth) - broken}; {errors} of {broken} garbage"
            " logs are rows with their error"
        )

        one, line1 = _triage(str(archive), "--jobs", "1", "--no-store", "--shard", "1/2", cwd=work)
        two, line2 = _triage(str(archive), "--jobs", "2", "--no-store", "--shard", "1/2", cwd=work)
        print(f"half, --jobs 1:              {one:6.1f} s   [{line1}]")
        print(f"half, --jobs 2:              {two:6.1f} s   [{line2}]")
        print(
            f"speed-up --jobs 1 -> 2:      {one / two:6.2f}x  (this machine runs two CPU-bound"
            f" processes at {parallel_capacity():.2f}x the work of one)"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
