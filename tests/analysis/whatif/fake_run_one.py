"""A stand-in for ``fixtures/whatif/_scenarios/run_one.py`` without a GPU.

Same command line and the same result JSON, but the workload runs through oomlens' allocator
model (``bench/whatif_bench.py``'s recorder), which writes a torch-shaped snapshot.  The tests
drive ``run_whatif.py`` and ``collect.py`` with it, so that the GPU run is plumbing already
exercised.  ``transformer`` stands in with the ``rounding`` workload (no torch here).
"""

import argparse
import json
import os
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "fixtures" / "whatif" / "_scenarios"))

from whatif_bench import OutOfMemory, RecordingMemory  # noqa: E402
from workloads import SYNTHETIC  # noqa: E402

from oomlens.analysis.whatif.alloc_conf import parse_alloc_conf  # noqa: E402
from oomlens.analysis.whatif.allocator_model import Limit  # noqa: E402

TOTAL = 150_109_880_320


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True)
    parser.add_argument("--limit-bytes", type=int, default=0)
    parser.add_argument("--snapshot", default="")
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    conf_text = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    allowed = int(args.limit_bytes / TOTAL * TOTAL) if args.limit_bytes else None
    memory = RecordingMemory(parse_alloc_conf(conf_text), Limit(allowed=allowed))
    workload = SYNTHETIC.get(args.family, SYNTHETIC["rounding"])
    outcome, step = "fits", None
    try:
        workload(memory)
    except OutOfMemory as err:
        outcome, step = "oom", str(err)
    peak_allocated = 0
    allocated = 0
    sizes: dict[int, int] = {}
    for entry in memory.trace:
        if entry["action"] == "alloc":
            size = memory.model.round_size(entry["size"])
            sizes[entry["addr"]] = size
            allocated += size
            peak_allocated = max(peak_allocated, allocated)
        elif entry["action"] == "free_requested":
            allocated -= sizes.pop(entry["addr"], 0)
    if args.snapshot:
        with open(args.snapshot, "wb") as handle:
            pickle.dump(memory.snapshot(), handle)
    result = {
        "family": args.family,
        "alloc_conf": conf_text,
        "limit_bytes": args.limit_bytes or None,
        "allowed_bytes": allowed,
        "total_capacity": TOTAL,
        "outcome": outcome,
        "oom_step": step,
        "oom_message": None if step is None else "CUDA out of memory. (simulated)",
        "max_memory_reserved": memory.model.peak_reserved,
        "max_memory_allocated": peak_allocated,
        "last_step": memory.label,
        "torch": "model",
        "wall_s": 0.0,
    }
    with open(args.result, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
