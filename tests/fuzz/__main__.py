"""``python -m tests.fuzz``: a fuzz campaign over every input kind; prints its figures.

Cases are split over ``--jobs`` worker processes forked from one warm process; each worker
runs its cases one after another (each in its own forked child, see ``runner``) and writes one
JSON line per case to ``--results``.  Findings are copied to ``--findings``.  Exit status 1
when there is any finding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from tests.fuzz.cases import KINDS, make_case, plan
from tests.fuzz.runner import KILL_AFTER, run_case, warm_up


def _worker(cases: list[tuple[str, int]], seed: int, results: Path, keep: Path | None,
            stop_at: float, clock: str, kill_after: float) -> None:  # fmt: skip
    with results.open("a") as out:
        for kind, number in cases:
            if time.monotonic() > stop_at:
                break
            case = make_case(kind, number, seed)
            result = run_case(case, keep, clock=clock, kill_after=kill_after)
            out.write(json.dumps(result) + "\n")
            out.flush()


def campaign(
    count: int,
    seed: int,
    jobs: int,
    results: Path,
    keep: Path | None,
    seconds: float | None = None,
    kinds: tuple[str, ...] = KINDS,
    clock: str = "wall",
    kill_after: float = KILL_AFTER,
) -> list[dict]:
    """Run ``count`` cases (fewer when ``seconds`` run out) and return their results."""
    warm_up()
    todo = plan(count, seed, kinds)
    results.unlink(missing_ok=True)
    stop_at = time.monotonic() + (seconds if seconds is not None else 10**9)
    parts = [(results.with_suffix(f".{n}.jsonl"), todo[n::jobs]) for n in range(jobs)]
    pids = []
    for path, part in parts:
        path.unlink(missing_ok=True)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _worker(part, seed, path, keep, stop_at, clock, kill_after)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    lines = []
    with results.open("w") as merged:
        for path, _ in parts:
            if path.exists():
                for line in path.read_text().splitlines():
                    merged.write(line + "\n")
                    lines.append(json.loads(line))
                path.unlink()
    return lines


def summary(results: list[dict]) -> str:
    by_kind = Counter(r["kind"] for r in results)
    found = [(r, kind, detail) for r in results for kind, detail in r["findings"]]
    out = [f"{len(results)} inputs: " + ", ".join(f"{k} {by_kind[k]}" for k in KINDS)]
    classes = Counter(kind for _, kind, _ in found)
    out.append(f"findings: {len(found)} " + (str(dict(classes)) if classes else "(none)"))
    for r, kind, detail in found[:40]:
        out.append(f"  {kind}: {r['kind']}-{r['number']} ({r['description']}): {detail[:300]}")
    exits = Counter(r["exit_code"] for r in results)
    out.append("exit codes: " + ", ".join(f"{c}: {n}" for c, n in sorted(exits.items())))
    slow = sorted(results, key=lambda r: r["seconds"], reverse=True)[:5]
    out.append(
        "slowest: "
        + "; ".join(
            f"{r['seconds']:.1f} s {r['kind']}-{r['number']} ({r['description']})" for r in slow
        )
    )
    big = sorted(results, key=lambda r: r["memory"], reverse=True)[:5]
    out.append(
        "largest memory growth: "
        + "; ".join(
            f"{r['memory'] / 2**20:.0f} MiB {r['kind']}-{r['number']} ({r['description']})"
            for r in big
        )
    )
    for kind in KINDS:
        mine = [r for r in results if r["kind"] == kind]
        if mine:
            out.append(
                f"  {kind}: {len(mine)} inputs, max {max(r['seconds'] for r in mine):.1f} s"
                f" (cpu {max(r.get('cpu_seconds', 0.0) for r in mine):.1f} s),"
                f" max {max(r['memory'] for r in mine) / 2**20:.0f} MiB"
            )
    total = sum(r["seconds"] for r in results)
    out.append(f"case time: {total:.0f} s in total, {total / max(1, len(results)):.2f} s each")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--count", type=int, default=200, help="cases to run (default 200)")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--results", type=Path, default=Path("/tmp/oomlens-fuzz.jsonl"))
    parser.add_argument("--findings", type=Path, default=None, help="copy failing cases here")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="judge the time limit on wall time, or on each case's CPU time (a shared machine)",
    )
    parser.add_argument(
        "--kill-after",
        type=float,
        default=None,
        help=f"kill a case after this much wall time (default {KILL_AFTER:.0f} s; 120 s with "
        "--clock cpu)",
    )
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if args.findings is not None:
        args.findings.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    kill_after = args.kill_after or (120.0 if args.clock == "cpu" else KILL_AFTER)
    results = campaign(args.count, args.seed, args.jobs, args.results, args.findings,
                       args.seconds, kinds, args.clock, kill_after)  # fmt: skip
    print(summary(results))
    print(f"wall time: {time.monotonic() - started:.0f} s; results in {args.results}")
    return 1 if any(r["findings"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
