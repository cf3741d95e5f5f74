"""The part of the capture's overhead benchmark that needs no GPU (``capture_overhead.py`` runs
it on one; ``tests/bench`` runs it on a CPU with stand-in loops).

* the schedule: one warm-up round (every variant once: its blocks are not timed into the result,
  they calibrate the block length and are where each variant's recording is verified), then
  rounds of interleaved blocks whose order rotates, until a time budget is spent;
* the measurement of one block: configure the variant, a few untimed steps, synchronise, time
  ``steps`` steps with no synchronisation inside them, synchronise;
* the statistics: per variant the median step time and its interquartile range, and the
  overhead as the median (and IQR) of each block's time over the ``off`` block of the same round;
* the claims: what the allocator's trace must hold after a block of each variant (no entries;
  entries without stacks; Python stacks at allocation; C++ and Python stacks at allocation and
  at free), checked on the snapshot that variant would dump;
* validity: a result whose variants did not record what they claim, with too few rounds, or
  from a loop that is not the kind it claims to be, raises ``BenchError`` instead of a table.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

VARIANTS: tuple[str, ...] = ("off", "capture", "capture_stacks", "torch_defaults")

TORCH_DEFAULTS_ENTRIES = 100_000
"""The ring the guides pair with ``_record_memory_history()``'s defaults (torch's own default
is unbounded)."""

CLAIMS: dict[str, str] = {
    "off": "capture installed but paused: no allocator history",
    "capture": "the capture's defaults: every alloc/free in a bounded ring, no stacks "
    "(context=None), per-step counters, host counters every second",
    "capture_stacks": "the capture after it turned stacks on: Python stacks at allocation "
    "(context='alloc', stacks='python')",
    "torch_defaults": "_record_memory_history(max_entries=100000): C++ and Python stacks at "
    "allocation and at free (context='all', stacks='all')",
}

MIN_FRAMES_SHARE = 0.3
"""At least this share of the recorded allocations carry a stack when stacks are claimed: the
backward pass allocates from autograd's C++ threads, which hold no Python frame (measured on an
H200: 48% of the 350M loop's allocations, 56% of the small loop's, 47% up to an OOM carry one)."""
MIN_MATCHED_FREES = 20
"""Frees matched to their allocation needed before the context claim is judged."""


class BenchError(RuntimeError):
    """The benchmark cannot give a meaningful result; the message says why."""


# ------------------------------------------------------------------------------ trace claims


def _is_cpp(frame: Mapping[str, Any]) -> bool:
    """A C++ frame: line 0 and not a Python file (Python frames always carry their line)."""
    return int(frame.get("line") or 0) == 0 and not str(frame.get("filename", "")).endswith(".py")


def trace_profile(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """What the allocator's trace in ``snapshot`` (``torch.cuda.memory._snapshot()``) holds:
    entry counts (``snapshot`` markers left out), the share of allocations with a stack and
    with C++ frames in it, and of the frees matched to an allocation, the share whose stack is
    their own (``context='all'``) rather than the allocation's copied over."""
    traces = snapshot.get("device_traces") or []
    entries = 0
    longest = 0
    allocs = with_frames = with_cpp = 0
    matched = own = 0
    any_frames = 0
    for trace in traces:
        longest = max(longest, len(trace))
        alloc_frames: dict[int, Any] = {}
        for entry in trace:
            action = entry.get("action")
            if action == "snapshot":
                continue
            entries += 1
            frames = entry.get("frames") or []
            if frames:
                any_frames += 1
            if action == "alloc":
                allocs += 1
                alloc_frames[entry.get("addr", -1)] = frames
                if frames:
                    with_frames += 1
                    if any(_is_cpp(f) for f in frames):
                        with_cpp += 1
            elif action == "free_requested" and entry.get("addr", -1) in alloc_frames:
                matched += 1
                if frames and frames != alloc_frames.pop(entry.get("addr", -1)):
                    own += 1
    return {
        "entries": entries,
        "longest_device_trace": longest,
        "entries_with_frames": any_frames,
        "allocs": allocs,
        "alloc_frames_share": round(with_frames / allocs, 4) if allocs else 0.0,
        "alloc_cpp_share": round(with_cpp / allocs, 4) if allocs else 0.0,
        "frees_matched": matched,
        "free_own_stack_share": round(own / matched, 4) if matched else 0.0,
    }


def claim_problems(variant: str, profile: Mapping[str, Any], max_entries: int) -> list[str]:
    """Why ``profile`` (``trace_profile``) contradicts ``variant``'s claim; empty when it
    holds.  ``max_entries``: the ring the variant claims."""
    p = profile
    out: list[str] = []

    def need(ok: bool, text: str) -> None:
        if not ok:
            out.append(f"{variant}: {text}")

    if variant == "off":
        need(p["entries"] == 0, f"claims no history, the trace holds {p['entries']} entries")
        return out
    need(p["allocs"] > 0, "claims a history, the trace holds no allocation")
    need(
        p["longest_device_trace"] <= max_entries + len(VARIANTS),
        f"claims a ring of {max_entries}, a device trace holds {p['longest_device_trace']}",
    )
    if variant == "capture":
        need(
            p["entries_with_frames"] == 0,
            f"claims no stacks, {p['entries_with_frames']} entries carry frames",
        )
    elif variant == "capture_stacks":
        need(
            p["alloc_frames_share"] >= MIN_FRAMES_SHARE,
            f"claims Python stacks, only {p['alloc_frames_share']:.0%} of allocations carry one",
        )
        need(
            p["alloc_cpp_share"] == 0,
            f"claims Python-only stacks, {p['alloc_cpp_share']:.0%} of allocations have C++ frames",
        )
        if p["frees_matched"] >= MIN_MATCHED_FREES:
            need(
                p["free_own_stack_share"] <= 0.05,
                "claims stacks at allocation only (context='alloc'), "
                f"{p['free_own_stack_share']:.0%} of frees carry a stack of their own",
            )
    elif variant == "torch_defaults":
        need(
            p["alloc_cpp_share"] >= MIN_FRAMES_SHARE,
            f"claims C++ stacks (stacks='all'), only {p['alloc_cpp_share']:.0%} of allocations "
            "carry C++ frames",
        )
        need(
            p["frees_matched"] >= MIN_MATCHED_FREES,
            f"claims stacks at free, only {p['frees_matched']} frees matched an allocation",
        )
        need(
            p["free_own_stack_share"] >= MIN_FRAMES_SHARE,
            "claims stacks at free (context='all'), only "
            f"{p['free_own_stack_share']:.0%} of frees carry their own",
        )
    else:
        out.append(f"unknown variant {variant!r}")
    return out


# ------------------------------------------------------------------------------ measurement


class Loop(Protocol):
    """A training loop the benchmark drives (on the GPU: ``capture_overhead.py``)."""

    name: str

    def configure(self, variant: str) -> None:
        """Switch recording to ``variant`` (outside any timed region)."""

    def step(self) -> None:
        """One training step; must not synchronise."""

    def sync(self) -> None:
        """Wait for the device (block boundaries only)."""

    def allocations(self) -> int:
        """Allocations made so far (a counter that only grows)."""

    def inspect(self, variant: str) -> dict[str, Any]:
        """``trace_profile`` of what is recorded now (after a block of ``variant``)."""

    def block_problem(self, variant: str) -> str | None:
        """A cheap check after every timed block: why that block did not run as ``variant``
        (for example the capture turned stacks on by itself), else None."""


@dataclass
class Block:
    variant: str
    round: int
    steps: int
    seconds_per_step: float
    allocations_per_step: float
    problem: str | None = None


@dataclass
class Measurement:
    loop: str
    steps_per_block: int
    warmup_steps: int
    warmup_seconds_per_step: dict[str, float]
    blocks: list[Block] = field(default_factory=list)
    verified: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def rounds(self) -> int:
        return len({b.round for b in self.blocks})


def rotation(round_index: int, variants: Sequence[str] = VARIANTS) -> tuple[str, ...]:
    """The order of round ``round_index``: rotated by one each round, so every variant runs
    first, second... equally often and drift hits them alike."""
    k = round_index % len(variants)
    return tuple(variants[k:]) + tuple(variants[:k])


def _block(
    loop: Loop,
    variant: str,
    steps: int,
    warmup_steps: int,
    clock: Callable[[], float],
) -> tuple[float, float]:
    """(seconds per step, allocations per step) of one block; synchronised only at its
    boundaries."""
    loop.configure(variant)
    for _ in range(warmup_steps):
        loop.step()
    loop.sync()
    gc.collect()
    before = loop.allocations()
    started = clock()
    for _ in range(steps):
        loop.step()
    loop.sync()
    elapsed = clock() - started
    return elapsed / steps, (loop.allocations() - before) / steps


def measure(
    loop: Loop,
    *,
    budget_s: float,
    block_s: float,
    min_rounds: int = 6,
    max_rounds: int = 40,
    warmup_steps: int = 2,
    prime_steps: int = 3,
    first_block_steps: int = 5,
    min_steps: int = 3,
    max_steps: int = 2000,
    max_entries: Mapping[str, int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    variants: Sequence[str] = VARIANTS,
) -> Measurement:
    """Interleaved blocks of ``loop`` under each variant.

    First ``prime_steps`` steps with recording off (the first steps of a process pay for
    its libraries' initialisation).  Round 0 is the warm-up: each variant once with
    ``first_block_steps`` steps, then its recording verified (``loop.inspect`` +
    ``claim_problems``); its times only set the block length (``block_s`` seconds of the
    slowest variant's step, within ``min_steps..max_steps``) and are kept apart.  Then timed
    rounds until ``budget_s`` (the timed rounds' time) would be exceeded by another round, at
    least ``min_rounds`` (unless that takes over three times the budget) and at most
    ``max_rounds``.  ``max_entries``: the ring each variant claims (for ``claim_problems``).
    """
    started = clock()
    entries = dict(max_entries or {})
    loop.configure("off")
    for _ in range(prime_steps):
        loop.step()
    loop.sync()
    warm: dict[str, float] = {}
    verified: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for variant in rotation(0, variants):
        per_step, _ = _block(loop, variant, first_block_steps, warmup_steps, clock)
        warm[variant] = per_step
        profile = loop.inspect(variant)
        verified[variant] = profile
        problems += claim_problems(variant, profile, entries.get(variant, TORCH_DEFAULTS_ENTRIES))
    slowest = max(warm.values())
    steps = max(min_steps, min(max_steps, math.ceil(block_s / max(slowest, 1e-9))))
    result = Measurement(
        loop=loop.name,
        steps_per_block=steps,
        warmup_steps=warmup_steps,
        warmup_seconds_per_step={k: round(v, 6) for k, v in warm.items()},
        verified=verified,
        problems=problems,
    )
    timed_start = clock()
    round_index = 1
    while round_index <= max_rounds:
        spent = clock() - timed_start
        done = round_index - 1
        if done >= min_rounds and spent + spent / done > budget_s:
            break
        if spent > 3 * budget_s:
            break  # min_rounds cannot be reached in any reasonable time: reported below
        for variant in rotation(round_index, variants):
            per_step, allocs = _block(loop, variant, steps, warmup_steps, clock)
            result.blocks.append(
                Block(
                    variant=variant,
                    round=round_index,
                    steps=steps,
                    seconds_per_step=per_step,
                    allocations_per_step=allocs,
                    problem=loop.block_problem(variant),
                )
            )
        round_index += 1
    result.seconds = round(clock() - started, 3)
    if result.rounds() < min_rounds:
        result.problems.append(
            f"{loop.name}: only {result.rounds()} timed rounds in {budget_s:.0f} s "
            f"(at least {min_rounds} needed)"
        )
    return result


# ------------------------------------------------------------------------------ statistics


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), inclusive method; a single value is all
    three."""
    if not values:
        raise BenchError("no values to summarise")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(
    m: Measurement, *, min_allocations: float = 0.0, max_block_problems: float = 0.25
) -> dict[str, Any]:
    """Per variant: the median step time and its IQR, and the overhead over ``off`` as the
    median and IQR of each block's ratio to the ``off`` block of its round, and the extra time
    per allocation.  Blocks with a ``problem`` are left out (more than ``max_block_problems``
    of a variant's blocks make the result invalid).  ``min_allocations``: allocations per step
    the loop must make to be the kind it claims (an allocation-heavy loop)."""
    problems = list(m.problems)
    good = [b for b in m.blocks if b.problem is None]
    for variant in VARIANTS:
        total = [b for b in m.blocks if b.variant == variant]
        bad = [b for b in total if b.problem is not None]
        if total and len(bad) > max_block_problems * len(total):
            problems.append(
                f"{m.loop}: {len(bad)} of {len(total)} {variant} blocks did not run as "
                f"{variant}: {bad[0].problem}"
            )
    off_by_round = {b.round: b.seconds_per_step for b in good if b.variant == "off"}
    allocs = [b.allocations_per_step for b in good]
    alloc_median = statistics.median(allocs) if allocs else 0.0
    if alloc_median < min_allocations:
        problems.append(
            f"{m.loop}: {alloc_median:.0f} allocations per step, fewer than the "
            f"{min_allocations:.0f} this loop is meant to make"
        )
    variants: dict[str, Any] = {}
    off_median: float | None = None
    for variant in VARIANTS:
        times = [b.seconds_per_step for b in good if b.variant == variant]
        if not times:
            problems.append(f"{m.loop}: no usable {variant} block")
            continue
        q1, q2, q3 = quartiles(times)
        entry: dict[str, Any] = {
            "blocks": len(times),
            "step_s": {"median": round(q2, 6), "q1": round(q1, 6), "q3": round(q3, 6)},
        }
        if variant == "off":
            off_median = q2
            entry["spread"] = round((q3 - q1) / q2, 4) if q2 else None
        else:
            ratios = [
                b.seconds_per_step / off_by_round[b.round] - 1
                for b in good
                if b.variant == variant and b.round in off_by_round
            ]
            if ratios:
                r1, r2, r3 = quartiles(ratios)
                entry["overhead"] = {
                    "median": round(r2, 4),
                    "q1": round(r1, 4),
                    "q3": round(r3, 4),
                    "pairs": len(ratios),
                }
            if off_median is not None and alloc_median:
                entry["us_per_allocation"] = round((q2 - off_median) / alloc_median * 1e6, 3)
        variants[variant] = entry
    return {
        "loop": m.loop,
        "rounds": m.rounds(),
        "steps_per_block": m.steps_per_block,
        "warmup_steps_per_block": m.warmup_steps,
        "allocations_per_step": round(alloc_median),
        "variants": variants,
        "verified": m.verified,
        "warmup_seconds_per_step": m.warmup_seconds_per_step,
        "blocks": [asdict(b) for b in m.blocks],
        "seconds": m.seconds,
        "problems": problems,
    }


# ------------------------------------------------------------------------------ OOM records


def oom_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The ``oom`` records of a capture events file (``rank<R>.events.jsonl``), in order; a
    line cut short by a kill is skipped."""
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "oom":
            found.append(record)
    return found


def oom_problems(label: str, record: Mapping[str, Any] | None, stacks: bool) -> list[str]:
    """Why the capture's record of a provoked OOM does not show what was measured."""
    if record is None:
        return [f"{label}: the OOM was raised but the capture recorded no out-of-memory"]
    out = []
    if not record.get("snapshot"):
        why = record.get("snapshot_error") or "no snapshot written"
        out.append(f"{label}: {why}")
    if bool(record.get("stacks")) != stacks:
        out.append(
            f"{label}: measured with stacks {'on' if stacks else 'off'}, the capture had "
            f"them {'on' if record.get('stacks') else 'off'}"
        )
    if record.get("observer_seconds") is None:
        out.append(f"{label}: the record has no observer_seconds")
    return out


# ------------------------------------------------------------------------------ table


def _pct(value: float) -> str:
    return f"{value:+.1%}"


def table(loop: Mapping[str, Any]) -> list[str]:
    """A summary (``summarize``) as text lines.  Raises ``BenchError`` when it has problems:
    there is no table for a result that means nothing."""
    if loop["problems"]:
        raise BenchError("; ".join(loop["problems"]))
    lines = [
        f"{loop['loop']}: {loop['allocations_per_step']:,} allocations per step, "
        f"{loop['rounds']} timed rounds x {loop['steps_per_block']} steps per block "
        "(warm-up round excluded)",
        f"  {'variant':<16}{'median step':>12}{'IQR':>22}{'overhead (IQR)':>30}{'per alloc':>12}",
    ]
    for variant, v in loop["variants"].items():
        s = v["step_s"]
        row = (
            f"  {variant:<16}{s['median'] * 1e3:>10.2f}ms"
            f"{s['q1'] * 1e3:>11.2f}..{s['q3'] * 1e3:.2f}ms"
        )
        if "overhead" in v:
            o = v["overhead"]
            row += f"{_pct(o['median']):>14} ({_pct(o['q1'])}..{_pct(o['q3'])})"
            if "us_per_allocation" in v:
                row += f"{v['us_per_allocation']:>9.2f} us"
        lines.append(row)
    return lines
