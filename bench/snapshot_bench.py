"""Snapshot loading speed and memory: oomlens vs a bare ``pickle.load`` vs ``_memory_viz stats``.

Generates snapshots of about 100 MB and 1 GB with the shapes of real recordings, then runs
each row below on each of them in a fresh process and prints the figures side by side: wall
time of the whole process, time of the work itself, CPU time, and peak RSS (``wait4`` on that
very process).

* ``bare pickle.load``: the floor, what any reader pays (the collector on, as by default);
* ``oomlens load+analyze``: :func:`~oomlens.ingest.snapshot.load_snapshot` and
  :func:`~oomlens.analysis.allocator.analyze_snapshot` as ``oomlens analyze`` calls them
  (``oomlens/session.py``): restricted unpickling, layout checks, the analysis walk;
* ``oomlens analyze (CLI)``: the whole command (imports, rules, JSON report, exit);
* ``_memory_viz stats``: ``python -m torch.cuda._memory_viz stats FILE`` (torch's CPU build).

Targets (issue 15): oomlens load+analyze within 1.3x the bare load's time and 1.2x its peak
RSS, on the shapes real recordings have, with the restricted unpickler's limits as they are.

Shapes.  ``--shape corpus`` (the default) copies the real recordings of the crash corpus
(``fixtures/crash_logs/*/snapshot_rank*.pickle``, stacks='python') and the real samples
(``tests/assets/snapshots``, the same files as the shared samples) end to end, 1 TiB apart in
address space, read through oomlens' restricted loader: their segment and block layout, their
action mix, their frame dicts (shared, as torch's symbolizer shares them) and their
frame-list sharing; with ``--stacks all`` every stack also gets a real native unwind from the
stacks='all' sample in front, as torch's default records it.  That gives many small blocks,
deep stacks and long traces: about 93k blocks and 500k trace entries per 110 MB.  ``--shape
training`` is the synthetic training loop of :func:`generate_snapshot` (planted leak, wrapped
ring buffer, OOM at the end), also used at a small size by the tests.

Usage::

    python bench/snapshot_bench.py                      # ~100 MB and ~1 GB, corpus shape
    python bench/snapshot_bench.py --size-mb 200 --shape training --stacks python
    python bench/snapshot_bench.py --file existing.pickle --repeat 3   # an existing file

Measured on the project's 2-core, 24 GB development machine (2026-12-01, Python 3.11.7,
torch 2.13 CPU), ``python bench/snapshot_bench.py``, corpus shape, stacks='all'.  The machine
was shared with other jobs (CPU pressure 75 %), so CPU seconds are the figure to compare; wall
seconds of the work in parentheses:

===========================  ========================  ========================
row                          112 MiB: 93k blocks,      1118 MiB: 926k blocks,
                             501k trace entries        5.0M trace entries
===========================  ========================  ========================
bare pickle.load             3.05 s (3.9), 485 MiB     32.1 s (55.0), 4656 MiB
oomlens load+analyze         2.17 s (2.2), 491 MiB     22.4 s (61.4), 4662 MiB
  ratio to bare              0.71x, peak 1.01x         0.70x, peak 1.00x
oomlens analyze (CLI)        3.06 s, 517 MiB           26.1 s, 4688 MiB
_memory_viz stats            5.67 s, 694 MiB           37.6 s, 4865 MiB
===========================  ========================  ========================

Before issue 15 (the loader of 2026-11-30 on the same files): oomlens load+analyze 3.99 s
and 32.6 s of CPU (1.14x and 1.00x the bare load), the CLI 4.56 s and 34.1 s; ``oomlens
analyze`` of the 112 MiB file took 9.6 s wall against 5.7 s for a bare ``pickle.load``
process (both exiting normally), now 4.9 s.  The gain is the cyclic collector kept off the
loaded objects (see :func:`oomlens.ingest.snapshot.load_snapshot`).

The bare and oomlens processes exit with ``os._exit`` right after their work, so that none of
them pays for freeing millions of objects at interpreter shutdown; the CLI exits as it does.
On that 2-core machine, shared with other jobs, wall times vary by up to 2x between runs; CPU
times by about 10 %.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
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
# Generation from the corpus's shapes (issue 15)
# --------------------------------------------------------------------------------------------

CORPUS = ROOT / "fixtures" / "crash_logs"
_ADDRESS_STRIDE = 1 << 40  # 1 TiB between copies: no address of one copy falls in another
_MARKERS = ("oom", "snapshot")


def _corpus_sources() -> list[tuple[list[Any], list[Any], list[Any]]]:
    """(segments, trace, annotations) of every real snapshot with a history, device 0 or 1.

    Read from ``fixtures/crash_logs/*/snapshot_rank*.pickle`` (torch 2.11, stacks='python',
    recorded on H200s for the corpus) and the real samples in ``tests/assets/snapshots``, through
    oomlens' restricted loader.
    """
    sys.path.insert(0, str(ROOT))
    from oomlens.ingest.snapshot.unpickler import restricted_load

    files = sorted(CORPUS.glob("*/snapshot_rank*.pickle")) + sorted(ASSETS.glob("*.pickle"))
    sources = []
    for path in files:
        data = restricted_load(path).data
        assert isinstance(data, dict)
        for device, trace in enumerate(data["device_traces"]):
            if not any(entry["action"] not in _MARKERS for entry in trace):
                continue  # an enabled='state' snapshot, or the other rank's empty device
            segments = [s for s in data["segments"] if s["device"] == device]
            annotations = [a for a in data.get("external_annotations", []) if a["device"] == device]
            sources.append((segments, trace, annotations))
    return sources


def _native_stacks() -> list[list[Any]]:
    """The native part of each distinct stack of the real stacks='all' sample.

    torch writes a stacks='all' frame list as the native unwind (innermost first, down to
    ``_start``, with the innermost Python frame where the interpreter sits) followed by the
    Python frames; this keeps the native part, real frame dicts shared as torch shares them.
    """
    sample = _load_template("all")
    found: dict[tuple[int, ...], list[Any]] = {}
    for entry in sample["device_traces"][0]:
        frames = entry.get("frames") or []
        native = []
        for frame in frames:
            native.append(frame)
            if frame["name"] == "_start":
                break
        if len(native) < len(frames):
            found.setdefault(tuple(map(id, native)), native)
    return list(found.values())


class _Copier:
    """One copy of a real snapshot's device: new dicts and lists, the same sharing.

    Frame dicts are shared with the source (torch's symbolizer shares them across a whole
    recording); each frame list of the source gets one new list per copy, so a list the source
    shared (a block and its ``alloc`` entry, ``free_requested`` and ``free_completed``) stays
    shared.  With ``natives``, each source stack (Python frames) gets a real native unwind in
    front of it, chosen once per source list, as a stacks='all' recording would have it.
    Addresses move by ``address_shift`` and times by ``time_shift``.
    """

    def __init__(
        self,
        natives: list[list[Any]] | None,
        address_shift: int,
        time_shift: int,
        prefixes: dict[int, list[Any]],
    ) -> None:
        self.natives = natives
        self.address_shift = address_shift
        self.time_shift = time_shift
        self.prefixes = prefixes
        self.lists: dict[int, list[Any]] = {}

    def frames(self, frames: Any) -> Any:
        if type(frames) is not list:
            return frames
        copied = self.lists.get(id(frames))
        if copied is None:
            prefix: list[Any] = []
            if self.natives and frames:
                prefix = self.prefixes.get(id(frames)) or self.prefixes.setdefault(
                    id(frames), self.natives[len(self.prefixes) % len(self.natives)]
                )
            copied = self.lists[id(frames)] = prefix + frames
        return copied

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        copied = {}
        for key, value in record.items():
            if key in ("addr", "address") and type(value) is int and value:
                value += self.address_shift
            elif key == "time_us" and type(value) is int:
                value += self.time_shift
            elif key == "frames":
                value = self.frames(value)
            elif key == "device":
                value = 0
            elif key == "blocks":
                value = [self.record(block) for block in value]
            copied[key] = value
        return copied


def generate_corpus_snapshot(target_bytes: int, *, stacks: str = "all") -> dict[str, Any]:
    """A snapshot about ``target_bytes`` once pickled, made of copies of the corpus's real ones.

    Each real recording (segments, trace, annotations) is copied in turn, end to end in time
    and 1 TiB apart in address space, keeping its real segment/block layout, its action mix and
    its frame-list sharing; with ``stacks='all'`` every stack also gets a real native unwind from
    the stacks='all' sample (deep stacks, as torch's default records them).  Only the last copy
    keeps its ``oom`` entry.  The result has the corpus's shape: many small blocks, deep stacks,
    long traces (about 3 blocks per 10 trace entries).
    """
    sources = _corpus_sources()
    natives = _native_stacks() if stacks == "all" else None
    prefixes: dict[int, list[Any]] = {}
    settings = _load_template("all")["allocator_settings"]
    segments: list[Any] = []
    trace: list[Any] = []
    annotations: list[Any] = []
    sizes: dict[int, int] = {}
    total = 0
    clock = 0
    copy_index = 0
    oom_source = next(i for i, (_, t, _) in enumerate(sources) if t[-1]["action"] == "oom")
    while True:
        source = copy_index % len(sources)
        last = total + sizes.get(source, 0) >= target_bytes
        if last:
            source = oom_source
        src_segments, src_trace, src_annotations = sources[source]
        times = [e["time_us"] for e in src_trace if type(e.get("time_us")) is int]
        start = min(times) if times else 0
        copier = _Copier(natives, copy_index * _ADDRESS_STRIDE, clock - start + 1000, prefixes)
        new_trace = [
            copier.record(entry) for entry in src_trace if last or entry["action"] not in _MARKERS
        ]
        new_segments = [copier.record(segment) for segment in src_segments]
        new_annotations = [copier.record(record) for record in src_annotations]
        if source not in sizes:
            # Marginal pickled size of a copy: frame dicts are paid once, by the first copy.
            once = _pickled_size([new_segments, new_trace, new_annotations])
            twice_copier = _Copier(natives, 0, 0, prefixes)
            again = [
                [twice_copier.record(item) for item in part]
                for part in (src_segments, src_trace, src_annotations)
            ]
            both = _pickled_size([[new_segments, new_trace, new_annotations], again])
            sizes[source] = both - once
        segments += new_segments
        trace += new_trace
        annotations += new_annotations
        total += sizes[source]
        clock = max(times) - start + clock + 1000 if times else clock
        copy_index += 1
        if last:
            break
    segments.sort(key=lambda segment: segment["address"])
    return {
        "segments": segments,
        "device_traces": [trace, []],
        "allocator_settings": settings,
        "external_annotations": annotations,
    }


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
# As `oomlens analyze` calls them (oomlens/session.py): objects not frozen, then analyzed.
snapshot = load_snapshot(sys.argv[1], freeze_gc=False)
loaded = time.perf_counter()
analysis = analyze_snapshot(snapshot)
done = time.perf_counter()
print(f"INNER {done - start:.3f} LOAD {loaded - start:.3f} ANALYZE {done - loaded:.3f}", flush=True)
d = analysis.devices[0]
peak = d.timeline and d.timeline.peak_active.active_bytes
print(f"RESULT blocks={snapshot.block_count} entries={snapshot.trace_entry_count} "
      f"allocated={d.state.allocated_bytes} peak={peak} "
      f"leak={d.leak and d.leak.bytes_per_iteration}", flush=True)
os._exit(0)
"""

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
    "oomlens": ("oomlens load+analyze", _OOMLENS),
    "cli": ("oomlens analyze (CLI)", _CLI),
    "memviz": ("_memory_viz stats", _MEMVIZ),
}


def _measure(name: str, path: Path) -> dict[str, Any]:
    """Run one measurement in a fresh process: wall and CPU time, peak RSS (``wait4`` on that
    very process), and what it printed."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-c", _ROWS[name][1], str(path), str(ROOT)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert process.stdout is not None
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        errors = err.read().decode(errors="replace")[-2000:]
    inner = next((line.split()[1] for line in out.splitlines() if line.startswith("INNER")), None)
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "wall_s": wall,
        "inner_s": float(inner) if inner is not None else None,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss * scale / MiB,
        "returncode": process.returncode,
        "stdout": out,
        "stderr": errors,
    }


def _median_run(name: str, path: Path, repeat: int) -> dict[str, Any]:
    runs = [_measure(name, path) for _ in range(repeat)]
    runs.sort(key=lambda run: run["wall_s"])
    return runs[len(runs) // 2]


def _report(path: Path, description: str, results: dict[str, dict[str, Any]]) -> None:
    size_mb = path.stat().st_size / MiB
    print(f"\nsnapshot: {path.name} ({size_mb:.1f} MiB; {description})")
    print(
        f"{'':<24}{'wall s':>8}{'work s':>8}{'cpu s':>8}{'peak MiB':>10}"
        f"{'work/bare':>11}{'cpu/bare':>10}{'peak/bare':>11}"
    )
    bare = results["bare"]
    for name, result in results.items():
        work = result["inner_s"]
        work_text = "-" if work is None else f"{work:.2f}"
        ratio_text = "-" if work is None else f"{work / bare['inner_s']:.2f}"
        print(
            f"{_ROWS[name][0]:<24}{result['wall_s']:>8.2f}{work_text:>8}{result['cpu_s']:>8.2f}"
            f"{result['peak_rss_mb']:>10.0f}{ratio_text:>11}"
            f"{result['cpu_s'] / bare['cpu_s']:>10.2f}"
            f"{result['peak_rss_mb'] / bare['peak_rss_mb']:>11.2f}"
        )
        if result["returncode"] != 0:
            print(f"    exit {result['returncode']}: {result['stderr'][-500:]}")
    for line in results.get("oomlens", {}).get("stdout", "").splitlines():
        print(f"    oomlens: {line}")
    if "oomlens" in results:
        ours = results["oomlens"]
        print(
            f"  targets (issue 15): time <= 1.3x bare: {ours['inner_s'] / bare['inner_s']:.2f}x"
            f" (wall {ours['wall_s'] / bare['wall_s']:.2f}x); "
            f"peak RSS <= 1.2x bare: {ours['peak_rss_mb'] / bare['peak_rss_mb']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mb",
        type=float,
        nargs="+",
        default=[100.0, 1000.0],
        help="pickled sizes to generate and measure (default 100 1000)",
    )
    parser.add_argument(
        "--shape",
        choices=("corpus", "training"),
        default="corpus",
        help="corpus: copies of the corpus's real recordings (default); training: the "
        "synthetic training loop with a planted leak",
    )
    parser.add_argument("--stacks", choices=sorted(_TEMPLATE_FILES), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out", help="where the snapshots are written"
    )
    parser.add_argument(
        "--file", type=Path, help="measure this existing snapshot instead of generating one"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the median is shown")
    parser.add_argument("--skip-memviz", action="store_true", help="do not run torch's _memory_viz")
    parser.add_argument("--skip-cli", action="store_true", help="do not run `oomlens analyze`")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.generate_only:
        _generate_to(args.file, args, args.size_mb[0])
        return
    names = [
        name
        for name in _ROWS
        if not (name == "memviz" and args.skip_memviz) and not (name == "cli" and args.skip_cli)
    ]
    if args.file is not None:
        results = {name: _median_run(name, args.file, args.repeat) for name in names}
        _report(args.file, "given file", results)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for size_mb in args.size_mb:
        path = args.out / f"bench_snapshot_{int(size_mb)}mb_{args.shape}_{args.stacks}.pickle"
        generated = False
        description = f"{args.shape} shape, stacks={args.stacks}"
        if not path.exists():
            start = time.perf_counter()
            # Generate in a child so that this process stays small.
            command = [sys.executable, __file__, "--generate-only", "--file", str(path)]
            command += ["--size-mb", str(size_mb), "--shape", args.shape]
            command += ["--stacks", args.stacks, "--seed", str(args.seed)]
            made = subprocess.run(command, check=True, capture_output=True, text=True)
            description += "; " + made.stdout.strip().rsplit(": ", 1)[-1]
            print(f"generated {path.name} in {time.perf_counter() - start:.1f} s")
            generated = True
        results = {name: _median_run(name, path, args.repeat) for name in names}
        _report(path, description, results)
        if generated and not args.keep:
            path.unlink()


def _generate_to(path: Path, args: argparse.Namespace, size_mb: float) -> None:
    if args.shape == "corpus":
        data = generate_corpus_snapshot(int(size_mb * MiB), stacks=args.stacks)
    else:
        data = generate_snapshot(int(size_mb * MiB), stacks=args.stacks, seed=args.seed)
    with open(path, "wb") as handle:
        pickle.dump(data, handle, protocol=4)
    blocks = sum(len(segment["blocks"]) for segment in data["segments"])
    entries = sum(len(trace) for trace in data["device_traces"])
    segments = len(data["segments"])
    print(f"{path}: {segments} segments, {blocks} blocks, {entries} trace entries", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
