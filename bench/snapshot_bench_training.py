"""The training-loop shape of ``bench/snapshot_bench.py``: a synthetic loop with known ground truth.

:func:`generate_snapshot` builds a torch 2.11-shaped snapshot from the real samples' stacks
(``tests/assets/snapshots``, the same files as the shared samples): a training loop with a planted
leak, a ring buffer that wrapped, an OOM at the end.  The tests use it at a small size
(``tests/analysis/test_allocator.py``); the benchmark with ``--shape training``.
"""

from __future__ import annotations

import pickle
import random
import sys
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
