"""What ``oomlens capture`` costs a training run, measured on a GPU (a benchmark, not a test).

One process (or one DeepSpeed job) trains a real model and, in interleaved blocks of steps
(the order rotates every round, so drift and warm-up hit every variant alike), switches between:

* ``off``: the capture installed but paused (history off; its hooks return at once): the
  baseline;
* ``capture``: the capture's defaults (allocator history without stacks, a bounded ring,
  counters after every step, host counters every second, the writer thread, the sentinel);
* ``capture_stacks``: the capture after it turned Python stacks on (what a rank pays once it
  is close to its limit);
* ``torch_defaults``: ``torch.cuda.memory._record_memory_history()`` at its defaults as
  most guides show it (context and stacks ``"all"``, 100,000 entries), capture paused.

Then, with the capture's defaults, it provokes two real out-of-memory errors (one with the
default history, one after stacks were turned on) and reads back what the observer recorded:
the time to take and write the snapshot and its size, and the disk the rank's capture files use.

Usage (on a GPU machine; ``run_capture.py`` runs both)::

    python bench/capture_overhead.py --mode torch --out DIR
    deepspeed --num_gpus 2 bench/capture_overhead.py --mode zero3 --out DIR   # or 1 GPU, 1 rank

``--mode torch``: a 350M-parameter GPT (``fixtures/crash_logs/_scenarios/model.py``), bf16,
AdamW, micro batch 8 x 1024 tokens, one GPU.  ``--mode zero3``: the 1.3B GPT under DeepSpeed
ZeRO-3 (bf16, torch's AdamW), micro batch 8 x 1024 tokens per rank (``run_capture.py`` passes
``--micro-batch 4``), on as many ranks as the launcher starts (``world_size`` in the JSON).  Writes
``DIR/overhead_<mode>.json`` (rank 0) and prints a table.  The figures quoted in the README
come from this script's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures" / "crash_logs" / "_scenarios"))

VARIANTS = ("off", "capture", "capture_stacks", "torch_defaults")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("torch", "zero3"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after a switch")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="stop adding rounds")
    parser.add_argument("--model", default=None)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--local_rank", type=int, default=-1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import oomlens.capture

    recorder = oomlens.capture.install(
        directory=str(out / "bench-capture"), run=f"bench-{args.mode}", snapshot_every_s=0.0
    )
    if recorder is None:
        raise SystemExit("capture did not start")

    import torch
    from model import GPT, GPTConfig, random_batch

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    name = args.model or ("350m" if args.mode == "torch" else "1.3b")
    cfg = GPTConfig.named(name)
    cfg.seq_len = args.seq_len
    device = torch.device("cuda", local_rank)

    if args.mode == "torch":
        model = GPT(cfg).to(device=device, dtype=torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            inputs, targets = random_batch(cfg, args.micro_batch, device)
            _, loss = model(inputs, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    else:
        import deepspeed

        deepspeed.init_distributed()
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": {"stage": 3},
        }
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = GPT(cfg)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config
        )

        def step() -> None:
            inputs, targets = random_batch(cfg, args.micro_batch, engine.device)
            _, loss = engine(inputs, targets)
            engine.backward(loss)
            engine.step()

    def configure(variant: str) -> None:
        recorder.pause()
        torch.cuda.memory._record_memory_history(enabled=None)
        if variant == "capture":
            recorder.resume(stacks=False)
        elif variant == "capture_stacks":
            recorder.resume(stacks=True)
        elif variant == "torch_defaults":
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def allocations() -> int:
        return int(torch.cuda.memory_stats(device).get("allocation.all.allocated", 0))

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    allocs_per_step: list[float] = []
    started = time.monotonic()
    for round_index in range(args.rounds):
        if round_index >= 2 and time.monotonic() - started > args.max_seconds:
            break
        order = VARIANTS[round_index % len(VARIANTS) :] + VARIANTS[: round_index % len(VARIANTS)]
        for variant in order:
            configure(variant)
            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize()
            before = allocations()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            times[variant].append((time.perf_counter() - t0) / args.steps)
            allocs_per_step.append((allocations() - before) / args.steps)

    result: dict[str, object] = {
        "mode": args.mode,
        "model": name,
        "params": sum(
            int(p.ds_numel if hasattr(p, "ds_numel") else p.numel()) for p in model.parameters()
        ),
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "rounds": len(times["off"]),
        "steps_per_block": args.steps,
        "allocations_per_step": round(statistics.median(allocs_per_step)),
        "step_seconds": {v: [round(t, 6) for t in ts] for v, ts in times.items()},
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "capture_settings": {
            "max_entries": recorder.settings.max_entries,
            "stacks_at": recorder.settings.stacks_at,
            "max_mb": recorder.settings.max_mb,
        },
    }
    overhead = {}
    for variant in VARIANTS[1:]:
        ratios = [t / base for t, base in zip(times[variant], times["off"], strict=False)]
        overhead[variant] = {
            "median": round(statistics.median(ratios) - 1, 4),
            "min": round(min(ratios) - 1, 4),
            "max": round(max(ratios) - 1, 4),
            "median_step_s": round(statistics.median(times[variant]), 6),
        }
    result["overhead"] = overhead
    result["off_median_step_s"] = round(statistics.median(times["off"]), 6)
    result["oom"] = measure_oom(torch, recorder, step, device)
    result["disk_bytes_per_rank"] = sum(
        p.stat().st_size for p in Path(recorder.directory).glob(f"{recorder.prefix}.*")
    )
    if rank == 0:
        (out / f"overhead_{args.mode}.json").write_text(json.dumps(result, indent=2) + "\n")
        print_table(result)


def measure_oom(torch, recorder, step, device) -> list[dict[str, object]]:  # noqa: ANN001
    """Two real OOMs through the capture's observer: default history, then with stacks."""
    found = []
    for stacks in (False, True):
        recorder.resume(stacks=stacks)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info(device)
        try:
            torch.empty(free + 2**30, dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            pass
        recorder.flush()
        events = [
            json.loads(line)
            for line in Path(recorder.events.path).read_text().splitlines()
            if '"kind":"oom"' in line
        ]
        if events:
            last = events[-1]
            found.append(
                {
                    "stacks": stacks,
                    "observer_seconds": last.get("observer_seconds"),
                    "dump_seconds": last.get("dump_seconds"),
                    "snapshot_seconds": last.get("snapshot_seconds"),
                    "snapshot_bytes": last.get("snapshot_bytes"),
                    "trace_kept": last.get("snapshot_trace_kept"),
                }
            )
    return found


def print_table(result: dict[str, object]) -> None:
    print(
        f"\n{result['mode']}: {result['model']} ({result['params']:,} params), "
        f"{result['world_size']} GPU(s), {result['rounds']} rounds x {result['steps_per_block']} "
        f"steps, {result['allocations_per_step']:,} allocations per step"
    )
    print(f"  {'variant':<16} {'median step':>12} {'overhead (median, min..max)':>30}")
    print(f"  {'off':<16} {result['off_median_step_s'] * 1000:>10.1f}ms")
    for variant, o in result["overhead"].items():  # type: ignore[union-attr]
        print(
            f"  {variant:<16} {o['median_step_s'] * 1000:>10.1f}ms "
            f"{o['median']:>+14.1%} ({o['min']:+.1%}..{o['max']:+.1%})"
        )
    for oom in result["oom"]:  # type: ignore[union-attr]
        print(
            f"  snapshot at OOM (stacks {'on' if oom['stacks'] else 'off'}): "
            f"{oom['dump_seconds']} s, {oom['snapshot_bytes'] or 0:,} bytes"
        )
    print(f"  disk per rank: {result['disk_bytes_per_rank']:,} bytes")


if __name__ == "__main__":
    main()
