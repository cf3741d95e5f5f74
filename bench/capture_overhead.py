"""What ``oomlens capture`` costs a training run, measured on a GPU (a benchmark, not a test).

In one process, interleaved blocks of training steps switch between four variants (the order
rotates every round; a warm-up round is run first and left out; a block synchronises the GPU
only at its two ends, never inside the steps it times):

* ``off``: the capture installed but paused (history off; its hooks return at once): the
  baseline;
* ``capture``: the capture's defaults (allocator history without stacks in a ring of 50,000
  entries, counters after every step, host counters every second, the writer thread, the
  sentinel);
* ``capture_stacks``: the capture after it turned Python stacks on (what a rank pays once it
  comes close to its limit);
* ``torch_defaults``: ``torch.cuda.memory._record_memory_history(max_entries=100000)``, torch's
  defaults (context and stacks ``'all'``) with the ring most guides give it, capture paused.

Each variant's recording is verified in the warm-up round on the snapshot it would dump (no
trace; a trace without stacks; Python stacks at allocation only; C++ stacks at allocation and
free), and after every timed block the capture's own state is checked (it may turn stacks on by
itself).  A result that fails a check is not printed as a table: the script says why and exits 3
(its JSON keeps the raw blocks and ``"valid": false``).

``--mode torch`` (plain PyTorch, one GPU) measures two loops and the OOM:

* ``small``: allocation-heavy and CPU-bound: a GPT of 32 layers of width 128 (8.4M parameters),
  micro batch 4 x 128 tokens, some 2,000 allocations per step of a few milliseconds each, so
  the CPU cost of recording is not hidden behind the GPU's kernels;
* ``model``: the 350M-parameter GPT (``fixtures/crash_logs/_scenarios/model.py``), bf16, AdamW,
  micro batch 8 x 1024 tokens: GPU-bound, what a real loop pays;
* ``oom``: a real out-of-memory (the card filled with 2 GiB tensors until the allocator gives
  up), after the ring was filled by training steps, under the capture without and with stacks
  (its observer's time from the allocator's failure to the snapshot renamed into place, read
  from its record, and the snapshot read back) and under torch's defaults (the usual ``except
  OutOfMemoryError: _dump_snapshot()``: from the failure, seen by an observer of the benchmark,
  to the pickle written); and the disk the rank's capture files use.

``--mode zero3``: the 350M GPT under DeepSpeed ZeRO-3 (bf16, torch's AdamW), micro batch 8 x
1024 tokens, one rank per GPU the launcher gives it (``world_size`` in the JSON).

Usage (on a GPU machine; ``bench/run_capture_bench.py`` runs both within four minutes)::

    python bench/capture_overhead.py --mode torch --out DIR
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 \\
        python bench/capture_overhead.py --mode zero3 --out DIR

Writes ``DIR/overhead_<mode>.json`` (rank 0; also after each loop, so a killed run leaves what
it measured) and prints a table per loop.  The figures of docs/capture.md come from this JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures" / "crash_logs" / "_scenarios"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture_bench_core import (  # noqa: E402
    CLAIMS,
    TORCH_DEFAULTS_ENTRIES,
    BenchError,
    claim_problems,
    measure,
    oom_events,
    oom_problems,
    summarize,
    table,
    trace_profile,
)

GIB = 2**30
OOM_CHUNK = 2 * GIB
SMALL_MIN_ALLOCATIONS = 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("torch", "zero3"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--small-seconds",
        type=float,
        default=25.0,
        help="timed rounds of the small loop stop after about this long",
    )
    parser.add_argument(
        "--model-seconds",
        type=float,
        default=30.0,
        help="the same for the model loop (and the ZeRO-3 loop)",
    )
    parser.add_argument("--small-block-s", type=float, default=0.5)
    parser.add_argument("--model-block-s", type=float, default=0.8)
    parser.add_argument("--min-rounds", type=int, default=6)
    parser.add_argument("--max-rounds", type=int, default=40)
    parser.add_argument("--model", default="350m")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--small-layers", type=int, default=32)
    parser.add_argument("--small-width", type=int, default=128)
    parser.add_argument("--small-batch", type=int, default=4)
    parser.add_argument("--small-seq", type=int, default=128)
    parser.add_argument("--no-oom", action="store_true", help="skip the OOM measurement")
    parser.add_argument("--local_rank", type=int, default=-1)
    return parser.parse_args(argv)


class TorchLoop:
    """One training loop under the four variants (``capture_bench_core.Loop``)."""

    def __init__(self, name: str, torch: Any, recorder: Any, device: Any, step: Any) -> None:
        self.name = name
        self.torch = torch
        self.recorder = recorder
        self.device = device
        self._step = step
        self.variant = "off"
        self.snapshot_seconds: dict[str, float] = {}

    def configure(self, variant: str) -> None:
        torch = self.torch
        self.recorder.pause()
        torch.cuda.memory._record_memory_history(enabled=None)  # also clears the trace
        if variant == "capture":
            self.recorder.resume(stacks=False)
        elif variant == "capture_stacks":
            self.recorder.resume(stacks=True)
        elif variant == "torch_defaults":
            torch.cuda.memory._record_memory_history(max_entries=TORCH_DEFAULTS_ENTRIES)
        elif variant != "off":
            raise BenchError(f"unknown variant {variant!r}")
        self.variant = variant

    def step(self) -> None:
        self._step()

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def allocations(self) -> int:
        return int(self.torch.cuda.memory_stats(self.device).get("allocation.all.allocated", 0))

    def inspect(self, variant: str) -> dict[str, Any]:
        started = time.perf_counter()
        snapshot = self.torch.cuda.memory._snapshot()
        self.snapshot_seconds[variant] = round(time.perf_counter() - started, 3)
        profile = trace_profile(snapshot)
        profile["snapshot_seconds"] = self.snapshot_seconds[variant]
        gpu = self.recorder.gpu
        profile["capture_state"] = {"history": bool(gpu.history), "stacks": bool(gpu.stacks)}
        return profile

    def block_problem(self, variant: str) -> str | None:
        gpu = self.recorder.gpu
        if gpu is None or not gpu.cuda_ready:
            return "the capture never saw CUDA start"
        if variant == "off" or variant == "torch_defaults":
            return "the capture was recording" if gpu.history else None
        if not gpu.history:
            return "the capture's history was off"
        if gpu.stacks != (variant == "capture_stacks"):
            return f"the capture had stacks {'on' if gpu.stacks else 'off'}"
        return None


def gpt_loop(torch: Any, name: str, recorder: Any, device: Any, cfg: Any, batch: int) -> TorchLoop:
    from model import GPT, random_batch

    model = GPT(cfg).to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        inputs, targets = random_batch(cfg, batch, device)
        _, loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    loop = TorchLoop(name, torch, recorder, device, step)
    loop.params = sum(int(p.numel()) for p in model.parameters())  # type: ignore[attr-defined]
    return loop


def zero3_loop(torch: Any, recorder: Any, args: argparse.Namespace, cfg: Any) -> TorchLoop:
    import deepspeed
    from model import GPT, random_batch

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

    loop = TorchLoop("zero3", torch, recorder, engine.device, step)
    loop.params = sum(  # type: ignore[attr-defined]
        int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters()
    )
    return loop


# ------------------------------------------------------------------------------------ OOM


def measure_ooms(
    torch: Any, recorder: Any, loop: TorchLoop, allocs_per_step: int, dump_dir: Path
) -> tuple[list[dict[str, Any]], list[str]]:
    """A real OOM under the capture (without, then with stacks) and under torch's defaults."""
    try:  # oomlens' own restricted loader (its analysis dependencies may be missing here)
        from oomlens.ingest.snapshot.unpickler import restricted_load
    except ImportError as exc:
        restricted_load = None
        unreadable = f"not read back: {exc}"

    failures: list[float] = []

    def seen(device: int, alloc: int, limit: int, free: int) -> None:
        failures.append(time.perf_counter())

    # Called after the capture's own observer (attached when CUDA started): under torch's
    # defaults the capture is paused and returns at once, so this marks the failure.
    torch._C._cuda_attach_out_of_memory_observer(seen)
    gpu = recorder.gpu
    rings = {
        "capture": recorder.settings.max_entries,
        "capture_stacks": recorder.settings.max_entries,
        "torch_defaults": TORCH_DEFAULTS_ENTRIES,
    }
    total = int(torch.cuda.get_device_properties(loop.device).total_memory)
    max_chunks = total // OOM_CHUNK + 8
    found: list[dict[str, Any]] = []
    problems: list[str] = []
    for variant, ring in rings.items():
        loop.configure(variant)
        fill = max(3, min(200, math.ceil(1.1 * ring / (2 * max(allocs_per_step, 1)))))
        for _ in range(fill):
            loop.step()
        loop.sync()
        # The capture turns stacks on by itself once memory fills (its design); held off here
        # so that "capture" measures the dump without stacks.
        original = gpu.check_pressure
        gpu.check_pressure = lambda counters: None
        before = len(oom_events(Path(recorder.events.path).read_text().splitlines()))
        failures.clear()
        hold: list[Any] = []
        row: dict[str, Any] = {"variant": variant, "ring": ring, "fill_steps": fill}
        caught = False
        call = time.perf_counter()
        try:
            for _ in range(max_chunks):
                call = time.perf_counter()
                hold.append(torch.empty(OOM_CHUNK, dtype=torch.uint8, device=loop.device))
        except torch.OutOfMemoryError:
            caught = True
            row["call_seconds"] = round(time.perf_counter() - call, 3)
            row["filled_bytes"] = len(hold) * OOM_CHUNK
            if variant == "torch_defaults":
                path = dump_dir / "torch_defaults_oom.pickle"
                started = time.perf_counter()
                snapshot = torch.cuda.memory._snapshot()
                taken = time.perf_counter()
                with open(path, "wb") as handle:  # what _dump_snapshot does
                    pickle.dump(snapshot, handle)
                written = time.perf_counter()
                row.update(
                    snapshot_seconds=round(taken - started, 3),
                    dump_seconds=round(written - started, 3),
                    failure_to_disk_seconds=round(written - failures[0], 3) if failures else None,
                    snapshot_bytes=path.stat().st_size,
                    trace=trace_profile(snapshot),
                )
                del snapshot
                path.unlink()
                problems += [f"oom {p}" for p in claim_problems(variant, row["trace"], ring)]
                if not failures:
                    problems.append("oom torch_defaults: the benchmark's observer was not called")
        finally:
            hold.clear()
            gpu.check_pressure = original
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(loop.device)
        if not caught:
            problems.append(f"oom {variant}: {max_chunks} chunks of 2 GiB did not run out")
            continue
        if variant != "torch_defaults":
            recorder.flush()
            records = oom_events(Path(recorder.events.path).read_text().splitlines())[before:]
            record = records[-1] if records else None
            problems += oom_problems(f"oom {variant}", record, variant == "capture_stacks")
            if record is not None:
                row.update(
                    failure_to_disk_seconds=record.get("observer_seconds"),
                    snapshot_seconds=record.get("snapshot_seconds"),
                    dump_seconds=record.get("dump_seconds"),
                    snapshot_bytes=record.get("snapshot_bytes"),
                    trace_kept=record.get("snapshot_trace_kept"),
                    nvml=("nvml" in record) or record.get("nvml_error"),
                )
                if record.get("snapshot") and restricted_load is None:
                    row["trace"] = unreadable
                elif record.get("snapshot"):
                    on_disk = Path(recorder.directory) / record["snapshot"]
                    data = restricted_load(on_disk, freeze_gc=False).data
                    row["trace"] = trace_profile(data)
                    row["snapshot_file_bytes"] = on_disk.stat().st_size
                    del data
                    problems += [f"oom {p}" for p in claim_problems(variant, row["trace"], ring)]
        found.append(row)
    return found, problems


def disk_per_rank(recorder: Any) -> dict[str, Any]:
    files = {
        p.name: p.stat().st_size
        for p in sorted(Path(recorder.directory).glob(f"{recorder.prefix}.*"))
        if ".tmp" not in p.name
    }
    return {
        "files": files,
        "total": sum(files.values()),
        "budget": recorder.settings.budget_bytes,
    }


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import oomlens.capture

    recorder = oomlens.capture.install(
        directory=str(out / "bench-capture"), run=f"bench-{args.mode}", snapshot_every_s=0.0
    )
    if recorder is None:
        raise SystemExit("capture did not start")

    import torch
    from model import GPTConfig

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    result: dict[str, Any] = {
        "mode": args.mode,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "variants": CLAIMS,
        "capture_settings": {
            "max_entries": recorder.settings.max_entries,
            "stacks_at": recorder.settings.stacks_at,
            "max_mb": recorder.settings.max_mb,
        },
        "loops": {},
        "problems": [],
    }

    def save() -> None:
        if rank == 0:
            path = out / f"overhead_{args.mode}.json"
            path.write_text(json.dumps(result, indent=2) + "\n")

    entries = {
        "capture": recorder.settings.max_entries,
        "capture_stacks": recorder.settings.max_entries,
        "torch_defaults": TORCH_DEFAULTS_ENTRIES,
    }

    def run(
        loop: TorchLoop,
        seconds: float,
        block_s: float,
        describe: dict[str, Any],
        min_allocations: float = 0.0,
    ) -> dict[str, Any]:
        summary = summarize(
            measure(
                loop,
                budget_s=seconds,
                block_s=block_s,
                min_rounds=args.min_rounds,
                max_rounds=args.max_rounds,
                max_entries=entries,
            ),
            min_allocations=min_allocations,
        )
        summary.update(describe, params=getattr(loop, "params", None))
        result["loops"][loop.name] = summary
        result["problems"] += summary["problems"]
        save()
        return summary

    def phase(name: str, work: Any) -> Any:
        """Run one phase; an exception is a problem of the result, not the end of the run
        (the phases after it still measure)."""
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - one GPU call: keep what can be measured
            traceback.print_exc()
            result["problems"].append(f"{name}: {type(exc).__name__}: {exc}"[:600])
            save()
            return None

    model_cfg = GPTConfig.named(args.model)
    model_cfg.seq_len = args.seq_len
    if args.mode == "torch":
        small_cfg = GPTConfig(
            vocab_size=8192,
            seq_len=args.small_seq,
            d_model=args.small_width,
            n_layer=args.small_layers,
            n_head=4,
        )
        phase(
            "small",
            lambda: run(
                gpt_loop(torch, "small", recorder, device, small_cfg, args.small_batch),
                args.small_seconds,
                args.small_block_s,
                {
                    "model": f"GPT {args.small_layers} x {args.small_width}",
                    "micro_batch": args.small_batch,
                    "seq_len": args.small_seq,
                },
                min_allocations=SMALL_MIN_ALLOCATIONS,
            ),
        )
        model = phase(
            "model", lambda: gpt_loop(torch, "model", recorder, device, model_cfg, args.micro_batch)
        )
        summary = model and phase(
            "model",
            lambda: run(
                model,
                args.model_seconds,
                args.model_block_s,
                {"model": args.model, "micro_batch": args.micro_batch, "seq_len": args.seq_len},
            ),
        )
        if not args.no_oom and model is not None:
            allocs = (summary or {}).get("allocations_per_step") or 1500
            found = phase("oom", lambda: measure_ooms(torch, recorder, model, allocs, out))
            if found is not None:
                result["oom"], problems = found
                result["problems"] += problems
    else:
        loop = phase("zero3", lambda: zero3_loop(torch, recorder, args, model_cfg))
        if loop is not None:
            phase(
                "zero3",
                lambda: run(
                    loop,
                    args.model_seconds,
                    args.model_block_s,
                    {
                        "model": args.model,
                        "micro_batch": args.micro_batch,
                        "seq_len": args.seq_len,
                        "zero_stage": 3,
                    },
                ),
            )
    recorder.flush()
    result["disk_per_rank"] = disk_per_rank(recorder)
    result["valid"] = not result["problems"]
    save()
    if rank != 0:
        return 0
    if result["problems"]:
        sys.stderr.write("capture_overhead: NO VALID RESULT:\n")
        for problem in result["problems"]:
            sys.stderr.write(f"  {problem}\n")
        return 3
    print_tables(result)
    return 0


def print_tables(result: dict[str, Any]) -> None:
    print(
        f"\n{result['mode']}: {result['gpu']}, torch {result['torch']}, "
        f"world size {result['world_size']}"
    )
    for loop in result["loops"].values():
        print()
        print("\n".join(table(loop)))
    for row in result.get("oom", []):
        print(
            f"  OOM under {row['variant']}: failure to snapshot on disk "
            f"{row.get('failure_to_disk_seconds')} s (snapshot {row.get('snapshot_seconds')} s), "
            f"{row.get('snapshot_bytes') or 0:,} bytes, ring {row['ring']:,}"
        )
    disk = result["disk_per_rank"]
    print(f"  disk per rank: {disk['total']:,} bytes (budget {disk['budget']:,})")


if __name__ == "__main__":
    sys.exit(main())
