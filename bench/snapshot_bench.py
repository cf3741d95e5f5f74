"""Snapshot loading speed and memory: oomlens vs a bare ``pickle.load`` vs ``_memory_viz stats``.

Generates a large ``torch.cuda.memory._snapshot()`` pickle with real shapes, then runs three
processes on it and prints their wall time and peak RSS:

* ``bare``: ``pickle.load`` of the file (the floor: what any reader pays);
* ``oomlens``: :func:`oomlens.ingest.snapshot.load_snapshot` + :func:`analyze_snapshot`;
* ``memviz``: ``python -m torch.cuda._memory_viz stats FILE`` (torch's CPU build will do).

Targets (issue 4): oomlens within 1.5x the bare load's time, faster than ``_memory_viz``, and
peak memory no more than 2x the bare load's.

The snapshot is built from the real torch 2.11 snapshots in ``tests/assets/snapshots`` (loaded
through oomlens' restricted loader): the same keys in the same order, the real frame dicts
(shared between stacks, as torch's symbolizer shares them), real native and Python stacks made
deeper by repeating their module-call frames, lists shared between a block and its ``alloc``
entry and between ``free_requested``/``free_completed`` as torch shares them, and a training
loop's event pattern (forward activations, backward gradients, optimizer step, per-iteration
``Optimizer.step`` annotations) with a planted leak of small tensors, a ring buffer that
wrapped, and an OOM at the end.  :func:`generate_snapshot` is also used at a small size by
the tests.

Usage::

    python bench/snapshot_bench.py                 # ~1000 MB, stacks like stacks='all'
    python bench/snapshot_bench.py --size-mb 200 --stacks python
    python bench/snapshot_bench.py --file existing.pickle   # measure an existing file

Measured on the project's 2-core, 24 GB development machine (2026-11-30, Python 3.11.7,
torch 2.13 CPU), wall time and peak RSS of the whole process:

=====================================  ==============  =================  ================
snapshot                               bare load       oomlens            _memory_viz stats
=====================================  ==============  =================  ================
stacks=all, 1027 MiB, 439k blocks,     48.5 s          26.9 s (load 17.2  44.7 s
6.8M trace entries                     4261 MiB        + analyze 8.8)     4469 MiB
                                                       4270 MiB
stacks=python, 1119 MiB, 835k blocks,  57.5 s          53.5 s (load 29.5  62.5 s
13.0M trace entries                    6165 MiB        + analyze 23.0)    6374 MiB
                                                       6174 MiB
=====================================  ==============  =================  ================

oomlens loads faster than a bare ``pickle.load`` because it pauses the cyclic garbage
collector while the (acyclic) containers are built; timings vary by +-20 % between runs on
that machine.

Each measured process exits with ``os._exit`` right after its work, so that none of them pays
for freeing millions of objects at interpreter shutdown; times are wall-clock for the whole
process (interpreter and imports included) plus, for bare and oomlens, the in-process time.
Peak RSS comes from ``wait4`` on that very process.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "tests" / "assets" / "snapshots"
MiB = 1024**2

# Templates: which real snapshot gives the stacks of each flavour.
_TEMPLATE_FILES = {
    "all": "snapshot_t211_stacks_all_oom.pickle",
    "python": "snapshot_t211_stacks_python_expandable_oom.pickle",
}


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


def _load_template(stacks: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from oomlens.ingest.snapshot.unpickler import restricted_load

    data = restricted_load(ASSETS / _TEMPLATE_FILES[stacks]).data
    assert isinstance(data, dict)
    return data


class _StackPool:
    """Distinct allocation stacks made from the template's real ones.

    Each derived stack repeats the template's module-call frames (``forward``/``_call_impl``/
    ``_wrapped_call_impl`` and the native frames between them) ``depth`` times, the way nested
    ``nn.Module`` calls look, and gets its own user frame (same file, another line): real frame
    dicts are shared, as in a real pickle.
    """

    def __init__(self, template: dict[str, Any], rng: random.Random, count: int) -> None:
        trace = template["device_traces"][0]
        seen: dict[tuple[int, ...], list[Any]] = {}
        frees: dict[tuple[int, ...], list[Any]] = {}
        for entry in trace:
            frames = entry.get("frames")
            if not frames:
                continue
            key = tuple(id(frame) for frame in frames)
            if entry["action"] == "alloc":
                seen.setdefault(key, frames)
            elif entry["action"] == "free_requested":
                frees.setdefault(key, frames)
        self.alloc_templates = list(seen.values())
        self.free_stacks = list(frees.values()) or self.alloc_templates
        self.stacks: list[list[Any]] = []
        user_frames: dict[tuple[str, int, str], dict[str, Any]] = {}
        for number in range(count):
            base = rng.choice(self.alloc_templates)
            self.stacks.append(self._derive(base, number, rng, user_frames))

    @staticmethod
    def _derive(
        base: list[Any],
        number: int,
        rng: random.Random,
        user_frames: dict[tuple[str, int, str], dict[str, Any]],
    ) -> list[Any]:
        # The module-call span: from the first 'forward' frame up to (not including) the user frame.
        python_positions = [i for i, f in enumerate(base) if f["filename"].endswith(".py")]
        if not python_positions:
            return list(base)
        user = python_positions[-1]
        first_forward = next((i for i in python_positions if base[i]["name"] == "forward"), None)
        frames = list(base)
        if first_forward is not None and first_forward < user:
            span = base[first_forward:user]
            depth = 1 + number % 4
            frames = base[:first_forward] + span * depth + base[user:]
            user = len(base[:first_forward]) + len(span) * depth
        original = frames[user]
        line = 10 + (number * 7 + rng.randrange(5)) % 900
        key = (original["filename"], line, original["name"])
        replacement = user_frames.get(key)
        if replacement is None:
            replacement = user_frames[key] = {
                "name": original["name"],
                "filename": original["filename"],
                "line": line,
            }
        frames[user] = replacement
        return frames


def generate_snapshot(
    target_bytes: int,
    *,
    stacks: str = "all",
    seed: int = 0,
    leak_per_iteration: int = 40,
    keep_fraction: float = 0.9,
) -> dict[str, Any]:
    """A snapshot dict shaped like torch 2.11's, about ``target_bytes`` once pickled.

    Ground truth planted for the tests: every complete iteration leaks ``leak_per_iteration``
    512-byte tensors allocated at one call site (``LEAK_SITE_LINE`` of the template's user
    file); the history keeps about the last ``keep_fraction`` of the events (a ring buffer that
    wrapped in the middle of an iteration); the last event is an ``oom``.
    """
    rng = random.Random(seed)
    template = _load_template(stacks)
    pool = _StackPool(template, rng, count=400)
    settings = template["allocator_settings"]
    keys = (
        "action",
        "addr",
        "size",
        "stream",
        "time_us",
        "compile_context",
        "user_metadata",
        "frames",
    )
    assert tuple(template["device_traces"][0][0].keys()) == keys

    sizes_small = [512, 1024, 4096, 16384, 65536, 262144, 1048576]
    sizes_large = [2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 24 * MiB, 64 * MiB]
    layers = 48
    # Static shapes: every layer allocates the same sizes every iteration, as real training does.
    shape = {
        (kind, layer): rng.choice(
            sizes_large if kind in ("param", "act", "grad", "opt") else sizes_small
        )
        for kind in ("param", "bias", "act", "tmp", "act_small", "grad", "opt")
        for layer in range(layers)
    }
    leak_stack = next(
        candidate
        for candidate in pool.stacks
        if any(
            f["filename"].endswith(".py") and "-packages/" not in f["filename"] for f in candidate
        )
    )
    leak_user = next(
        f for f in leak_stack if f["filename"].endswith(".py") and "-packages/" not in f["filename"]
    )
    global LEAK_SITE
    LEAK_SITE = (leak_user["filename"], leak_user["line"], leak_user["name"])

    trace: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    live: dict[int, tuple[int, int, list[Any]]] = {}  # address -> (size, requested, frames)
    free_addresses: dict[int, list[int]] = {}
    next_address = [0x7F0000000000]
    clock = [1_796_014_700_000_000]

    def tick() -> int:
        clock[0] += rng.randrange(1, 40)
        return clock[0]

    def rounded(size: int) -> int:
        return 512 if size < 512 else (size + 511) // 512 * 512

    def alloc(size: int, frames: list[Any], meta: str = "") -> int:
        block = rounded(size)
        reuse = free_addresses.get(block)
        if reuse:
            address = reuse.pop()
        else:
            address = next_address[0]
            next_address[0] += block
            trace.append(_entry(keys, "segment_alloc", address, block, tick(), meta, frames))
        trace.append(_entry(keys, "alloc", address, size, tick(), meta, frames))
        live[address] = (block, size, frames)
        return address

    def free(address: int, meta: str = "") -> None:
        block, size, _ = live.pop(address)
        frames = list(rng.choice(pool.free_stacks))
        trace.append(_entry(keys, "free_requested", address, size, tick(), meta, frames))
        trace.append(_entry(keys, "free_completed", address, size, tick(), meta, frames))
        free_addresses.setdefault(block, []).append(address)

    def stack(index: int) -> list[Any]:
        return list(pool.stacks[index % len(pool.stacks)])

    # Parameters and their gradients live for the whole run.
    for layer in range(layers):
        alloc(shape["param", layer], stack(layer * 3 + 1))
        alloc(shape["bias", layer], stack(layer * 3 + 2))

    per_iteration = None
    iteration = 0
    ends: list[int] = []
    while True:
        meta = "phase=train"
        activations = []
        for layer in range(layers):
            activations.append(alloc(shape["act", layer], stack(100 + layer), meta))
            temporary = alloc(shape["tmp", layer], stack(160 + layer), meta)
            free(temporary, meta)
            activations.append(alloc(shape["act_small", layer], stack(220 + layer), meta))
        for layer in reversed(range(layers)):
            gradient = alloc(shape["grad", layer], stack(280 + layer), meta)
            free(activations.pop(), meta)
            free(activations.pop(), meta)
            free(gradient, meta)
        annotations.append(
            {"stage": "START", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": tick()}
        )
        for layer in range(layers // 4):
            temporary = alloc(shape["opt", layer], stack(340 + layer), meta)
            free(temporary, meta)
        annotations.append(
            {"stage": "END", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": tick()}
        )
        for _ in range(leak_per_iteration):
            alloc(4, list(leak_stack), meta)  # e.g. losses kept in a list: never freed
        iteration += 1
        ends.append(len(trace))
        if per_iteration is None and iteration == 3:
            # Marginal pickled size of one iteration, with the frame memo already paid for.
            per_iteration = _pickled_size(trace) - _pickled_size(trace[: ends[1]])
            per_iteration += 120 * leak_per_iteration  # the leaked blocks in the segments
        if per_iteration is not None and iteration * per_iteration >= target_bytes:
            break

    oom_frames = stack(7)
    trace.append(
        {
            "action": "oom",
            "device_free": 149_060_452_352,
            "size": 1_099_511_627_776,
            "stream": 0,
            "time_us": tick(),
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": oom_frames,
        }
    )
    # The ring buffer keeps the newest events; the cut falls inside an iteration's forward
    # pass, so some kept frees belong to allocations that were dropped.
    first = min(int(len(ends) * (1.0 - keep_fraction)), len(ends) - 2)
    cut = ends[first] + (ends[first + 1] - ends[first]) // 3
    kept = trace[cut:]
    segments = _segments_from_live(live, template)
    active = sum(block for block, _, _ in live.values())
    kept.append(
        {
            "action": "snapshot",
            "addr": 0,
            "size": active,
            "stream": 0,
            "time_us": tick(),
            "compile_context": "N/A",
            "user_metadata": "",
        }
    )
    first_time = kept[0]["time_us"]
    return {
        "segments": segments,
        "device_traces": [kept, []],
        "allocator_settings": settings,
        "external_annotations": [
            record for record in annotations if record["time_us"] >= first_time
        ],
    }


LEAK_SITE: tuple[str, int, str] = ("", 0, "")
"""(filename, line, name) of the planted leak's user frame, set by :func:`generate_snapshot`."""


def _entry(
    keys: tuple[str, ...],
    action: str,
    address: int,
    size: int,
    time_us: int,
    meta: str,
    frames: list[Any],
) -> dict[str, Any]:
    return dict(zip(keys, (action, address, size, 0, time_us, "N/A", meta, frames), strict=True))


def _pickled_size(entries: list[Any]) -> int:
    return len(pickle.dumps(entries, protocol=4))


def _segments_from_live(
    live: dict[int, tuple[int, int, list[Any]]], template: dict[str, Any]
) -> list[dict[str, Any]]:
    """Pack the live blocks into segments the way the allocator would: small blocks in 2 MiB
    segments, each large block in its own segment rounded up to 2 MiB (its tail inactive)."""
    segment_keys = tuple(template["segments"][0].keys())
    segments: list[dict[str, Any]] = []

    def segment(address: int, blocks: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        total = sum(block["size"] for block in blocks)
        allocated = sum(block["size"] for block in blocks if block["state"] == "active_allocated")
        requested = sum(
            block["requested_size"] for block in blocks if block["state"] == "active_allocated"
        )
        values = {
            "device": 0,
            "address": address,
            "total_size": total,
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": requested,
            "stream": 0,
            "segment_type": kind,
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        }
        return {key: values[key] for key in segment_keys}

    def block(address: int, size: int, requested: int, frames: list[Any]) -> dict[str, Any]:
        return {
            "address": address,
            "size": size,
            "requested_size": requested,
            "state": "active_allocated",
            "frames": frames,
        }

    small = sorted((address, item) for address, item in live.items() if item[0] <= MiB)
    large = sorted((address, item) for address, item in live.items() if item[0] > MiB)
    current: list[dict[str, Any]] = []
    used = 0
    base = 0x7E0000000000
    for _, (size, requested, frames) in small:
        if used + size > 2 * MiB:
            current.append(
                {
                    "address": base + used,
                    "size": 2 * MiB - used,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
            segments.append(segment(base, current, "small"))
            base += 2 * MiB
            current, used = [], 0
        current.append(block(base + used, size, requested, frames))
        used += size
    if current:
        if used < 2 * MiB:
            current.append(
                {
                    "address": base + used,
                    "size": 2 * MiB - used,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        segments.append(segment(base, current, "small"))
    for address, (size, requested, frames) in large:
        total = (size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        blocks = [block(address, size, requested, frames)]
        if total > size:
            blocks.append(
                {
                    "address": address + size,
                    "size": total - size,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        segments.append(segment(address, blocks, "large"))
    segments.sort(key=lambda item: item["address"])
    return segments


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------

_BARE = """
import os, pickle, sys, time
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
print(f"INNER {time.perf_counter() - start:.3f}", flush=True)
os._exit(0)
"""

_OOMLENS = """
import os, sys, time
sys.path.insert(0, sys.argv[2])
from oomlens.ingest.snapshot import load_snapshot
from oomlens.analysis.allocator import analyze_snapshot
start = time.perf_counter()
snapshot = load_snapshot(sys.argv[1])
loaded = time.perf_counter()
analysis = analyze_snapshot(snapshot)
done = time.perf_counter()
print(f"INNER {done - start:.3f} LOAD {loaded - start:.3f} ANALYZE {done - loaded:.3f}", flush=True)
d = analysis.devices[0]
leak = d.leak.bytes_per_iteration if d.leak else None
print(f"DEVICES {len(analysis.devices)} LEAK/ITERATION {leak}", flush=True)
os._exit(0)
"""

_MEMVIZ = """
import os, runpy, sys, warnings
warnings.simplefilter("ignore")
sys.argv = ["_memory_viz", "stats", sys.argv[1]]
runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
sys.stdout.flush()
os._exit(0)
"""


def _measure(name: str, code: str, path: Path) -> dict[str, Any]:
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(path), str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate()
    wall = time.perf_counter() - start
    # communicate() reaped the child; its rusage is in RUSAGE_CHILDREN only as a running max,
    # so each measurement runs in a fresh helper process (see _measure_in_helper).
    return {
        "name": name,
        "wall_s": wall,
        "returncode": process.returncode,
        "stdout": out,
        "stderr": err[-2000:],
    }


def _measure_in_helper(name: str, path: Path) -> dict[str, Any]:
    """Run one measurement in a fresh helper so RUSAGE_CHILDREN holds only that child's peak."""
    helper = subprocess.run(
        [sys.executable, __file__, "--measure-one", name, "--file", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if helper.returncode != 0:
        raise SystemExit(f"measuring {name} failed:\n{helper.stderr}")
    return json.loads(helper.stdout.strip().splitlines()[-1])


def _measure_one(name: str, path: Path) -> None:
    import resource

    code = {"bare": _BARE, "oomlens": _OOMLENS, "memviz": _MEMVIZ}[name]
    result = _measure(name, code, path)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["peak_rss_mb"] = peak_kb / 1024 if sys.platform != "darwin" else peak_kb / MiB
    print(json.dumps(result))


def _report(path: Path, results: dict[str, dict[str, Any]]) -> None:
    size_mb = path.stat().st_size / MiB
    print(f"\nsnapshot: {path} ({size_mb:.1f} MiB)")
    print(
        f"{'':<24}{'wall s':>9}{'inner s':>10}{'peak RSS MiB':>15}{'time/bare':>11}{'RSS/bare':>10}"
    )
    bare = results["bare"]
    for name, label in (
        ("bare", "bare pickle.load"),
        ("oomlens", "oomlens load+analyze"),
        ("memviz", "_memory_viz stats"),
    ):
        if name not in results:
            continue
        result = results[name]
        inner = next(
            (line.split()[1] for line in result["stdout"].splitlines() if line.startswith("INNER")),
            "-",
        )
        time_ratio = result["wall_s"] / bare["wall_s"]
        rss_ratio = result["peak_rss_mb"] / bare["peak_rss_mb"]
        print(
            f"{label:<24}{result['wall_s']:>9.2f}{inner:>10}{result['peak_rss_mb']:>15.0f}"
            f"{time_ratio:>11.2f}{rss_ratio:>10.2f}"
        )
        if result["returncode"] != 0:
            print(f"    exit {result['returncode']}: {result['stderr'][-500:]}")
    if "oomlens" in results:
        for line in results["oomlens"]["stdout"].splitlines():
            if not line.startswith("INNER"):
                print(f"    oomlens: {line}")
            else:
                print(f"    oomlens: {line}")
        ours = results["oomlens"]
        print("\ntargets:")
        print(f"  time <= 1.5x bare:       {ours['wall_s'] / bare['wall_s']:.2f}x")
        if "memviz" in results:
            theirs = results["memviz"]["wall_s"]
            print(f"  faster than _memory_viz: {ours['wall_s']:.2f} s vs {theirs:.2f} s")
        print(f"  peak RSS <= 2x bare:     {ours['peak_rss_mb'] / bare['peak_rss_mb']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mb", type=float, default=1000.0, help="pickled size to generate (default 1000)"
    )
    parser.add_argument("--stacks", choices=sorted(_TEMPLATE_FILES), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out", help="where the snapshot is written"
    )
    parser.add_argument(
        "--file", type=Path, help="measure this existing snapshot instead of generating one"
    )
    parser.add_argument("--skip-memviz", action="store_true", help="do not run torch's _memory_viz")
    parser.add_argument("--keep", action="store_true", help="keep the generated file")
    parser.add_argument(
        "--measure-one", choices=("bare", "oomlens", "memviz"), help=argparse.SUPPRESS
    )
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure_one:
        _measure_one(args.measure_one, args.file)
        return
    if args.generate_only:
        _generate_to(args.file, args)
        return
    path = args.file
    generated = False
    if path is None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"bench_snapshot_{int(args.size_mb)}mb_{args.stacks}.pickle"
        if not path.exists():
            start = time.perf_counter()
            # Generate in a child so that this process stays small.
            command = [sys.executable, __file__, "--generate-only", "--file", str(path)]
            command += [
                "--size-mb",
                str(args.size_mb),
                "--stacks",
                args.stacks,
                "--seed",
                str(args.seed),
            ]
            subprocess.run(command, check=True)
            print(f"generated in {time.perf_counter() - start:.1f} s")
            generated = True
    results = {}
    names = ("bare", "oomlens") if args.skip_memviz else ("bare", "oomlens", "memviz")
    for name in names:
        results[name] = _measure_in_helper(name, path)
    _report(path, results)
    if generated and not args.keep:
        path.unlink()


def _generate_to(path: Path, args: argparse.Namespace) -> None:
    data = generate_snapshot(int(args.size_mb * MiB), stacks=args.stacks, seed=args.seed)
    with open(path, "wb") as handle:
        pickle.dump(data, handle, protocol=4)
    blocks = sum(len(segment["blocks"]) for segment in data["segments"])
    entries = sum(len(trace) for trace in data["device_traces"])
    size = path.stat().st_size / MiB
    segments = len(data["segments"])
    print(f"{path}: {size:.1f} MiB, {segments} segments, {blocks} blocks, {entries} trace entries")
    os._exit(0)


if __name__ == "__main__":
    main()
