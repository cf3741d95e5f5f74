"""What-if replay speed: replaying a ~100 MB snapshot vs a bare ``pickle.load`` of it.

Generates a torch 2.11-shaped snapshot whose history is consistent with an allocator (every
``segment_alloc``, block address and OOM is what the caching allocator would have done): a
training loop with real shapes (a 24-layer, width-2048 transformer's parameters, gradients,
AdamW states, activations and temporaries, variable sequence lengths) is run through oomlens'
allocator model, which records each event as torch does, with the real Python stacks of the
template snapshot in ``tests/assets/snapshots``.  The ring buffer keeps the newest events (the
trace starts mid-run) and the run ends at an OOM.  :class:`RecordingMemory` is also used by the
tests to make small consistent snapshots.

Measures a bare ``pickle.load`` in a process of its own, then in a second process:
``load_snapshot`` (oomlens' restricted loader); the rewind, limit inference and self-check (the
replay under the recorded setting, compared event by event); one replay of the loaded history
with expandable segments, interleaved five times with a bare ``pickle.load`` of the same file
so that both see the same machine load (best of five each); and the default ladder (six
settings, each replayed from both starts).

Usage::

    python bench/whatif_bench.py                  # ~100 MB
    python bench/whatif_bench.py --size-mb 20
    python bench/whatif_bench.py --file existing.pickle

Measured on the project's 2-core development machine: see docs/benchmarks.md.
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
sys.path.insert(0, str(ROOT))

from oomlens.analysis.whatif.alloc_conf import AllocConf  # noqa: E402
from oomlens.analysis.whatif.allocator_blocks import Block  # noqa: E402
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit  # noqa: E402

MiB = 1024**2
TEMPLATE = (
    ROOT / "tests" / "assets" / "snapshots" / "snapshot_t211_stacks_python_expandable_oom.pickle"
)
DEVICE_TOTAL = 150_109_880_320


class OutOfMemory(Exception):
    """The recorded allocator ran out (the snapshot then ends with an ``oom`` entry)."""


class RecordingMemory:
    """Allocations served by the allocator model and recorded as torch 2.11 records them.

    ``alloc(nbytes, stream=0, frames=())`` / ``free(handle)`` / ``step(label)`` (the following
    entries' ``user_metadata``); ``snapshot()`` builds the ``_snapshot()`` dict: the segments
    of the model's final state and the trace (the last ``max_entries`` entries).
    """

    def __init__(self, conf: AllocConf, limit: Limit, *, max_entries: int | None = None) -> None:
        self.conf = conf
        self.model = CachingAllocatorModel(conf, limit, synthetic_top=0x7F0000000000)
        self.trace: list[dict[str, Any]] = []
        self.max_entries = max_entries
        self.blocks: dict[int, tuple[Block, list[Any]]] = {}
        self.handles = 0
        self.label = ""
        self.clock = 1_796_014_700_000_000

    def _entry(self, action: str, addr: int, size: int, stream: int, frames: Any) -> None:
        self.clock += 3
        entry = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": stream,
            "time_us": self.clock,
            "compile_context": "N/A",
            "user_metadata": self.label,
            "frames": frames,
        }
        self.trace.append(entry)

    def _segment_events(self) -> None:
        for event in self.model.events:
            self._entry(event.action, event.addr, event.size, event.stream, [])
        self.model.events.clear()

    def alloc(self, nbytes: int, stream: int = 0, frames: Any = ()) -> int:
        frames = list(frames) if not isinstance(frames, list) else frames
        block = self.model.malloc(nbytes, stream)
        self._segment_events()
        if block is None:
            self.clock += 3
            limit = self.model.limit
            used = self.model.reserved
            free = DEVICE_TOTAL - used if limit.capacity is None else limit.capacity - used
            self.trace.append(
                {
                    "action": "oom",
                    "device_free": free,
                    "size": self.model.round_size(nbytes),
                    "stream": stream,
                    "time_us": self.clock,
                    "compile_context": "N/A",
                    "user_metadata": self.label,
                    "frames": frames,
                }
            )
            raise OutOfMemory(self.label)
        self._entry("alloc", block.addr, nbytes, stream, frames)
        self.handles += 1
        self.blocks[self.handles] = (block, frames)
        return self.handles

    def free(self, handle: int) -> None:
        block, frames = self.blocks.pop(handle)
        self._entry("free_requested", block.addr, block.requested, block.stream, frames)
        self._entry("free_completed", block.addr, block.requested, block.stream, frames)
        self.model.free(block)

    def step(self, label: str) -> None:
        self.label = label

    def empty_cache(self) -> None:
        self.model.empty_cache()
        self._segment_events()

    def snapshot(self) -> dict[str, Any]:
        """The ``torch.cuda.memory._snapshot()`` dict of the model's state and history."""
        trace = self.trace
        if self.max_entries is not None and len(trace) > self.max_entries:
            trace = trace[-self.max_entries :]
        return {
            "segments": self._segments(),
            "device_traces": [trace],
            "allocator_settings": allocator_settings(self.conf),
            "external_annotations": [],
        }

    def _segments(self) -> list[dict[str, Any]]:
        live = {block.addr: (block, frames) for block, frames in self.blocks.values()}
        heads: dict[int, Block] = {}
        for pool in self.model.pools:
            for block in pool.by_addr.values():
                heads[block.addr] = block
        for block, _ in live.values():
            heads[block.addr] = block
        segments = []
        for block in sorted(heads.values(), key=lambda item: item.addr):
            previous = block.prev
            if previous is not None and previous.mapped:
                continue
            blocks = []
            walker: Block | None = block
            while walker is not None and walker.mapped:
                state = "active_allocated" if walker.allocated else "inactive"
                frames = live[walker.addr][1] if walker.allocated else []
                blocks.append(
                    {
                        "address": walker.addr,
                        "size": walker.size,
                        "requested_size": walker.requested if walker.allocated else 0,
                        "state": state,
                        "frames": frames,
                    }
                )
                walker = walker.next
            total = sum(item["size"] for item in blocks)
            allocated = sum(item["size"] for item in blocks if item["state"] != "inactive")
            requested = sum(
                item["requested_size"] for item in blocks if item["state"] != "inactive"
            )
            segments.append(
                {
                    "device": 0,
                    "address": block.addr,
                    "total_size": total,
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": requested,
                    "stream": block.stream,
                    "segment_type": "small" if block.small else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": block.reservation is not None,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return segments


def allocator_settings(conf: AllocConf) -> dict[str, Any]:
    """``allocator_settings`` as torch 2.11 writes it."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": conf.text,
        "max_split_size": -1 if conf.max_split_size is None else conf.max_split_size,
        "garbage_collection_threshold": conf.garbage_collection_threshold,
        "expandable_segments": conf.expandable_segments,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": False,
        "roundup_power2_divisions": {
            str(1 << index): value for index, value in enumerate(conf.roundup_power2_divisions)
        },
    }


# --------------------------------------------------------------------------------------------
# The benchmark's workload
# --------------------------------------------------------------------------------------------


def _stacks() -> list[list[Any]]:
    """Real allocation stacks of the template (torch 2.11, stacks='python')."""
    from oomlens.ingest.snapshot.unpickler import restricted_load

    data = restricted_load(TEMPLATE).data
    assert isinstance(data, dict)
    stacks: dict[int, list[Any]] = {}
    for entry in data["device_traces"][0]:
        frames = entry.get("frames")
        if entry["action"] == "alloc" and frames:
            stacks.setdefault(id(frames), frames)
    return list(stacks.values()) or [[]]


def training_workload(
    memory: RecordingMemory, target_entries: int, *, seed: int = 0, oom_at_end: bool = True
) -> None:
    """A transformer's training loop (real shapes, variable sequence lengths) until the trace
    holds ``target_entries``, then a request that cannot fit."""
    rng = random.Random(seed)
    stacks = _stacks()
    layers, width, vocab = 24, 2048, 32000
    memory.step("init")
    params = []
    shapes = ((3 * width, width), (width, width), (4 * width, width), (width, 4 * width))
    for _ in range(layers):
        params.extend(
            memory.alloc(rows * columns * 2, frames=rng.choice(stacks)) for rows, columns in shapes
        )
        params.extend(memory.alloc(width * 2, frames=rng.choice(stacks)) for _ in range(4))
    params.append(memory.alloc(vocab * width * 2, frames=rng.choice(stacks)))
    states: list[int] = []
    step = 0
    while len(memory.trace) < target_entries:
        memory.step(f"step{step}")
        tokens = rng.choice((512, 768, 1024, 1536, 2048))
        batch = 4
        activations = []
        for _ in range(layers):
            activations.extend(
                memory.alloc(batch * tokens * width * multiple * 2, frames=rng.choice(stacks))
                for multiple in (1, 3, 1, 4, 4, 1)
            )
            scratch = memory.alloc(batch * tokens * 4, frames=rng.choice(stacks))
            memory.free(scratch)
            small = [
                memory.alloc(rng.choice((512, 2048, 8192)), frames=rng.choice(stacks))
                for _ in range(3)
            ]
            for handle in small:
                memory.free(handle)
        logits = memory.alloc(batch * tokens * vocab * 2, frames=rng.choice(stacks))
        memory.free(logits)
        grads = []
        for _ in range(layers):
            for _ in range(6):
                memory.free(activations.pop())
            grads.extend(
                memory.alloc(width * width * 2 * factor, frames=rng.choice(stacks))
                for factor in (3, 1, 4, 4)
            )
        if not states:
            states = [
                memory.alloc(width * width * 4 * factor, frames=rng.choice(stacks))
                for _ in range(layers)
                for factor in (3, 1, 4, 4)
                for _ in range(2)
            ]
        for handle in grads:
            memory.free(handle)
        step += 1
    if oom_at_end:
        memory.step("final")
        try:
            memory.alloc(10**15, frames=rng.choice(stacks))
        except OutOfMemory:
            pass


def generate(target_bytes: int, *, seed: int = 0) -> dict[str, Any]:
    """A consistent snapshot of about ``target_bytes`` pickled (see the module docstring)."""
    probe = RecordingMemory(AllocConf(), Limit())
    training_workload(probe, 20_000, seed=seed, oom_at_end=False)
    per_entry = max(20, len(pickle.dumps(probe.snapshot(), protocol=4)) // len(probe.trace))
    kept = target_bytes // per_entry
    memory = RecordingMemory(AllocConf(), Limit(), max_entries=kept)
    training_workload(memory, int(kept / 0.9), seed=seed)
    return memory.snapshot()


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------

_BARE = """
import os, pickle, sys, time
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
print("RESULT " + str(time.perf_counter() - start), flush=True)
os._exit(0)
"""

_OOMLENS = """
import os, pickle, sys, time, json
sys.path.insert(0, sys.argv[2])
from oomlens.ingest.snapshot import load_snapshot
from oomlens.analysis.whatif import _Context, parse_alloc_conf, run_whatif
from oomlens.analysis.whatif.replay import replay
from oomlens.analysis.whatif.allocator_model import Limit
figures = {}
start = time.perf_counter()
snapshot = load_snapshot(sys.argv[1])
figures["load_s"] = time.perf_counter() - start
trace = snapshot.raw.device_traces[0]
figures["entries"] = len(trace)
start = time.perf_counter()
context = _Context(snapshot, 0)
figures["rewind_limit_selfcheck_s"] = time.perf_counter() - start
figures["self_check_passed"] = context.check.passed
conf = parse_alloc_conf("expandable_segments:True")
limit = Limit(allowed=context.recorded_limit.bytes)
bare, replays = [], []
for _ in range(5):  # interleaved, so that both see the same machine load
    start = time.perf_counter()
    with open(sys.argv[1], "rb") as handle:
        data = pickle.load(handle)
    bare.append(time.perf_counter() - start)
    del data
    start = time.perf_counter()
    replay(trace, context.start, conf, limit, releases=context.releases)
    replays.append(time.perf_counter() - start)
figures["bare_s"] = min(bare)
figures["one_replay_s"] = min(replays)
start = time.perf_counter()
result = run_whatif(snapshot)
figures["whatif_ladder_s"] = time.perf_counter() - start
figures["predictions"] = len(result.predictions)
print("RESULT " + json.dumps(figures), flush=True)
os._exit(0)
"""


def _run(code: str, path: Path) -> str:
    process = subprocess.run(
        [sys.executable, "-c", code, str(path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    if process.returncode != 0:
        raise SystemExit(process.stderr[-3000:])
    return next(
        line[len("RESULT ") :] for line in process.stdout.splitlines() if line.startswith("RESULT")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--file", type=Path, help="measure this snapshot instead")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    path = args.file
    if path is None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"whatif_snapshot_{int(args.size_mb)}mb.pickle"
        start = time.perf_counter()
        data = generate(int(args.size_mb * MiB), seed=args.seed)
        with open(path, "wb") as handle:
            pickle.dump(data, handle, protocol=4)
        del data
        print(f"generated {path} in {time.perf_counter() - start:.1f} s")
    size = path.stat().st_size / MiB
    bare = float(_run(_BARE, path))
    figures = json.loads(_run(_OOMLENS, path))
    print(f"snapshot: {path.name}, {size:.1f} MiB, {figures['entries']} trace entries")
    print(f"  bare pickle.load, own process:  {bare:7.2f} s")
    print(f"  bare pickle.load (best of 5):   {figures['bare_s']:7.2f} s")
    print(f"  oomlens load_snapshot:          {figures['load_s']:7.2f} s")
    print(
        f"  rewind + limit + self-check:    {figures['rewind_limit_selfcheck_s']:7.2f} s "
        f"(passed: {figures['self_check_passed']})"
    )
    print(
        f"  one replay (best of 5):         {figures['one_replay_s']:7.2f} s "
        f"({figures['one_replay_s'] / figures['bare_s']:.2f}x the bare load beside it)"
    )
    print(
        f"  whatif, default ladder:         {figures['whatif_ladder_s']:7.2f} s "
        f"({figures['predictions']} settings)"
    )
    if args.file is None and not args.keep:
        os.unlink(path)


if __name__ == "__main__":
    main()
