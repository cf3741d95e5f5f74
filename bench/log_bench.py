# ruff: noqa: E501 - the log line templates below are kept whole, as the tools print them
"""Benchmark: oomlens' streaming log reader against ``grep -c -E`` on a multi-GB log.

Generates a multi-rank training log shaped like a real ZeRO-3 run launched with
``torchrun --tee 3`` (every line ``[defaultN]:``-prefixed): per step and rank, NCCL INFO
chatter, a repeated UserWarning with its source line, tqdm progress rewrites, c10 warnings;
on rank 0 DeepSpeed ``step=`` lines, ``see_memory_usage`` blocks (``memory_breakdown``) and
``pytorch allocator cache flushes`` warnings; at the end one OOM traceback (the real torch
2.11 fragmentation message of the shared samples), the peers' NCCL watchdog timeouts and the
torchrun failure summary.  Line shapes are taken from the shared samples and the reference
notes; the numbers vary by step.

Then it runs, each in a subprocess on the same (page-cached) file: oomlens' ``read_log``,
and ``grep -c -E`` with the reader's prefilter anchors (the same lines a line-oriented tool
would have to look at), and prints wall time and peak RSS of both.

    python bench/log_bench.py [--size-gb 2] [--ranks 8] [--memory-every 64] [--dir /tmp] [--keep]

``--memory-every 8`` makes a log as dense in ``see_memory_usage`` blocks as a leak hunt with
``memory_breakdown`` on: the reader then decodes about one line in ten, and its time grows
with that count rather than with the log's size.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from oomlens.ingest.log import ANCHORS  # noqa: E402

SAMPLE = ROOT / "tests" / "assets" / "logs" / "lab_log_torch2.11_h200.txt"


def _real_tail() -> tuple[list[str], list[str]]:
    """The fragmentation traceback and one torchrun failure block, from the real sample."""
    lines = SAMPLE.read_text().splitlines()
    start = lines.index(
        "--- stderr ---", lines.index(next(x for x in lines if " B2_frag_full " in x))
    )
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("--- rc="))
    traceback = [x for x in lines[start + 1 : end] if x]
    block_start = next(
        i
        for i, x in enumerate(lines)
        if x.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
    )
    block_end = next(i for i in range(block_start + 3, len(lines)) if lines[i].startswith("=" * 20))
    return traceback, lines[block_start : block_end + 1]


def generate(path: Path, size: int, ranks: int, memory_every: int) -> dict[str, int]:
    traceback, block = _real_tail()
    counts = {"steps": 0, "memory_blocks": 0, "flush_warnings": 0}
    step = 0
    written = 0
    with open(path, "w", buffering=1 << 22) as out:
        out.write(
            "W1130 04:59:45.737000 2167 torch/distributed/run.py:851] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default\n"
        )
        while written < size:
            chunk: list[str] = []
            for r in range(ranks):
                p = f"[default{r}]:"
                chunk.extend(
                    f"{p}node-0:{2200 + r}:{2300 + r} [{r}] NCCL INFO Channel {channel:02d}/24 : 0 1 2 3 4 5 6 7 via P2P/CUMEM/read\n"
                    for channel in range(6)
                )
                chunk.append(
                    f"{p}/opt/torch/.venv/lib/python3.12/site-packages/torch/utils/checkpoint.py:85: UserWarning: None of the inputs have requires_grad=True. Gradients will be None\n"
                )
                chunk.append(f"{p}  warnings.warn(\n")
                chunk.append(
                    f"{p}[W1130 05:00:{step % 60:02d}.123456789 reducer.cpp:1400] Warning: find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in the forward pass. (function operator())\n"
                )
                pct = step % 100
                chunk.append(
                    f"{p} {pct}%|{'#' * (pct // 10):<10}| {step % 1000}/1000 [12:10<14:52,  1.62s/it]\r{p} {pct}%|{'#' * (pct // 10):<10}| {step % 1000 + 1}/1000 [12:11<14:51,  1.62s/it]\n"
                )
                chunk.append(
                    f"{p}batch {step} rank {r} tokens 4096 seq 2048 time 0.{step % 1000:03d}s\n"
                )
            if step % 8 == 0:
                chunk.append(
                    f"[default0]:[2026-11-30 05:00:{step % 60:02d},000] [INFO] [logging.py:107:log_dist] [Rank 0] step={step}, skipped=0, lr=[1.9e-05], mom=[(0.9, 0.999)]\n"
                )
                counts["steps"] += 1
            if step % memory_every == 0:
                for label in (
                    "Engine before forward",
                    "Engine after forward",
                    "Engine before backward",
                    "Engine after backward",
                    "Engine before step",
                    "Engine after step",
                ):
                    ma = 10 + (step % 5000) * 0.001
                    chunk.append(f"[default0]:{label}\n")
                    chunk.append(
                        f"[default0]:MA {round(ma, 2)} GB         Max_MA {round(ma + 2, 2)} GB         CA {round(ma + 5, 2)} GB         Max_CA {int(ma + 6)} GB \n"
                    )
                    chunk.append(
                        "[default0]:CPU Virtual Memory:  used = 112.3 GB, percent = 10.2%\n"
                    )
                    counts["memory_blocks"] += 1
            if step % 64 == 0:
                chunk.append(
                    f"[default0]:[2026-11-30 05:00:{step % 60:02d},500] [WARNING] [stage3.py:2391:step] {1 + step % 3} pytorch allocator cache flushes since last step. this happens when there is high memory pressure and is detrimental to performance.\n"
                )
                counts["flush_warnings"] += 1
            text = "".join(chunk)
            out.write(text)
            written += len(text.encode())
            step += 1
        for x in traceback:
            out.write(f"[default3]:[rank3]: {x}\n")
        for r in range(ranks):
            if r != 3:
                out.write(
                    f"[default{r}]:[rank{r}]:[E1130 05:10:00.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.\n"
                )
        out.write("\n".join(block) + "\n")
    counts["bytes"] = path.stat().st_size
    return counts


def _ere(anchor: bytes) -> str:
    """The anchor as a POSIX ERE (a trailing newline becomes ``$``)."""
    text = anchor.decode()
    end = "$" if text.endswith("\n") else ""
    return re.escape(text.rstrip("\n")).replace("\\ ", " ") + end


def _measure(command: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + system), peak RSS bytes and output of a command."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        sink.seek(0)
        output = sink.read().decode()
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{command[0]} failed: {output}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, output.strip()


READER = """
import sys, time
from oomlens.ingest.log import read_log
facts = read_log(sys.argv[1])
ev = facts.oom_events[0] if facts.oom_events else None
print(f"lines={facts.lines} oom_events={len(facts.oom_events)} rank={ev.source.rank if ev else None} "
      f"line={ev.source.line if ev else None} memory_samples={sum(s.total_samples for s in facts.memory)} "
      f"cache_flush_warnings={facts.cache_flushes.warnings} steps={facts.steps.total} "
      f"peer_failures={len(facts.peer_failures)} summaries={len(facts.failure_summaries)}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument(
        "--memory-every",
        type=int,
        default=64,
        help="steps between DeepSpeed memory_breakdown rounds (6 see_memory_usage blocks each)",
    )
    parser.add_argument("--dir", default=None, help="where to write the log (deleted afterwards)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="oomlens-bench-", dir=args.dir))
    path = workdir / "run.log"
    try:
        t0 = time.perf_counter()
        counts = generate(path, int(args.size_gb * 1024**3), args.ranks, args.memory_every)
        print(
            f"generated {counts['bytes'] / 1024**3:.2f} GiB in {time.perf_counter() - t0:.0f} s: "
            f"{counts['memory_blocks']} see_memory_usage blocks, {counts['flush_warnings']} cache-flush "
            f"warnings, {counts['steps']} step lines, {args.ranks} ranks, one OOM at the end"
        )
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache
        pattern = "|".join(_ere(a) for a in ANCHORS)
        grep = shutil.which("grep") or "grep"
        g_time, g_cpu, g_rss, g_out = _measure([grep, "-c", "-E", pattern, str(path)])
        o_time, o_cpu, o_rss, o_out = _measure([sys.executable, "-c", READER, str(path)])
        try:
            import ahocorasick_rs  # noqa: F401

            prefilter = "ahocorasick_rs"
        except ImportError:
            prefilter = "re alternation (install ahocorasick-rs for speed)"
        size_mb = counts["bytes"] / 1024**2
        print(
            f"grep -c -E ({len(ANCHORS)} anchors): wall {g_time:6.2f} s  cpu {g_cpu:6.2f} s  "
            f"{size_mb / g_time:6.0f} MB/s  peak RSS {g_rss / 1024**2:6.1f} MiB  matching lines {g_out}"
        )
        print(
            f"oomlens read_log ({prefilter}): wall {o_time:6.2f} s  cpu {o_cpu:6.2f} s  "
            f"{size_mb / o_time:6.0f} MB/s  peak RSS {o_rss / 1024**2:6.1f} MiB"
        )
        print(f"  found: {o_out}")
        print(
            f"ratio oomlens/grep: wall {o_time / g_time:.2f}x, cpu {o_cpu / g_cpu:.2f}x "
            "(target <= 3x); peak RSS target < 200 MiB"
        )
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
