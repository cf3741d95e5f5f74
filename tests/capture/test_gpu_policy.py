"""The torch side's decisions, without a GPU: when Python stacks are turned on, what the OOM
observer records, and how a snapshot is made to fit its budget (on real torch 2.11 snapshots).

A minimal stand-in for ``torch`` provides only the calls the recorder makes (the allocator's
counters come from a dict), so the decisions are tested exactly; the CUDA calls themselves are
exercised on the GPU (``fixtures/crash_logs/_scenarios/run_capture.py``)."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from oomlens.capture.gpu import GpuRecorder, fit_snapshot
from oomlens.capture.settings import CaptureSettings
from oomlens.ingest.snapshot import load_snapshot
from tests.assets.snapshots import make_variants as variants

GIB = 2**30


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def _fake_torch(history: list[dict[str, Any]], fraction: float = 1.0) -> Any:
    def record(**kwargs: Any) -> None:
        history.append(kwargs)

    return SimpleNamespace(
        cuda=SimpleNamespace(
            memory=SimpleNamespace(_record_memory_history=record),
            get_device_properties=lambda device: SimpleNamespace(total_memory=80 * GIB),
            is_initialized=lambda: True,
        ),
        _C=SimpleNamespace(_cuda_getMemoryFraction=lambda device: fraction),
    )


def _recorder(history: list[dict[str, Any]], fraction: float = 1.0, **settings: Any) -> GpuRecorder:
    events: list[tuple[str, dict[str, Any]]] = []
    recorder = GpuRecorder(
        _fake_torch(history, fraction),
        CaptureSettings(**settings),
        lambda kind, urgent=False, **fields: events.append((kind, fields)),
        lambda record: None,
        lambda data: "rank0.snapshot.pickle",
        lambda: None,
        pid=0,
    )
    recorder.events = events  # type: ignore[attr-defined]
    recorder._set_history(stacks=False, reason="start")
    return recorder


def test_history_starts_without_stacks() -> None:
    history: list[dict[str, Any]] = []
    _recorder(history, max_entries=1234)
    assert history == [{"enabled": "all", "context": None, "stacks": "python", "max_entries": 1234}]


def test_stacks_turn_on_near_the_allowed_limit_only() -> None:
    history: list[dict[str, Any]] = []
    recorder = _recorder(history, fraction=0.1)  # 8 GiB allowed of an 80 GiB card
    recorder.check_pressure({"dev": 0, "reserved_peak": int(6 * GIB), "retries": 0})
    assert len(history) == 1  # 75% of the allowed 8 GiB: not yet
    recorder.check_pressure({"dev": 0, "reserved_peak": int(6.5 * GIB), "retries": 0})
    assert history[-1]["context"] == "alloc" and history[-1]["stacks"] == "python"
    kind, policy = recorder.events[-1]  # type: ignore[attr-defined]
    assert kind == "policy" and "of the allowed" in policy["reason"]
    recorder.check_pressure({"dev": 0, "reserved_peak": int(7 * GIB), "retries": 0})
    assert len(history) == 2  # once


def test_stacks_turn_on_when_the_allocator_starts_retrying() -> None:
    history: list[dict[str, Any]] = []
    recorder = _recorder(history)
    recorder.check_pressure({"dev": 0, "reserved_peak": GIB, "retries": 0})
    recorder.check_pressure({"dev": 0, "reserved_peak": GIB, "retries": 0})
    assert len(history) == 1
    recorder.check_pressure({"dev": 0, "reserved_peak": GIB, "retries": 2})
    assert len(history) == 2 and "retried" in recorder.events[-1][1]["reason"]  # type: ignore[attr-defined]


def test_stacks_turn_on_when_memory_rises_step_after_step() -> None:
    history: list[dict[str, Any]] = []
    recorder = _recorder(history, rising_steps=4, step_interval=0.0)
    recorder.cuda_ready = True
    now = {"alloc": 0}

    def counters(device: int | None = None) -> dict[str, int]:
        return {"dev": 0, "alloc": now["alloc"], "reserved_peak": GIB}

    recorder.counters = counters  # type: ignore[method-assign]
    recorder._main_device = lambda: 0  # type: ignore[method-assign]
    for step, allocated in enumerate([100, 90, 100, 110, 120], start=1):
        now["alloc"] = allocated
        recorder.on_step(step, "optimizer step")
    assert len(history) == 1  # three rises so far
    now["alloc"] = 130
    recorder.on_step(6, "optimizer step")
    assert len(history) == 2
    assert "rose 4 times in a row" in recorder.events[-1][1]["reason"]  # type: ignore[attr-defined]


def test_stacks_never_with_stacks_at_one() -> None:
    history: list[dict[str, Any]] = []
    recorder = _recorder(history, stacks_at=1.0)
    recorder.check_pressure({"dev": 0, "reserved_peak": 79 * GIB, "retries": 9})
    assert len(history) == 1


def _real_snapshot() -> dict[str, Any]:
    data = Path(variants.REAL["stacks_all"]).read_bytes()
    return _NoGlobals(io.BytesIO(data)).load()  # type: ignore[no-any-return]


def test_a_snapshot_within_budget_is_written_whole(tmp_path: Path) -> None:
    snapshot = _real_snapshot()
    data, kept = fit_snapshot(snapshot, 50 * 2**20)
    assert kept is None
    assert _NoGlobals(io.BytesIO(data)).load() == _real_snapshot()
    assert data[:2] == b"\x80\x04"  # protocol 4: torch's memory_viz page reads it


def test_an_oversized_snapshot_keeps_its_newest_trace_entries(tmp_path: Path) -> None:
    snapshot = _real_snapshot()
    full = len(pickle.dumps(_real_snapshot(), protocol=4))
    traces = [list(t) for t in _real_snapshot()["device_traces"]]
    data, kept = fit_snapshot(snapshot, full * 2 // 3)
    assert len(data) <= full * 2 // 3
    assert kept is not None and 0 < kept[0] < len(traces[0])
    loaded = _NoGlobals(io.BytesIO(data)).load()
    assert loaded["device_traces"][0] == traces[0][-kept[0] :]
    assert loaded["segments"] == _real_snapshot()["segments"]
    path = tmp_path / "rank0.snapshot.pickle"
    path.write_bytes(data)
    assert load_snapshot(path).segment_count == 11  # oomlens reads what the capture wrote


def test_the_oom_observer_records_the_oom_and_writes_a_snapshot_oomlens_reads(
    tmp_path: Path,
) -> None:
    """The observer path end to end, with torch's CUDA calls answered from the real torch
    2.11 snapshot the lab's observer dumped (``snapshot_t211_dumped_in_oom_observer``)."""
    real = _NoGlobals(io.BytesIO(Path(variants.REAL["observer"]).read_bytes())).load()
    observers: list[Any] = []
    history: list[dict[str, Any]] = []
    stats = {
        "allocated_bytes": {"all": {"current": 7 * GIB, "peak": 7 * GIB}},
        "reserved_bytes": {"all": {"current": 8 * GIB, "peak": 8 * GIB}},
        "num_alloc_retries": 1,
        "num_ooms": 1,
    }
    torch = SimpleNamespace(
        cuda=SimpleNamespace(
            memory=SimpleNamespace(
                _record_memory_history=lambda **kw: history.append(kw),
                _snapshot=lambda: real,
            ),
            get_device_properties=lambda device: SimpleNamespace(total_memory=80 * GIB, uuid="x"),
            is_initialized=lambda: True,
            _lazy_call=lambda callback: callback(),
        ),
        _C=SimpleNamespace(
            _cuda_attach_out_of_memory_observer=observers.append,
            _cuda_getAllocatorBackend=lambda: "native",
            _cuda_memoryStats=lambda device: stats,
            _cuda_getMemoryFraction=lambda device: 0.1,
        ),
    )
    events: list[tuple[str, dict[str, Any]]] = []
    samples: list[dict[str, Any]] = []
    written: list[bytes] = []

    def write(data: bytes) -> str:
        written.append(data)
        (tmp_path / "rank0.snapshot.pickle").write_bytes(data)
        return "rank0.snapshot.pickle"

    recorder = GpuRecorder(
        torch,
        CaptureSettings(),
        lambda kind, urgent=False, **fields: events.append((kind, fields)),
        samples.append,
        write,
        lambda: None,
        pid=__import__("os").getpid(),
    )
    recorder.attach()
    assert recorder.cuda_ready and history[0]["context"] is None and len(observers) == 1
    observers[0](0, 44040192, 8 * GIB, 12 * GIB)  # what the allocator passes
    kind, oom = events[-1]
    assert kind == "oom"
    assert (oom["device"], oom["requested"], oom["limit"], oom["device_free"]) == (
        0,
        44040192,
        8 * GIB,
        12 * GIB,
    )
    assert oom["allowed"] == 8 * GIB and oom["snapshot"] == "rank0.snapshot.pickle"
    assert oom["counters"]["reserved"] == 8 * GIB and samples[-1]["src"] == "oom"
    snapshot = load_snapshot(tmp_path / "rank0.snapshot.pickle")
    assert snapshot.segment_count == 11
    observers[0](0, 44040192, 8 * GIB, 12 * GIB)  # a second OOM soon after: no second dump
    assert len(written) == 1 and "snapshot" not in events[-1][1]
