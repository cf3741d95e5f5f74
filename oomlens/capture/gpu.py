"""The torch side of the capture: the allocator's history, the out-of-memory observer and its
snapshot, the per-step counters, and when to turn Python stacks on.

Recording policy (measured; docs/capture.md): from CUDA's initialisation the
allocator keeps a bounded ring of alloc/free events *without stacks*
(``_record_memory_history(enabled="all", context=None)``), which costs nothing measurable on
training loops.  Stacks cost 7-25% of the step time, so they are turned on (``context="alloc",
stacks="python"``) only when this rank comes close to running out: its peak reserved memory
reaches ``stacks_at`` of the limit, the allocator had to flush its cache and retry a cudaMalloc,
or allocated memory after each step rose ``rising_steps`` times in a row.  From then on the
blocks that fill the card carry the Python lines that allocated them.

Everything is set up from ``torch.cuda._lazy_call``: when the training initialises CUDA, never
before (an early init would put a context on the wrong GPU).  Nothing here synchronises.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from oomlens.capture import probes
from oomlens.capture.nvml import Nvml
from oomlens.capture.settings import CaptureSettings

Emit = Callable[..., None]
"""``emit(kind, urgent=False, **fields)``: record an event."""


class GpuRecorder:
    def __init__(
        self,
        torch: Any,
        settings: CaptureSettings,
        emit: Emit,
        sample: Callable[[dict[str, Any]], None],
        snapshot_writer: Callable[[bytes], str | None],
        flush: Callable[[], None],
        pid: int,
    ) -> None:
        self.torch = torch
        self.settings = settings
        self._emit = emit
        self._sample = sample
        self._write_snapshot = snapshot_writer
        self._flush = flush
        self.pid = pid
        self.cuda_ready = False
        self.device: int | None = None
        self.history = False
        self.stacks = False
        self.backend: str | None = None
        self.step = 0
        self.engine_seen = False
        self.params_recorded = False
        self._limits: dict[int, tuple[int, int | None]] = {}
        self._last_step_sample = 0.0
        self._step_interval = settings.step_interval
        self._rising: deque[int] = deque(maxlen=max(2, settings.rising_steps + 1))
        self._retries_seen: int | None = None
        self._errors = 0
        self._last_dump = 0.0
        self.oom_count = 0
        self.nvml = Nvml()
        self.nvml_tried = False
        self.paused = False

    # ---------------------------------------------------------------- setup

    def attach(self) -> None:
        """Hook optimizer steps now and the allocator when CUDA initialises."""
        torch = self.torch
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._optimizer_step)
        except Exception as exc:  # noqa: BLE001
            self._emit("note", text=f"no optimizer step hook: {exc}"[:300])
        try:
            if getattr(torch._C, "_cuda_attach_out_of_memory_observer", None) is None:
                self._emit("note", text="torch without CUDA: no allocator recording")
                return
            torch.cuda._lazy_call(self._on_cuda_init)
        except Exception as exc:  # noqa: BLE001
            self._emit("note", text=f"cannot wait for CUDA: {exc}"[:300])

    def _on_cuda_init(self) -> None:
        """Inside torch's CUDA initialisation: must be quick and must not raise."""
        try:
            torch = self.torch
            try:
                self.backend = str(torch._C._cuda_getAllocatorBackend())
            except Exception:  # noqa: BLE001
                self.backend = None
            if self.backend == "cudaMallocAsync":
                self._emit(
                    "note",
                    text="allocator backend cudaMallocAsync: it keeps no history and calls no "
                    "out-of-memory observer; only counters are recorded",
                )
            else:
                if self.settings.history:
                    self._set_history(stacks=self.settings.stacks_at <= 0, reason="start")
                torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
            self.cuda_ready = True
        except Exception as exc:  # noqa: BLE001
            self._emit("note", text=f"allocator recording not started: {exc}"[:300])

    def _set_history(self, *, stacks: bool, reason: str) -> None:
        record = self.torch.cuda.memory._record_memory_history
        entries = self.settings.max_entries
        if stacks:
            record(enabled="all", context="alloc", stacks="python", max_entries=entries)
        else:
            record(enabled="all", context=None, stacks="python", max_entries=entries)
        self.history = True
        self.stacks = stacks
        self._emit(
            "policy",
            history="all",
            stacks="python" if stacks else None,
            context="alloc" if stacks else None,
            max_entries=entries,
            reason=reason,
            step=self.step,
        )

    # ---------------------------------------------------------------- counters

    def limit(self, device: int) -> tuple[int, int | None] | None:
        """``(card capacity, allowed)`` of ``device``; ``allowed`` when a per-process memory
        fraction is set."""
        try:
            cached = self._limits.get(device)
            total = (
                cached[0]
                if cached
                else int(self.torch.cuda.get_device_properties(device).total_memory)
            )
            allowed = None
            get_fraction = getattr(self.torch._C, "_cuda_getMemoryFraction", None)
            if get_fraction is not None:
                fraction = float(get_fraction(device))
                if 0 < fraction < 1:
                    allowed = int(total * fraction)
            self._limits[device] = (total, allowed)
            return total, allowed
        except Exception:  # noqa: BLE001
            return None

    def counters(self, device: int | None = None) -> dict[str, int] | None:
        if not self.cuda_ready:
            return None
        if device is None:
            device = self.device
        if device is None:
            device = probes.busiest_device(self.torch)
        if device is None:
            return None
        return probes.gpu_counters(self.torch, device)

    def _main_device(self) -> int | None:
        try:
            return int(self.torch.cuda.current_device())
        except Exception:  # noqa: BLE001
            return None

    # ---------------------------------------------------------------- steps

    def _optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.engine_seen:
            return  # DeepSpeed's engine step is the step; its inner optimizer may step per group
        try:
            if not self.params_recorded:
                self.params_recorded = True
                count = sum(
                    int(p.numel()) for group in optimizer.param_groups for p in group["params"]
                )
                self._emit("model", params=count, origin="the optimizer's parameters")
            self.on_step(self.step + 1, "optimizer step")
        except Exception:  # noqa: BLE001
            self._failed()

    def engine_step_started(self, *args: Any, **kwargs: Any) -> None:
        self.engine_seen = True

    def engine_step_done(self, result: Any, engine: Any, *args: Any, **kwargs: Any) -> None:
        try:
            if not self.params_recorded:
                self.params_recorded = True
                count = sum(
                    int(getattr(p, "ds_numel", 0) or p.numel()) for p in engine.module.parameters()
                )
                self._emit("model", params=count, origin="the DeepSpeed engine's module")
            step = int(getattr(engine, "global_steps", self.step + 1))
            self.on_step(step, "engine step")
        except Exception:  # noqa: BLE001
            self._failed()

    def on_step(self, step: int, label: str) -> None:
        """A training step ended (main thread): sample the counters, at most once per
        ``step_interval`` seconds, and decide about stacks."""
        self.step = step
        if not self.cuda_ready or self.paused:
            return
        now = time.monotonic()
        if now - self._last_step_sample < self._step_interval:
            return
        self._last_step_sample = now
        device = self._main_device()
        if device is not None:
            self.device = device
        counters = self.counters(device)
        if counters is None:
            return
        self._sample({"src": "step", "label": label, "step": step, **counters})
        self._rising.append(counters.get("alloc", 0))
        self.check_pressure(counters)

    def halve_rate(self) -> None:
        self._step_interval = min(60.0, max(self._step_interval, 0.05) * 2)

    def check_pressure(self, counters: dict[str, int]) -> None:
        """Turn Python stacks on when this rank comes close to running out."""
        if self.stacks or not self.history or self.settings.stacks_at >= 1:
            return
        reason = None
        limits = self.limit(counters["dev"])
        peak = counters.get("reserved_peak", 0)
        if limits is not None:
            total, allowed = limits
            limit = allowed or total
            if peak >= self.settings.stacks_at * limit:
                reason = (
                    f"peak reserved {peak} B reached {peak / limit:.0%} of the "
                    f"{'allowed' if allowed else 'card'} {limit} B"
                )
        retries = counters.get("retries")
        if reason is None and retries is not None:
            if self._retries_seen is None:
                self._retries_seen = retries
            elif retries > self._retries_seen:
                reason = f"the allocator flushed its cache and retried cudaMalloc ({retries})"
        rising = list(self._rising)
        if (
            reason is None
            and len(rising) == self._rising.maxlen
            and all(b > a for a, b in zip(rising, rising[1:], strict=False))
        ):
            reason = f"allocated memory after each step rose {len(rising) - 1} times in a row"
        if reason is not None:
            try:
                self._set_history(stacks=True, reason=reason)
            except Exception as exc:  # noqa: BLE001
                self.stacks = True  # do not retry every step
                self._emit("note", text=f"stacks not turned on: {exc}"[:300])

    def _failed(self) -> None:
        self._errors += 1
        if self._errors == 3:
            self._emit("note", text="step sampling failed three times; later failures ignored")

    # ---------------------------------------------------------------- out of memory

    def _on_oom(self, device: int, alloc: int, limit: int, device_free: int) -> None:
        """torch's out-of-memory observer: after the allocator gave up, before the exception
        is raised (the memory is still held).  Local work only: no collective, no sync."""
        try:
            import os

            if os.getpid() != self.pid or self.paused:
                return
            self.oom_count += 1
            started = time.monotonic()
            counters = probes.gpu_counters(self.torch, device) or {"dev": device}
            self._sample({"src": "oom", "step": self.step, **counters})
            fields: dict[str, Any] = {
                "device": device,
                "requested": alloc,
                "limit": limit,
                "device_free": device_free,
                "step": self.step,
                "count": self.oom_count,
                "stacks": self.stacks,
                "counters": counters,
            }
            limits = self.limit(device)
            if limits is not None:
                fields["total"], fields["allowed"] = limits
            report = self.nvml.device_report(self.torch, device)
            if report is not None:
                fields["nvml"] = report
            elif self.nvml.error:
                fields["nvml_error"] = self.nvml.error
            now = time.monotonic()
            if self.history and (
                self._last_dump == 0.0 or now - self._last_dump >= self.settings.snapshot_every_s
            ):
                self._last_dump = now
                fields.update(self._dump())
            fields["observer_seconds"] = round(time.monotonic() - started, 3)
            self._emit("oom", urgent=True, **fields)
        except Exception as exc:  # noqa: BLE001
            try:
                self._emit("note", urgent=True, text=f"OOM observer failed: {exc}"[:300])
            except Exception:  # noqa: BLE001
                pass

    def _dump(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            snapshot = self.torch.cuda.memory._snapshot()
        except Exception as exc:  # noqa: BLE001
            return {"snapshot_error": f"{type(exc).__name__}: {exc}"[:300]}
        taken = time.monotonic() - started
        data, kept = fit_snapshot(snapshot, self.settings.snapshot_budget)
        written = self._write_snapshot(data)
        out: dict[str, Any] = {
            "snapshot": written,
            "snapshot_bytes": len(data),
            "snapshot_seconds": round(taken, 3),
            "dump_seconds": round(time.monotonic() - started, 3),
        }
        if kept is not None:
            out["snapshot_trace_kept"] = kept
        return out


def fit_snapshot(snapshot: dict[str, Any], budget: int) -> tuple[bytes, list[int] | None]:
    """The snapshot pickled (protocol 4, what torch's viewer reads) within ``budget`` bytes:
    the oldest trace entries go first, then the blocks' stacks.  ``kept`` is how many trace
    entries each device kept when some were dropped, else None."""
    data = pickle.dumps(snapshot, protocol=4)
    if len(data) <= budget:
        return data, None
    traces = snapshot.get("device_traces") or []
    kept = [len(t) for t in traces]
    for _ in range(6):
        if len(data) <= budget or not any(kept):
            break
        ratio = budget / len(data) * 0.9
        kept = [int(n * ratio) for n in kept]
        snapshot["device_traces"] = [
            t[len(t) - n :] if n else [] for t, n in zip(traces, kept, strict=False)
        ]
        data = pickle.dumps(snapshot, protocol=4)
    if len(data) > budget:
        for segment in snapshot.get("segments") or []:
            segment.pop("frames", None)
            for block in segment.get("blocks") or []:
                block.pop("frames", None)
        data = pickle.dumps(snapshot, protocol=4)
    return data, kept
