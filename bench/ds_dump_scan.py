"""Throughput of the DeepSpeed config-dump scanner over a long log: prints figures, asserts nothing.

The log is generated from the real dump in tests/assets/ds_configs (DeepSpeed 0.19.8's own
output) with DeepSpeed-format step lines around it; ``--lines`` sets the noise volume.

    python bench/ds_dump_scan.py --lines 5000000
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path

from oomlens.facts import SourceRef
from oomlens.ingest.ds_config import ConfigDumpScanner

DUMP = (
    Path(__file__).parents[1]
    / "tests"
    / "assets"
    / "ds_configs"
    / "dump_hf_transformers_zero3_ws8.log"
)
NOISE = (
    "[2026-11-30 05:53:01,339] [INFO] [logging.py:107:log_dist] [Rank 0] step={}, skipped=0, "
    "lr=[0.0001], mom=[(0.9, 0.999)]"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--dumps", type=int, default=100)
    parser.add_argument("--trace-memory", action="store_true")
    args = parser.parse_args()
    dump = DUMP.read_text().splitlines()
    every = max(1, args.lines // args.dumps)
    scanner = ConfigDumpScanner()
    found = 0
    total = 0
    if args.trace_memory:
        tracemalloc.start()  # slows Python down a lot: run it apart from the timing
    start = time.perf_counter()
    # One SourceRef and one noise line for all: the figure is the scanner's cost, not the harness'.
    ref = SourceRef("bench.log", 1)
    noise = NOISE.format(10)
    for i in range(args.lines):
        if i % every == 0:
            for line in dump:
                total += 1
                found += scanner.feed(ref, line) is not None
        total += 1
        scanner.feed(ref, noise)
    found += scanner.finish() is not None
    elapsed = time.perf_counter() - start
    line = f"lines: {total:,}  dumps found: {found}  time: {elapsed:.2f}s"
    if args.trace_memory:
        _, peak = tracemalloc.get_traced_memory()
        line += f"  peak traced memory: {peak / 2**20:.1f} MiB"
    else:
        line += f"  throughput: {total / elapsed / 1e6:.2f} M lines/s"
    print(line)


if __name__ == "__main__":
    main()
