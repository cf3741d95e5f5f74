"""The CPU side of ``bench/capture_overhead.py`` (``bench/capture_bench_core.py``): what each
variant must have recorded, judged on real torch 2.11 snapshots (and on variants of them made
by code); the schedule of interleaved blocks and its statistics, with stand-in loops whose
cost per variant is known; and that a result which means nothing raises instead of printing a
table.  The GPU run itself is the coordinator's (``bench/run_capture_bench.py``)."""

from __future__ import annotations

import copy
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oomlens.ingest.snapshot.unpickler import restricted_load

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets" / "snapshots"
CAPTURED = ROOT / "fixtures" / "crash_logs" / "fragmentation_captured" / "oomlens-capture"

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
core = importlib.import_module("capture_bench_core")


def _load(path: Path) -> dict[str, Any]:
    data = restricted_load(path).data  # frozen: the blocks' gc.collect() does not walk it
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def stacks_all() -> dict[str, Any]:
    """Recorded with torch's defaults (context and stacks 'all') on an H200."""
    return _load(ASSETS / "snapshot_t211_stacks_all_oom.pickle")


@pytest.fixture(scope="module")
def captured_stacks() -> dict[str, Any]:
    """Written by the capture's OOM observer after it turned Python stacks on."""
    return _load(next(CAPTURED.glob("*/rank0.snapshot.pickle")))


def _without_frames(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What the capture's defaults record (context=None): the same trace with no stacks."""
    out = copy.deepcopy(snapshot)
    for trace in out["device_traces"]:
        for entry in trace:
            if "frames" in entry:
                entry["frames"] = []
    return out


# ------------------------------------------------------------------------------ claims


def test_torch_defaults_claim_holds_on_a_snapshot_recorded_with_torch_defaults(
    stacks_all: dict[str, Any],
) -> None:
    profile = core.trace_profile(stacks_all)
    assert profile["alloc_cpp_share"] == 1.0
    assert profile["free_own_stack_share"] == 1.0
    assert core.claim_problems("torch_defaults", profile, 100_000) == []
    # ... and it is none of the capture's variants
    assert any("C++" in p for p in core.claim_problems("capture_stacks", profile, 100_000))
    assert core.claim_problems("capture", profile, 100_000)
    assert core.claim_problems("off", profile, 100_000)


def test_capture_stacks_claim_holds_on_the_captures_own_snapshot(
    captured_stacks: dict[str, Any],
) -> None:
    profile = core.trace_profile(captured_stacks)
    assert profile["allocs"] > 1000 and profile["alloc_cpp_share"] == 0
    assert profile["frees_matched"] > 1000 and profile["free_own_stack_share"] == 0
    assert core.claim_problems("capture_stacks", profile, 50_000) == []
    problems = core.claim_problems("torch_defaults", profile, 100_000)
    assert any("C++" in p for p in problems) and any("at free" in p for p in problems)


def test_python_stacks_recorded_at_free_contradict_the_captures_alloc_only_context() -> None:
    # torch's lab snapshot with stacks='python' was recorded with context='all'
    profile = core.trace_profile(
        _load(ASSETS / "snapshot_t211_stacks_python_expandable_oom.pickle")
    )
    assert profile["alloc_cpp_share"] == 0 and profile["frees_matched"] >= 20
    assert any(
        "context='alloc'" in p for p in core.claim_problems("capture_stacks", profile, 50_000)
    )


def test_capture_claim_holds_only_without_frames(captured_stacks: dict[str, Any]) -> None:
    bare = core.trace_profile(_without_frames(captured_stacks))
    assert core.claim_problems("capture", bare, 50_000) == []
    assert any("Python stacks" in p for p in core.claim_problems("capture_stacks", bare, 50_000))
    assert any(
        "no stacks" in p
        for p in core.claim_problems("capture", core.trace_profile(captured_stacks), 50_000)
    )


def test_the_ring_size_is_part_of_the_claim(captured_stacks: dict[str, Any]) -> None:
    bare = core.trace_profile(_without_frames(captured_stacks))
    assert any("ring of 1000" in p for p in core.claim_problems("capture", bare, 1000))


def test_off_claims_an_empty_trace_and_snapshot_markers_do_not_count(
    stacks_all: dict[str, Any],
) -> None:
    markers = [e for t in stacks_all["device_traces"] for e in t if e["action"] == "snapshot"]
    assert markers  # real markers, left by _snapshot() itself
    empty = {**stacks_all, "device_traces": [markers]}
    assert core.claim_problems("off", core.trace_profile(empty), 0) == []
    assert core.claim_problems("capture", core.trace_profile(empty), 50_000)


# ------------------------------------------------------------------------------ measurement


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """A loop whose step costs ``cost[variant]`` seconds of a fake clock and makes
    ``allocs`` allocations; records every call, so the tests can see where syncs happen."""

    name = "stand-in"

    def __init__(
        self,
        clock: FakeClock,
        cost: dict[str, float],
        allocs: int = 2000,
        profiles: dict[str, dict[str, Any]] | None = None,
        wobble: float = 0.0,
    ) -> None:
        self.clock = clock
        self.cost = cost
        self.allocs = allocs
        self.count = 0
        self.variant = "off"
        self.calls: list[str] = []
        self.profiles = profiles or {}
        self.wobble = wobble
        self.escalate_in: set[int] = set()
        self.blocks_done = 0

    def configure(self, variant: str) -> None:
        self.variant = variant
        self.calls.append(f"configure:{variant}")

    def step(self) -> None:
        # a slow drift and a wobble that every variant sees alike
        self.clock.now += self.cost[self.variant] * (1 + self.wobble * ((self.count % 7) - 3))
        self.clock.now += 1e-6 * (self.count // 1000)
        self.count += 1
        self.calls.append("step")

    def sync(self) -> None:
        self.calls.append("sync")

    def allocations(self) -> int:
        return self.count * self.allocs

    def inspect(self, variant: str) -> dict[str, Any]:
        self.calls.append(f"inspect:{variant}")
        return self.profiles[variant]

    def block_problem(self, variant: str) -> str | None:
        self.blocks_done += 1
        return "stacks turned on" if self.blocks_done in self.escalate_in else None


_PROFILES: dict[str, Any] = {}


def _honest_profiles(stacks_all: dict[str, Any], captured: dict[str, Any]) -> dict[str, Any]:
    """Each variant's profile, from a real snapshot of that kind."""
    if not _PROFILES:
        _PROFILES.update(
            off=core.trace_profile({"device_traces": [[]]}),
            capture=core.trace_profile(_without_frames(captured)),
            capture_stacks=core.trace_profile(captured),
            torch_defaults=core.trace_profile(stacks_all),
        )
    return dict(_PROFILES)


COST = {"off": 0.010, "capture": 0.0102, "capture_stacks": 0.012, "torch_defaults": 0.015}


def _measure(loop: StandIn, **kwargs: Any) -> Any:
    options = {
        "budget_s": 30.0,
        "block_s": 0.5,
        "min_rounds": 6,
        "max_entries": {"capture": 50_000, "capture_stacks": 50_000},
        "clock": loop.clock,
    }
    options.update(kwargs)
    return core.measure(loop, **options)


def test_known_costs_are_measured_per_variant_and_per_allocation(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    loop = StandIn(
        FakeClock(), COST, profiles=_honest_profiles(stacks_all, captured_stacks), wobble=0.02
    )
    summary = core.summarize(_measure(loop), min_allocations=1000)
    assert summary["problems"] == []
    variants = summary["variants"]
    for variant, cost in COST.items():
        if variant == "off":
            continue
        expected = cost / COST["off"] - 1
        assert variants[variant]["overhead"]["median"] == pytest.approx(expected, abs=0.01)
        q1, q3 = variants[variant]["overhead"]["q1"], variants[variant]["overhead"]["q3"]
        assert q1 <= variants[variant]["overhead"]["median"] <= q3
        per_alloc = (cost - COST["off"]) / 2000 * 1e6
        assert variants[variant]["us_per_allocation"] == pytest.approx(per_alloc, rel=0.15)
    assert summary["allocations_per_step"] == 2000
    lines = core.table(summary)
    assert any(line.strip().startswith("torch_defaults") and "+50" in line for line in lines)


def test_blocks_are_interleaved_rotated_calibrated_and_the_warmup_round_is_left_out(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    loop = StandIn(FakeClock(), COST, profiles=_honest_profiles(stacks_all, captured_stacks))
    m = _measure(loop, budget_s=20.0, block_s=0.3)
    # the slowest variant (15 ms) sets the block length: 0.3 s of it
    assert m.steps_per_block == 20
    assert {b.round for b in m.blocks} == set(range(1, m.rounds() + 1))
    firsts = [next(b.variant for b in m.blocks if b.round == r) for r in range(1, 5)]
    assert firsts == [core.rotation(r)[0] for r in range(1, 5)]
    assert len(set(firsts)) == 4
    # every variant was verified, in the warm-up round, before any timed block
    first_timed = loop.calls.index(
        "configure:" + core.rotation(1)[0], 1 + loop.calls.index("inspect:torch_defaults")
    )
    assert {c for c in loop.calls[:first_timed] if c.startswith("inspect:")} == {
        f"inspect:{v}" for v in core.VARIANTS
    }
    assert not any(c.startswith("inspect:") for c in loop.calls[first_timed:])
    # the budget bounds the timed rounds
    timed = sum(b.seconds_per_step * b.steps for b in m.blocks)
    assert timed <= 20.0 and m.rounds() >= 6


def test_nothing_but_steps_runs_between_a_blocks_two_synchronisations(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    loop = StandIn(FakeClock(), COST, profiles=_honest_profiles(stacks_all, captured_stacks))
    m = _measure(loop, budget_s=5.0, min_rounds=2)
    calls = loop.calls
    syncs = [i for i, c in enumerate(calls) if c == "sync"]
    timed_spans = [
        calls[a + 1 : b]
        for a, b in zip(syncs, syncs[1:], strict=False)
        if calls[a + 1 : b] and all(c == "step" for c in calls[a + 1 : b])
    ]
    assert len([s for s in timed_spans if len(s) == m.steps_per_block]) >= len(m.blocks)
    # and each configure is followed by its untimed warm-up steps before the first sync
    for i, c in enumerate(calls):
        if c.startswith("configure:") and i + 3 < len(calls):
            assert calls[i + 1 : i + 3] == ["step", "step"]


def test_a_variant_that_does_not_record_what_it_claims_makes_no_table(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    profiles = _honest_profiles(stacks_all, captured_stacks)
    profiles["torch_defaults"] = profiles["capture"]  # e.g. recording silently without stacks
    loop = StandIn(FakeClock(), COST, profiles=profiles)
    summary = core.summarize(_measure(loop))
    assert any(p.startswith("torch_defaults: claims C++ stacks") for p in summary["problems"])
    with pytest.raises(core.BenchError, match="torch_defaults"):
        core.table(summary)


def test_too_few_rounds_in_the_budget_is_an_error_not_a_table(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    loop = StandIn(FakeClock(), COST, profiles=_honest_profiles(stacks_all, captured_stacks))
    summary = core.summarize(_measure(loop, budget_s=1.0, block_s=1.0, min_rounds=6))
    assert summary["rounds"] < 6
    with pytest.raises(core.BenchError, match="timed rounds"):
        core.table(summary)


def test_a_loop_that_is_not_allocation_heavy_is_refused(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    loop = StandIn(
        FakeClock(), COST, allocs=300, profiles=_honest_profiles(stacks_all, captured_stacks)
    )
    summary = core.summarize(_measure(loop), min_allocations=1000)
    assert any("300 allocations per step" in p for p in summary["problems"])


def test_blocks_the_capture_changed_itself_are_left_out_and_too_many_are_an_error(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    profiles = _honest_profiles(stacks_all, captured_stacks)
    loop = StandIn(FakeClock(), COST, profiles=profiles)
    loop.escalate_in = {2}
    summary = core.summarize(_measure(loop))
    assert summary["problems"] == []
    assert sum(v["blocks"] for v in summary["variants"].values()) == len(summary["blocks"]) - 1
    loop = StandIn(FakeClock(), COST, profiles=profiles)
    loop.escalate_in = set(range(1, 400))
    summary = core.summarize(_measure(loop))
    assert any("did not run as" in p for p in summary["problems"])


def test_on_a_real_clock_a_known_extra_cost_is_found(
    stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> None:
    class Sleeper(StandIn):
        def step(self) -> None:
            time.sleep(self.cost[self.variant])
            self.count += 1

    cost = {"off": 0.002, "capture": 0.002, "capture_stacks": 0.002, "torch_defaults": 0.004}
    loop = Sleeper(FakeClock(), cost, profiles=_honest_profiles(stacks_all, captured_stacks))
    summary = core.summarize(
        core.measure(
            loop,
            budget_s=1.5,
            block_s=0.04,
            min_rounds=4,
            max_entries={"capture": 50_000, "capture_stacks": 50_000},
        )
    )
    assert summary["problems"] == []
    assert summary["variants"]["torch_defaults"]["overhead"]["median"] > 0.5
    assert abs(summary["variants"]["capture"]["overhead"]["median"]) < 0.25


def test_quartiles_of_known_values() -> None:
    assert core.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert core.quartiles([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(core.BenchError):
        core.quartiles([])


# ------------------------------------------------------------------------------ OOM records


def test_the_oom_record_is_read_from_a_real_events_file_and_a_cut_line_is_skipped(
    tmp_path: Path,
) -> None:
    events = next(CAPTURED.glob("*/rank0.events.jsonl")).read_text().splitlines()
    records = core.oom_events([*events, events[-1][: len(events[-1]) // 2]])
    assert len(records) == 1
    record = records[0]
    assert core.oom_problems("oom capture_stacks", record, stacks=True) == []
    assert any("had them on" in p for p in core.oom_problems("oom capture", record, stacks=False))
    no_snapshot = {k: v for k, v in record.items() if k != "snapshot"}
    assert any("no snapshot" in p for p in core.oom_problems("x", no_snapshot, stacks=True))
    assert core.oom_problems("x", None, stacks=False) == [
        "x: the OOM was raised but the capture recorded no out-of-memory"
    ]
    assert json.loads(json.dumps(record)) == record


def test_the_gpu_script_parses_the_drivers_arguments() -> None:
    bench = importlib.import_module("capture_overhead")
    args = bench.parse_args(["--mode", "zero3", "--out", "x", "--model-seconds", "55"])
    assert args.mode == "zero3" and args.model_seconds == 55.0 and not args.no_oom


# ------------------------------------------------------------------------------ the GPU side


class _Tensor:
    def __init__(self, owner: FakeTorch, size: int) -> None:
        self.owner, self.size = owner, size

    def __del__(self) -> None:
        self.owner.held -= self.size


class FakeTorch:
    """The few torch calls the benchmark and the capture make, with torch's semantics for
    what ``_record_memory_history`` records (``context=None``: no stacks whatever ``stacks``
    says; ``enabled=None``: off and cleared) and for an allocation the card cannot hold (the
    out-of-memory observers are called, then ``OutOfMemoryError`` is raised).  ``_snapshot``
    returns a real snapshot of the kind being recorded."""

    uint8 = "uint8"

    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self, snapshots: dict[str | None, dict[str, Any]], total: int) -> None:
        from types import SimpleNamespace

        self.snapshots = snapshots
        self.total = total
        self.held = 0
        self.mode: str | None = None
        self.observers: list[Any] = []
        self.allocated = 0
        self.calls: list[str] = []
        self.cuda = SimpleNamespace(
            memory=SimpleNamespace(_record_memory_history=self._record, _snapshot=self._snapshot),
            synchronize=lambda device=None: self.calls.append("sync"),
            memory_stats=lambda device=None: {"allocation.all.allocated": self.allocated},
            get_device_properties=lambda device: SimpleNamespace(total_memory=self.total),
            empty_cache=lambda: None,
            reset_peak_memory_stats=lambda device=None: None,
        )
        self._C = SimpleNamespace(
            _cuda_attach_out_of_memory_observer=self.observers.append,
            _cuda_getAllocatorBackend=lambda: "native",
        )

    def _record(
        self,
        enabled: Any = "all",
        context: Any = "all",
        stacks: str = "all",
        max_entries: int = sys.maxsize,
        **_: Any,
    ) -> None:
        if enabled is None:
            self.mode = None
        elif context is None:
            self.mode = "capture"
        elif context == "alloc" and stacks == "python":
            self.mode = "capture_stacks"
        elif context == "all" and stacks == "all":
            self.mode = "torch_defaults"
        else:
            raise AssertionError(f"unexpected recording {enabled, context, stacks}")
        self.calls.append(f"record:{self.mode}:{max_entries}")

    def _snapshot(self) -> dict[str, Any]:
        return self.snapshots[self.mode]

    def empty(self, size: int, dtype: Any = None, device: Any = None) -> _Tensor:
        if self.held + size > self.total:
            for observer in self.observers:
                observer(0, size, self.total, self.total - self.held)
            raise self.OutOfMemoryError("CUDA out of memory.")
        self.held += size
        return _Tensor(self, size)

    def step(self) -> None:
        self.allocated += 2000
        self.calls.append("step")


@pytest.fixture
def gpu_side(
    tmp_path: Path, stacks_all: dict[str, Any], captured_stacks: dict[str, Any]
) -> tuple[Any, FakeTorch, Any]:
    """The GPU script's loop driver and the capture's real recorder on a FakeTorch."""
    from oomlens.capture.gpu import GpuRecorder
    from oomlens.capture.recorder import Recorder
    from oomlens.capture.settings import resolve

    bench = importlib.import_module("capture_overhead")
    fake = FakeTorch(
        {
            None: {"device_traces": [[]], "segments": []},
            "capture": _without_frames(captured_stacks),
            "capture_stacks": captured_stacks,
            "torch_defaults": stacks_all,
        },
        total=9 * bench.OOM_CHUNK + 12345,
    )
    settings = resolve(
        {"directory": str(tmp_path), "run": "bench", "sentinel": False, "snapshot_every_s": 0},
        env={},
    )
    recorder = Recorder(settings)  # not begun: no thread, no hooks in the test process
    gpu = GpuRecorder(
        fake,
        settings,
        recorder.emit,
        recorder.sample,
        recorder._write_snapshot,
        recorder.flush,
        recorder.pid,
    )
    recorder.gpu = gpu
    gpu._on_cuda_init()
    assert gpu.cuda_ready and gpu.history and not gpu.stacks
    loop = bench.TorchLoop("model", fake, recorder, 0, fake.step)
    return bench, fake, loop


def test_the_gpu_loop_driver_records_each_variant_as_claimed(
    gpu_side: tuple[Any, FakeTorch, Any],
) -> None:
    bench, fake, loop = gpu_side
    clock = FakeClock()
    original_step = loop._step

    def timed_step() -> None:
        original_step()
        clock.now += {
            "off": 0.01,
            "capture": 0.0101,
            "capture_stacks": 0.011,
            "torch_defaults": 0.013,
        }[loop.variant]

    loop._step = timed_step
    summary = core.summarize(
        core.measure(
            loop,
            budget_s=10.0,
            block_s=0.2,
            min_rounds=4,
            clock=clock,
            max_entries={"capture": 50_000, "capture_stacks": 50_000},
        ),
        min_allocations=1000,
    )
    assert summary["problems"] == []
    assert summary["allocations_per_step"] == 2000
    assert summary["verified"]["torch_defaults"]["capture_state"]["history"] is False
    assert "record:torch_defaults:100000" in fake.calls
    assert "record:capture:50000" in fake.calls and "record:capture_stacks:50000" in fake.calls


def test_a_capture_that_turns_stacks_on_by_itself_spoils_the_block(
    gpu_side: tuple[Any, FakeTorch, Any],
) -> None:
    _, _, loop = gpu_side
    loop.configure("capture")
    assert loop.block_problem("capture") is None
    loop.recorder.gpu._set_history(stacks=True, reason="pressure")
    assert loop.block_problem("capture") == "the capture had stacks on"
    loop.configure("torch_defaults")
    assert loop.block_problem("torch_defaults") is None


def test_the_oom_measurement_provokes_real_oom_paths_and_reads_back_the_snapshot(
    gpu_side: tuple[Any, FakeTorch, Any], tmp_path: Path
) -> None:
    bench, fake, loop = gpu_side
    rows, problems = bench.measure_ooms(fake, loop.recorder, loop, 2000, tmp_path)
    assert problems == []
    assert [r["variant"] for r in rows] == ["capture", "capture_stacks", "torch_defaults"]
    for row in rows:
        assert row["filled_bytes"] == 9 * bench.OOM_CHUNK
        assert row["failure_to_disk_seconds"] is not None
        assert row["snapshot_bytes"] > 0
    capture, stacks, defaults = rows
    assert capture["trace"]["entries_with_frames"] == 0
    assert stacks["trace"]["alloc_frames_share"] > 0.5
    assert defaults["trace"]["alloc_cpp_share"] == 1.0
    assert capture["snapshot_file_bytes"] == capture["snapshot_bytes"]
    assert not list(tmp_path.glob("torch_defaults_oom.pickle"))  # measured, then removed
    assert fake.held == 0  # the filled memory was given back
    # the ring was filled by training steps before each OOM
    assert capture["fill_steps"] == 14 and defaults["fill_steps"] == 28
    disk = bench.disk_per_rank(loop.recorder)
    assert "rank0.snapshot.pickle" in disk["files"] and disk["total"] <= disk["budget"]


def test_an_oom_the_capture_did_not_record_is_an_error(
    gpu_side: tuple[Any, FakeTorch, Any], tmp_path: Path
) -> None:
    bench, fake, loop = gpu_side
    fake.observers.clear()  # as if the observer had never been attached
    rows, problems = bench.measure_ooms(fake, loop.recorder, loop, 2000, tmp_path)
    assert "oom capture: the OOM was raised but the capture recorded no out-of-memory" in problems
    assert "oom torch_defaults: the benchmark's observer was not called" not in problems


# ------------------------------------------------------------------------------ the driver


FAKE_BENCH = """
import json, sys, time, pathlib
args = sys.argv[1:]
mode, out = args[args.index("--mode") + 1], pathlib.Path(args[args.index("--out") + 1])
if mode == "torch" and "{hang}" == "yes":
    time.sleep(60)
cap = out / "bench-capture" / f"bench-{{mode}}"
cap.mkdir(parents=True, exist_ok=True)
(cap / "rank0.events.jsonl").write_text("{{}}\\n")
(cap / "rank0.snapshot.pickle").write_bytes(b"x" * 100)
(out / f"overhead_{{mode}}.json").write_text(json.dumps({{"mode": mode, "argv": args}}))
print("table of", mode)
"""


def _driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hang: bool, *argv: str) -> Any:
    driver = importlib.import_module("run_capture_bench")
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE_BENCH.format(hang="yes" if hang else "no"))
    monkeypatch.setattr(driver, "BENCH", script)
    monkeypatch.setattr(driver, "T0", time.monotonic())
    monkeypatch.setattr(
        sys,
        "argv",
        ["run_capture_bench.py", "--wheels", str(tmp_path), "--out", str(tmp_path / "out"), *argv],
    )
    return driver


def test_the_driver_bundles_at_most_eight_files_without_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tarfile

    driver = _driver(tmp_path, monkeypatch, False, "--skip-zero3")
    assert driver.main() == 0
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_torch.log", "capture_bench.json", "capture_dirs.tar.gz", "progress.log"]
    result = json.loads((out / "capture_bench.json").read_text())
    assert result["torch"]["mode"] == "torch" and result["zero3"] is None
    assert result["driver"]["zero3_skipped"] == "--skip-zero3"
    with tarfile.open(out / "capture_dirs.tar.gz") as tar:
        names = tar.getnames()
    assert "bench-capture/bench-torch/rank0.events.jsonl" in names
    assert not any(n.endswith(".pickle") for n in names)


def test_the_driver_kills_a_hung_bench_and_skips_zero3_without_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = _driver(tmp_path, monkeypatch, True, "--deadline-s", "3")
    started = time.monotonic()
    assert driver.main() == 1
    assert time.monotonic() - started < 20
    result = json.loads((tmp_path / "out" / "capture_bench.json").read_text())
    assert result["torch"] is None and result["driver"]["torch_rc"] != 0
    assert "left after the torch loops" in result["driver"]["zero3_skipped"]
    assert "killed at its timeout" in (tmp_path / "out" / "progress.log").read_text()
