#!/usr/bin/env python3
"""Driver: the capture's overhead benchmark in one GPU call of at most four minutes (one H200).

1. ``capture_overhead.py --mode torch`` (plain PyTorch, nothing else running): the
   allocation-heavy small loop, the 350M model loop, the OOM timings, disk per rank;
2. DeepSpeed installed from ``--wheels`` (as ``fixtures/crash_logs/_scenarios/run_corpus.py``
   does: the dependency wheels, then the 0.19.8 sdist, no index), *after* step 1 so that its
   build does not share the CPU with the timed loops;
3. ``capture_overhead.py --mode zero3`` on one rank, if enough of the four minutes is left
   (its timed rounds get what remains less ``ZERO3_FIXED_S``); otherwise it is skipped and
   ``capture_bench.json`` says so.

Never runs past ``--deadline-s`` (230 s): each step has a timeout, its process group is killed
at the deadline.  Outputs in ``--out`` (5 files): ``capture_bench.json`` (both modes' JSON, or
why one is missing; the driver's timings), ``bench_torch.log``, ``bench_zero3.log``,
``progress.log``, ``capture_dirs.tar.gz`` (the bench's capture directories, snapshots left out).

Usage, from the repository root (``.wheels`` carried along)::

    python3 bench/run_capture_bench.py --wheels .wheels --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "capture_overhead.py"
T0 = time.monotonic()
ZERO3_FIXED_S = 55.0
"""What the ZeRO-3 run needs besides its timed rounds: interpreter and DeepSpeed import, the
model under zero.Init, the engine, the warm-up round (measured: about 40 s)."""
ZERO3_MIN_TIMED_S = 25.0
TORCH_TIMEOUT_S = 135.0


def log(out: Path, text: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {text}"
    print(line, flush=True)
    with open(out / "progress.log", "a") as handle:
        handle.write(line + "\n")


def left(deadline: float) -> float:
    return deadline - (time.monotonic() - T0)


def run_step(out: Path, name: str, cmd: list[str], env: dict[str, str], timeout: float) -> int:
    """Run ``cmd`` into ``bench_<name>.log``; kill its whole process group at ``timeout``."""
    log(out, f"{name}: {' '.join(cmd[1:])} (timeout {timeout:.0f} s)")
    started = time.monotonic()
    with open(out / f"bench_{name}.log", "w") as handle:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            log(out, f"{name}: killed at its timeout")
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the capture's sentinels and any stray child
    except OSError:
        pass
    tail = (out / f"bench_{name}.log").read_text(errors="replace").strip().splitlines()[-25:]
    log(out, f"{name}: rc={code} in {time.monotonic() - started:.0f} s\n    " + "\n    ".join(tail))
    return code


def install_deepspeed(out: Path, wheels: Path, timeout: float, env: dict[str, str]) -> bool:
    """DeepSpeed 0.19.8 from the wheels directory, offline, into the interpreter's
    site-packages (or a --target directory put on ``env``'s PYTHONPATH where that is not
    writable)."""
    py = sys.executable
    site = sysconfig.get_paths()["purelib"]
    target: list[str] = []
    if not os.access(site, os.W_OK):
        target = ["--target", "/tmp/ds-site"]
        env["PYTHONPATH"] = os.pathsep.join(p for p in ("/tmp/ds-site", env.get("PYTHONPATH")) if p)
    steps = [
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            *target,
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            *target,
            str(wheels / "deepspeed-0.19.8.tar.gz"),
        ],
    ]
    started = time.monotonic()
    for cmd in steps:
        remaining = timeout - (time.monotonic() - started)
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=max(1, remaining), env=env
            )
        except subprocess.TimeoutExpired:
            log(out, "deepspeed: install timed out")
            return False
        if done.returncode != 0:
            log(out, f"deepspeed: pip rc={done.returncode} {done.stderr[-800:]}")
            return False
    log(
        out,
        f"deepspeed: installed in {time.monotonic() - started:.0f} s"
        + (" (--target /tmp/ds-site)" if target else ""),
    )
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheels", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline-s", type=float, default=230.0)
    parser.add_argument("--skip-zero3", action="store_true")
    parser.add_argument(
        "--zero3-only",
        action="store_true",
        help="skip the torch loops: a longer, quieter ZeRO-3 measurement in the same deadline",
    )
    parser.add_argument(
        "--zero3-block-s",
        type=float,
        default=None,
        help="seconds per interleaved ZeRO-3 block (capture_overhead.py's --model-block-s)",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    summary: dict[str, object] = {"deadline_s": args.deadline_s}
    try:
        code = (
            None
            if args.zero3_only
            else run_step(
                out,
                "torch",
                [sys.executable, str(BENCH), "--mode", "torch", "--out", str(work)],
                env,
                min(TORCH_TIMEOUT_S, left(args.deadline_s)),
            )
        )
        summary["torch_rc"] = code
        summary["torch_done_s"] = round(time.monotonic() - T0, 1)
        zero3_skip = None
        if args.skip_zero3:
            zero3_skip = "--skip-zero3"
        elif left(args.deadline_s) < ZERO3_FIXED_S + ZERO3_MIN_TIMED_S + 20:
            zero3_skip = f"{left(args.deadline_s):.0f} s left after the torch loops"
        elif not install_deepspeed(
            out,
            Path(args.wheels).resolve(),
            left(args.deadline_s) - ZERO3_FIXED_S - ZERO3_MIN_TIMED_S,
            env,
        ):
            zero3_skip = "DeepSpeed did not install"
        elif left(args.deadline_s) < ZERO3_FIXED_S + ZERO3_MIN_TIMED_S:
            zero3_skip = f"{left(args.deadline_s):.0f} s left after installing DeepSpeed"
        if zero3_skip is None:
            timed = left(args.deadline_s) - ZERO3_FIXED_S
            zenv = {
                **env,
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29541",
            }
            summary["zero3_timed_budget_s"] = round(timed, 1)
            summary["zero3_rc"] = run_step(
                out,
                "zero3",
                [
                    sys.executable,
                    str(BENCH),
                    "--mode",
                    "zero3",
                    "--out",
                    str(work),
                    "--model-seconds",
                    f"{timed:.0f}",
                    *(
                        ["--model-block-s", str(args.zero3_block_s)]
                        if args.zero3_block_s is not None
                        else []
                    ),
                ],
                zenv,
                left(args.deadline_s),
            )
        else:
            summary["zero3_skipped"] = zero3_skip
            log(out, f"zero3: skipped ({zero3_skip})")
    finally:
        results: dict[str, object] = {}
        for mode in ("torch", "zero3"):
            path = work / f"overhead_{mode}.json"
            results[mode] = json.loads(path.read_text()) if path.exists() else None
        results["driver"] = {
            **summary,
            "wall_s": round(time.monotonic() - T0, 1),
            "conditions": "one H200 (kind nvidia-h200), one process at a time, "
            "nothing else running; DeepSpeed installed between "
            "the two modes",
        }
        (out / "capture_bench.json").write_text(json.dumps(results, indent=2) + "\n")
        with tarfile.open(out / "capture_dirs.tar.gz", "w:gz") as tar:
            captures = work / "bench-capture"
            if captures.exists():
                tar.add(
                    captures,
                    arcname="bench-capture",
                    filter=lambda t: None if ".pickle" in t.name else t,
                )
        shutil.rmtree(work, ignore_errors=True)
        log(out, f"done in {time.monotonic() - T0:.0f} s")
    torch_ok = summary.get("torch_rc") == 0 or (args.zero3_only and summary.get("zero3_rc") == 0)
    return 0 if torch_ok else 1


if __name__ == "__main__":
    sys.exit(main())
