"""One process' capture: its files, its events, the background thread, and the hooks that
record how it ends (an exception, an exit, or, through the sentinel, its disappearance).

Threads: hooks on the training's threads only put records on a bounded queue (and take the
allocator's counters, a read under its lock); the ``oomlens-capture`` daemon thread writes them
every second with the host's counters.  Records that matter at the end (an OOM, an exception,
the exit) are written at once by the thread that has them.  Nothing here synchronises the GPU,
calls a collective, or lets an exception out.
"""

from __future__ import annotations

import atexit
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from types import ModuleType, TracebackType
from typing import Any

from oomlens.capture import hooks, naming, probes
from oomlens.capture.settings import (
    CaptureSettings,
    SettingsError,
    enabled,
    environment_of,
    resolve,
)
from oomlens.capture.writer import JsonLines, Stop, encode, write_whole

MAX_QUEUE = 20_000
MAX_FRAMES_HEAD = 10
MAX_FRAMES_TAIL = 50
MAX_MESSAGE = 8000
MAX_DS_CONFIGS = 4

_current: Recorder | None = None
_start_lock = threading.Lock()


def current() -> Recorder | None:
    return _current


def start(directory: str | None, overrides: dict[str, Any]) -> Recorder | None:
    """``oomlens.capture.install``: see there."""
    global _current
    with _start_lock:
        if _current is not None and _current.pid == os.getpid():
            return _current
        if not enabled():
            return None
        try:
            if directory is not None:
                overrides = {**overrides, "directory": directory}
            settings = resolve(overrides)
            recorder = Recorder(settings)
        except SettingsError as exc:
            _say(f"not started: {exc}")
            return None
        except OSError as exc:
            _say(f"not started: {exc.filename or ''}: {exc.strerror or exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - the training must start anyway
            _say(f"not started: {type(exc).__name__}: {exc}")
            return None
        _current = recorder
        recorder.begin()
        return recorder


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"oomlens capture: {text}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass


class Recorder:
    """The capture of one process.  Created by ``start``; ``begin`` starts it."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.ident = naming.identity()
        self.run, self.run_origin = (
            (naming.safe_name(settings.run), "setting")
            if settings.run
            else naming.run_name(self.ident)
        )
        self.directory = os.path.abspath(os.path.join(settings.directory, self.run))
        os.makedirs(self.directory, exist_ok=True)
        self.prefix = naming.file_prefix(self.ident, self.directory)
        self.stop = Stop()
        header = {
            "run": self.run,
            "rank": self.ident.rank,
            "local_rank": self.ident.local_rank,
            "world_size": self.ident.world_size,
            "host": self.ident.host,
            "pid": self.pid,
        }
        self.events = JsonLines(
            self.path("events.jsonl"),
            {"file": "events", **header},
            settings.events_budget,
            self.stop,
        )
        self.series = JsonLines(
            self.path("series.jsonl"),
            {"file": "series", **header},
            settings.series_budget,
            self.stop,
            compact=True,
        )
        self._queue: deque[str] = deque(maxlen=MAX_QUEUE)
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._ended = False
        self._ds_configs: list[int] = []
        self.gpu: Any = None
        self.cgroup = probes.Cgroup.of()
        self._interval = settings.interval
        self._thread: threading.Thread | None = None
        self._previous_excepthook = sys.excepthook
        self._dist_recorded = False
        self._exceptions_seen: set[int] = set()
        self._paused = False

    def path(self, name: str) -> str:
        return os.path.join(self.directory, f"{self.prefix}.{name}")

    # ---------------------------------------------------------------- recording

    def emit(self, kind: str, urgent: bool = False, **fields: Any) -> None:
        """Record an event; ``urgent`` writes it (and everything queued) now."""
        if self.stop.stopped:
            return
        line = encode({"t": round(time.time(), 3), "kind": kind, **fields})
        self._queue.append("E" + line)
        if urgent:
            self.flush()

    def sample(self, record: dict[str, Any]) -> None:
        if self.stop.stopped:
            return
        self._queue.append("S" + encode({"t": round(time.time(), 3), **record}))

    def flush(self) -> None:
        """Write everything queued (any thread; the file lock keeps lines whole)."""
        with self._write_lock:
            events: list[str] = []
            samples: list[str] = []
            while self._queue:
                item = self._queue.popleft()
                (events if item[0] == "E" else samples).append(item[1:])
            self.events.write(events)
            if self.series.write(samples) and self.gpu is not None:
                self.gpu.halve_rate()
                self._interval = min(10.0, self._interval * 2)

    # ---------------------------------------------------------------- lifecycle

    def begin(self) -> None:
        settings = self.settings
        # Processes this one starts and that capture too join this run's directory.
        os.environ.update(environment_of(settings))
        os.environ["OOMLENS_CAPTURE_DIR"] = os.path.dirname(self.directory)
        os.environ["OOMLENS_CAPTURE_RUN"] = self.run
        self.emit(
            "start",
            urgent=True,
            run=self.run,
            run_origin=self.run_origin,
            rank=self.ident.rank,
            local_rank=self.ident.local_rank,
            world_size=self.ident.world_size,
            restart=self.ident.restart,
            host=self.ident.host,
            pid=self.pid,
            argv=[a[:500] for a in sys.argv[:64]],
            cwd=os.getcwd(),
            python=platform.python_version(),
            platform=platform.platform(),
            environment={
                k: v[:500]
                for k, v in os.environ.items()
                if k.startswith(("PYTORCH_", "CUDA_", "NCCL_", "OOMLENS_CAPTURE", "TORCH_"))
                or k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID")
            },
            settings={
                "max_entries": settings.max_entries,
                "stacks_at": settings.stacks_at,
                "rising_steps": settings.rising_steps,
                "interval": settings.interval,
                "step_interval": settings.step_interval,
                "max_mb": settings.max_mb,
                "history": settings.history,
            },
            cgroup={
                "path": self.cgroup.path,
                "version": self.cgroup.version,
                "max": self.cgroup.limit(),
            }
            if self.cgroup is not None
            else None,
            node=probes.node_memory(),
        )
        sys.excepthook = self._excepthook
        atexit.register(self.end)
        try:
            os.register_at_fork(after_in_child=self._forked)
        except AttributeError:
            pass
        hooks.when_imported("torch", self._on_torch)
        hooks.when_imported("deepspeed.runtime.config", self._on_ds_config_module)
        hooks.when_imported("deepspeed.runtime.engine", self._on_ds_engine_module)
        self._thread = threading.Thread(target=self._loop, name="oomlens-capture", daemon=True)
        self._thread.start()

    def _forked(self) -> None:
        # A DataLoader worker or another fork: the files and the thread are the parent's.
        self._ended = True
        self.stop.reason = self.stop.reason or "forked child"

    def record_exception(self, exc: BaseException) -> None:
        """Record the exception this process dies of (its chain, root cause first)."""
        if os.getpid() != self.pid or self._ended or id(exc) in self._exceptions_seen:
            return
        self._exceptions_seen.add(id(exc))
        try:
            chain: list[BaseException] = []
            seen: set[int] = set()
            current: BaseException | None = exc
            while current is not None and id(current) not in seen and len(chain) < 4:
                seen.add(id(current))
                chain.append(current)
                cause = current.__cause__
                if cause is None and not current.__suppress_context__:
                    cause = current.__context__
                current = cause
            records = [_exception_record(e) for e in reversed(chain)]
            self.emit("exception", urgent=True, chain=records, step=self._step())
        except Exception:  # noqa: BLE001
            pass

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if exc.__traceback__ is None and tb is not None:
            exc = exc.with_traceback(tb)
        self.record_exception(exc)
        self._previous_excepthook(kind, exc, tb)

    def end(self, code: int | None = None) -> None:
        """The process is exiting normally (atexit, or the ``python -m`` wrapper)."""
        if self._ended or os.getpid() != self.pid:
            return
        self._ended = True
        try:
            self._sample_now("exit")
            fields: dict[str, Any] = {"code": code, "step": self._step()}
            if self.events.dropped or self.series.dropped:
                fields["dropped"] = {"events": self.events.dropped, "series": self.series.dropped}
            if self.series.compactions:
                fields["compactions"] = self.series.compactions
            self.emit("exit", urgent=True, **fields)
        except Exception:  # noqa: BLE001
            pass
        finally:
            self.events.close()
            self.series.close()

    def _step(self) -> int | None:
        return self.gpu.step if self.gpu is not None else None

    # ---------------------------------------------------------------- control

    def pause(self) -> None:
        """Stop recording (allocator history off and cleared, no samples) until ``resume``:
        for a section whose cost must not be counted, or a benchmark's baseline."""
        self._paused = True
        gpu = self.gpu
        if gpu is not None:
            gpu.paused = True
            if gpu.history:
                try:
                    gpu.torch.cuda.memory._record_memory_history(enabled=None)
                except Exception:  # noqa: BLE001
                    pass
                gpu.history = False
        self.emit("policy", history=None, stacks=None, reason="paused", step=self._step())

    def resume(self, *, stacks: bool | None = None) -> None:
        """Record again; ``stacks`` True/False forces Python stacks on/off (None: as before)."""
        self._paused = False
        gpu = self.gpu
        if gpu is None:
            return
        gpu.paused = False
        if gpu.cuda_ready and self.settings.history:
            want = gpu.stacks if stacks is None else stacks
            try:
                gpu._set_history(stacks=want, reason="resumed")
            except Exception as exc:  # noqa: BLE001
                self.emit("note", text=f"history not resumed: {exc}"[:300])

    # ---------------------------------------------------------------- hooks

    def _on_torch(self, torch: ModuleType) -> None:
        from oomlens.capture.gpu import GpuRecorder

        gpu = GpuRecorder(
            torch,
            self.settings,
            self.emit,
            self.sample,
            self._write_snapshot,
            self.flush,
            self.pid,
        )
        self.gpu = gpu
        self.emit(
            "torch",
            version=str(getattr(torch, "__version__", "?")),
            cuda=str(getattr(getattr(torch, "version", None), "cuda", None)),
        )
        gpu.attach()

    def _write_snapshot(self, data: bytes) -> str | None:
        path = self.path("snapshot.pickle")
        return os.path.basename(path) if write_whole(path, data, self.stop) else None

    def _on_ds_config_module(self, module: ModuleType) -> None:
        cls = getattr(module, "DeepSpeedConfig", None)
        if cls is not None:
            hooks.wrap_after(cls, "__init__", self._ds_config_built)

    def _ds_config_built(self, result: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        lines = deepspeed_dump_lines(config)
        key = hash(tuple(lines))
        if key in self._ds_configs or len(self._ds_configs) >= MAX_DS_CONFIGS:
            return
        self._ds_configs.append(key)
        version = None
        ds = sys.modules.get("deepspeed")
        if ds is not None:
            version = str(getattr(ds, "__version__", None))
        self.emit("deepspeed_config", deepspeed=version, lines=lines)

    def _on_ds_engine_module(self, module: ModuleType) -> None:
        cls = getattr(module, "DeepSpeedEngine", None)
        if cls is None or self.gpu is None:
            return
        gpu = self.gpu
        target = "_take_model_step" if hasattr(cls, "_take_model_step") else "step"
        hooks.wrap_around(cls, target, gpu.engine_step_started, gpu.engine_step_done)

    # ---------------------------------------------------------------- background

    def _loop(self) -> None:
        self._start_sentinel()
        while self._running():
            self._wake.wait(self._interval)
            self._wake.clear()
            if not self._running():
                break
            try:
                if not self._paused:
                    self._sample_now("timer")
                self._check_distributed()
                self._start_nvml()
                self.flush()
            except Exception:  # noqa: BLE001
                continue

    def _running(self) -> bool:
        return not self._ended and not self.stop.stopped

    def _sample_now(self, source: str) -> None:
        record: dict[str, Any] = {"src": source}
        gpu = self.gpu
        if gpu is not None:
            record["step"] = gpu.step
            counters = gpu.counters()
            if counters is not None:
                record.update(counters)
                if source == "timer":
                    gpu.check_pressure(counters)
            pinned = probes.pinned_bytes(gpu.torch) if gpu.cuda_ready else None
            if pinned is not None:
                record["pinned"] = pinned
        record.update(probes.process_memory())
        if self.cgroup is not None:
            record["cg_current"] = self.cgroup.current()
            record["cg_max"] = self.cgroup.limit()
            record["cg_events"] = self.cgroup.events()
        node = probes.node_memory()
        if "mem_available" in node:
            record["mem_available"] = node["mem_available"]
        self.sample(record)

    def _start_nvml(self) -> None:
        """NVML is set up ahead of an OOM (its first call takes a while), off the training's
        threads, once CUDA is up and only where nvidia-ml-py is installed."""
        gpu = self.gpu
        if gpu is None or not gpu.cuda_ready or gpu.nvml_tried:
            return
        gpu.nvml_tried = True
        gpu.nvml.start()

    def _check_distributed(self) -> None:
        if self._dist_recorded:
            return
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self._dist_recorded = True
                self.emit(
                    "distributed",
                    rank=int(dist.get_rank()),
                    world_size=int(dist.get_world_size()),
                    backend=str(dist.get_backend()),
                )
        except Exception:  # noqa: BLE001
            self._dist_recorded = True

    def _start_sentinel(self) -> None:
        if not self.settings.sentinel:
            return
        args = [
            sys.executable,
            "-m",
            "oomlens.capture.sentinel",
            "--pid",
            str(self.pid),
            "--events",
            self.events.path,
            "--kernel",
            self.path("kernel.log"),
        ]
        if self.cgroup is not None:
            args += ["--cgroup", self.cgroup.path, "--cgroup-version", str(self.cgroup.version)]
        try:
            child = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
                cwd="/",
            )
            child.wait(timeout=30)  # it forks the watcher and returns at once
        except Exception as exc:  # noqa: BLE001
            self.emit("note", text=f"no sentinel: {exc}"[:300])


def _exception_record(exc: BaseException) -> dict[str, Any]:
    kind = type(exc)
    module = kind.__module__
    name = (
        kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    )
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001
        message = "<unprintable>"
    frames = list(traceback.extract_tb(exc.__traceback__))
    omitted = 0
    if len(frames) > MAX_FRAMES_HEAD + MAX_FRAMES_TAIL:
        omitted = len(frames) - MAX_FRAMES_HEAD - MAX_FRAMES_TAIL
        frames = frames[:MAX_FRAMES_HEAD] + frames[-MAX_FRAMES_TAIL:]
    return {
        "class": name,
        "message": message[:MAX_MESSAGE],
        "frames": [[f.filename, f.lineno or 0, f.name] for f in frames],
        "frames_omitted": omitted,
    }


def deepspeed_dump_lines(config: Any) -> list[str]:
    """The lines ``DeepSpeedConfig.print("DeepSpeedEngine configuration")`` logs (without the
    logger's prefix): every resolved attribute, then the user's JSON."""
    import json

    lines = ["DeepSpeedEngine configuration:"]
    for arg in sorted(vars(config)):
        if arg == "_param_dict":
            continue
        try:
            value = str(getattr(config, arg))
        except Exception:  # noqa: BLE001
            value = "<unprintable>"
        lines.append("  {} {} {}".format(arg, "." * (29 - len(arg)), value[:4000]))
    encoder: Any = None
    module = sys.modules.get("deepspeed.runtime.config")
    if module is not None:
        encoder = getattr(module, "ScientificNotationEncoder", None)
    try:
        text = json.dumps(
            getattr(config, "_param_dict", {}),
            sort_keys=True,
            indent=4,
            cls=encoder,
            separators=(",", ":"),
            default=str,
        )
    except Exception:  # noqa: BLE001
        text = "{}"
    json_lines = text.splitlines() or ["{}"]
    lines.append("  json = " + json_lines[0])
    lines.extend(json_lines[1:])
    return lines
