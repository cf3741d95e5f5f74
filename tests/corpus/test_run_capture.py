"""The CPU side of ``fixtures/crash_logs/_scenarios/run_capture.py``, the one GPU call that
makes the captured fixtures: how it counts GPUs, the budgets and the host cap it derives from
calibration runs, the one-GPU plan's order and overlaps (with the runs themselves faked), the
memory-cgroup calibration and kill with real CPU processes, and what collect_captured.py
writes into a one-GPU manifest.  The GPU runs themselves are the coordinator's."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests._corpus import CORPUS_DIR

SCENARIOS = CORPUS_DIR / "_scenarios"
GIB = 2**30


def _module(name: str) -> ModuleType:
    if str(SCENARIOS) not in sys.path:
        sys.path.insert(0, str(SCENARIOS))
    return importlib.import_module(name)


@pytest.fixture
def drv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """run_capture with its run_corpus state pointed at a scratch directory."""
    module = _module("run_capture")
    rc = module.rc
    monkeypatch.setattr(rc, "WORK", tmp_path / "work")
    monkeypatch.setattr(rc, "OUT", tmp_path / "out", raising=False)
    monkeypatch.setattr(rc, "DEADLINE", time.time() + 600)
    monkeypatch.setattr(rc, "OVERRUN_S", 60)
    monkeypatch.setattr(rc, "BUILD", None)
    monkeypatch.setattr(rc, "kmsg_mark", lambda text: None)
    monkeypatch.setattr(module, "CALIBRATED", {})
    monkeypatch.setattr(module, "MACHINE", {"gpus": 1, "ranks_per_job": 1})
    (tmp_path / "work" / "runs").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    return module


# ----------------------------------------------------------------------------- counting GPUs


def test_gpus_are_counted_from_nvidia_smi_list_lines_not_from_mig_devices(
    drv: ModuleType,
) -> None:
    one = "GPU 0: NVIDIA H200 (UUID: GPU-0f6c2b7e-1d3a-4c55-9a1e-2b9c1d0e7f10)\n"
    two = one + "GPU 1: NVIDIA H200 (UUID: GPU-7a1d9e44-55c2-4b6f-8d0a-3c2e9f1b6a21)\n"
    mig = one + "  MIG 3g.71gb     Device  0: (UUID: MIG-3e1f0a9b-2c4d-5e6f-7a8b-9c0d1e2f3a4b)\n"
    assert drv.parse_gpu_list(one) == 1
    assert drv.parse_gpu_list(two) == 2
    assert drv.parse_gpu_list(mig) == 1
    assert drv.parse_gpu_list("NVIDIA-SMI has failed because it couldn't communicate") == 0


# ----------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("peak_gib", [6.9, 9.3, 11.02])
def test_the_leak_budget_leaves_about_three_gib_above_the_measured_peak(
    drv: ModuleType, peak_gib: float
) -> None:
    peak = int(peak_gib * GIB)
    budget, how = drv.leak_budget(peak)
    assert peak + 3 * GIB <= budget * GIB < peak + 3.25 * GIB
    assert (budget * 4) == int(budget * 4)  # quarter GiB steps
    assert str(peak) in how


def test_without_a_calibration_peak_the_leak_gets_the_fallback_and_says_so(
    drv: ModuleType,
) -> None:
    budget, how = drv.leak_budget(None)
    assert budget == drv.LEAK_FALLBACK_GIB and "no peak" in how


@pytest.mark.parametrize(
    ("peak_gib", "expected"),
    [
        (4.8, 5.55),  # the peak + 0.75 GiB
        (6.8, 7.15),  # the midpoint to what the raised settings gather (7.42 GiB)
    ],
)
def test_the_prefetch_budget_lies_between_the_defaults_peak_and_the_whole_model_gathered(
    drv: ModuleType, peak_gib: float, expected: float
) -> None:
    peak = int(peak_gib * GIB)
    budget, how = drv.prefetch_budget(peak)
    assert budget == expected
    assert peak < budget * GIB < drv.PREFETCH_GATHER_BYTES
    assert str(peak) in how and "may not fail" not in how


def test_a_defaults_peak_at_the_whole_model_is_said_to_leave_no_overshoot_and_none_a_fallback(
    drv: ModuleType,
) -> None:
    budget, how = drv.prefetch_budget(int(7.5 * GIB))
    assert budget * GIB > 7.5 * GIB and "may not fail" in how
    budget, how = drv.prefetch_budget(None)
    assert budget == 6.25 and "no peak" in how


def test_the_host_cap_goes_between_the_unreclaimable_peaks_when_pinning_costs_more(
    drv: ModuleType,
) -> None:
    pinned = {"peak_unreclaimable_sampled": 20_000_000_000, "peak_bytes": 22_000_000_000}
    unpinned = {"peak_unreclaimable_sampled": 17_000_000_000, "peak_bytes": 19_500_000_000}
    cap, how = drv.pinned_cap(pinned, unpinned)
    assert cap == 18_500_000_000
    assert "anon + shmem" in how and "20000000000" in how


def test_close_peaks_cap_the_host_below_the_pinned_peak_and_say_the_unpinned_was_close(
    drv: ModuleType,
) -> None:
    cap, how = drv.pinned_cap(
        {"peak_unreclaimable_sampled": 20_000_000_000},
        {"peak_unreclaimable_sampled": 19_400_000_000},
    )
    assert cap == 18_000_000_000 and "90%" in how and "19400000000" in how


def test_when_only_memory_peak_tells_them_apart_the_cap_goes_between_those(
    drv: ModuleType,
) -> None:
    cap, how = drv.pinned_cap(
        {"peak_unreclaimable_sampled": 12 * 10**9, "peak_bytes": 24 * 10**9},
        {"peak_unreclaimable_sampled": 17 * 10**9, "peak_bytes": 20 * 10**9},
    )
    assert cap == 22 * 10**9 and "memory.peak" in how


def test_without_samples_the_cap_uses_memory_peak_and_without_a_pinned_peak_none(
    drv: ModuleType,
) -> None:
    cap, how = drv.pinned_cap({"peak_bytes": 24_000_000_000}, {"peak_bytes": 20_000_000_000})
    assert cap == 22_000_000_000 and "memory.peak" in how
    assert drv.pinned_cap({}, {"peak_bytes": 1})[0] is None


# ----------------------------------------------------------------------------- the one-GPU plan


class FakeRuns:
    """Stands in for run_corpus.run_case: records each call and writes what a real run leaves
    (run.json; peak files for calibrations; a cgroup record for the pinned runs)."""

    PEAKS = {"leak_calibration": int(9.4 * GIB), "prefetch_calibration": int(5.6 * GIB)}
    CGROUPS = {
        "pinned_calibration": {"peak_unreclaimable_sampled": 20 * 10**9, "peak_bytes": 22 * 10**9},
        "unpinned_calibration": {
            "peak_unreclaimable_sampled": 17 * 10**9,
            "peak_bytes": 19 * 10**9,
        },
    }

    def __init__(self, rc: ModuleType) -> None:
        self.rc = rc
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(
        self,
        name: str,
        command: str,
        timeout: float,
        env_extra: dict[str, str] | None = None,
        cgroup: bool = False,
        cgroup_max: int | None = None,
        ds_config: str | None = None,
        gpus: str = "0,1",
        note: str = "",
    ) -> dict[str, Any]:
        start = time.monotonic()
        time.sleep(0.15)
        case = self.rc.WORK / "runs" / name
        case.mkdir(parents=True, exist_ok=True)
        if name in self.PEAKS:
            (case / "peak_0.json").write_text(
                json.dumps({"max_memory_reserved": 0, "max_memory_allocated": self.PEAKS[name]})
            )
        info: dict[str, Any] = {
            "case": name,
            "command": command,
            "env": dict(env_extra or {}),
            "exit_code": 0 if "calibration" in name else 1,
        }
        if cgroup:
            info["cgroup"] = dict(self.CGROUPS.get(name, {}))
            if cgroup_max:
                info["cgroup"]["memory.events"] = "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n"
        (case / "run.json").write_text(json.dumps(info))
        with self.lock:
            self.calls.append(
                {
                    "name": name,
                    "command": command,
                    "env": dict(env_extra or {}),
                    "cgroup": cgroup,
                    "cgroup_max": cgroup_max,
                    "ds_config": ds_config,
                    "gpus": gpus,
                    "note": note,
                    "start": start,
                    "end": time.monotonic(),
                }
            )
        return info

    def by_name(self) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.calls}


def _run_one_gpu_plan(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch, enforced: bool = True
) -> tuple[FakeRuns, dict[str, Any], list[str]]:
    fake = FakeRuns(drv.rc)
    monkeypatch.setattr(drv.rc, "run_case", fake)
    benches: list[str] = []

    def bench(ds: str, mode: str, out_dir: Path) -> dict[str, str]:
        benches.append(mode)
        fake.calls.append({"name": f"bench_{mode}", "start": time.monotonic()})
        return {"mode": mode}

    monkeypatch.setattr(drv, "bench", bench)
    drv.CALIBRATED["cgroup_enforced"] = (enforced, "probe")
    results: dict[str, Any] = {}
    wanted = [
        "fragmentation",
        "memory_leak",
        "bench_torch",
        "bench_zero3",
        "prefetch_overshoot",
        "pinned_memory_exhaustion",
    ]
    drv.one_gpu_plan("/venv/bin/deepspeed", wanted, results, drv.rc.OUT)
    return fake, results, benches


def test_one_gpu_plan_runs_one_rank_jobs_with_the_capture_only_on_the_fixture_runs(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, results, benches = _run_one_gpu_plan(drv, monkeypatch)
    runs = fake.by_name()
    fixtures = {"memory_leak", "prefetch_overshoot", "pinned_memory_exhaustion"}
    calibrations = {
        "leak_calibration",
        "prefetch_calibration",
        "pinned_calibration",
        "unpinned_calibration",
    }
    assert fixtures | calibrations <= set(runs)
    for name in fixtures | calibrations:
        run = runs[name]
        assert "--num_gpus 1 " in run["command"] and run["gpus"] == "0", name
        assert ("--module oomlens.capture" in run["command"]) == (name in fixtures), name
        assert (run["env"].get("OOMLENS_CAPTURE_DIR") == f"runs/{name}/oomlens-capture") == (
            name in fixtures
        )
        assert (SCENARIOS / "configs" / run["ds_config"]).is_file()
    assert "--model 3.5b" in runs["prefetch_overshoot"]["command"]
    assert runs["prefetch_overshoot"]["ds_config"] == "prefetch_overshoot_offload.json"
    assert runs["prefetch_calibration"]["ds_config"] == "prefetch_fits_offload.json"
    assert "--keep-logits" in runs["memory_leak"]["command"]
    assert "--keep-logits" not in runs["leak_calibration"]["command"]
    assert benches == ["torch", "zero3"] and set(results) == {"torch", "zero3"}


def test_one_gpu_budgets_come_from_the_calibrations_and_land_in_run_json(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, _, _ = _run_one_gpu_plan(drv, monkeypatch)
    runs = fake.by_name()
    leak_budget, _ = drv.leak_budget(FakeRuns.PEAKS["leak_calibration"])
    prefetch_budget, _ = drv.prefetch_budget(FakeRuns.PEAKS["prefetch_calibration"])
    assert runs["memory_leak"]["env"]["EMULATE_GPU_MEMORY_GIB"] == str(leak_budget)
    assert runs["prefetch_overshoot"]["env"]["EMULATE_GPU_MEMORY_GIB"] == str(prefetch_budget)
    pinned = runs["pinned_memory_exhaustion"]
    assert pinned["cgroup"] and pinned["cgroup_max"] == 18_500_000_000
    assert pinned["ds_config"] == "offload_pinned.json"
    assert runs["pinned_calibration"]["cgroup"] and not runs["pinned_calibration"]["cgroup_max"]
    for name, key in (
        ("memory_leak", "budget_gib"),
        ("prefetch_overshoot", "budget_gib"),
        ("pinned_memory_exhaustion", "cap_bytes"),
    ):
        info = json.loads((drv.rc.WORK / "runs" / name / "run.json").read_text())
        assert info["machine"] == {"gpus": 1, "ranks_per_job": 1}
        assert info["calibration"][key]
    pinned_info = json.loads(
        (drv.rc.WORK / "runs" / "pinned_memory_exhaustion" / "run.json").read_text()
    )
    assert pinned_info["calibration"]["oom_kills"] == 1


def test_a_capped_run_the_kernel_did_not_kill_runs_once_more_under_a_lower_cap(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FirstSurvives(FakeRuns):
        capped = 0

        def __call__(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            info = super().__call__(name, *args, **kwargs)
            if kwargs.get("cgroup_max"):
                self.capped += 1
                if self.capped == 1:
                    info["cgroup"]["memory.events"] = "max 0\noom 0\noom_kill 0\n"
            return info

    fake = FirstSurvives(drv.rc)
    monkeypatch.setattr(drv.rc, "run_case", fake)
    drv.CALIBRATED["cgroup_enforced"] = (True, "probe")
    drv.pinned_one_gpu("/venv/bin/deepspeed")
    caps = [c["cgroup_max"] for c in fake.calls if c["cgroup_max"]]
    assert caps == [18_500_000_000, 17_000_000_000]  # between the peaks; 85% of the pinned one
    info = json.loads((drv.rc.WORK / "runs" / "pinned_memory_exhaustion" / "run.json").read_text())
    assert [a["oom_kills"] for a in info["calibration"]["attempts"]] == [0, 1]
    assert info["calibration"]["cap_bytes"] == 17_000_000_000
    assert drv.retry_cap({"peak_unreclaimable_sampled": 10}, 5) is None


def test_gpu_oom_fixtures_run_alone_and_the_calibrations_overlap(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, _, _ = _run_one_gpu_plan(drv, monkeypatch)
    runs = fake.by_name()

    def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return bool(a["start"] < b["end"] and b["start"] < a["end"])

    timed = [c for c in fake.calls if "end" in c]
    for alone in ("memory_leak", "prefetch_overshoot"):
        others = [c for c in timed if c["name"] != alone]
        assert not any(overlaps(runs[alone], c) for c in others), alone
    stage = ["pinned_calibration", "unpinned_calibration", "pinned_memory_exhaustion"]
    assert overlaps(runs["prefetch_calibration"], runs["pinned_calibration"])
    assert all(runs[n]["env"]["OMP_NUM_THREADS"] == "6" for n in stage)
    assert runs["prefetch_calibration"]["env"]["OMP_NUM_THREADS"] == "10"
    order = [c["name"] for c in sorted(fake.calls, key=lambda c: c["start"])]
    assert order.index("leak_calibration") < order.index("memory_leak")
    assert order.index("memory_leak") < order.index("prefetch_calibration")
    assert order.index("pinned_calibration") < order.index("pinned_memory_exhaustion")
    last_stage = max(runs[n]["end"] for n in [*stage, "prefetch_calibration"])
    assert runs["prefetch_overshoot"]["start"] >= last_stage
    assert order[-2:] == ["bench_torch", "bench_zero3"]


def test_where_cgroups_do_not_enforce_the_host_case_is_skipped_and_the_rest_runs(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, results, _ = _run_one_gpu_plan(drv, monkeypatch, enforced=False)
    names = set(fake.by_name())
    assert not names & {"pinned_calibration", "unpinned_calibration", "pinned_memory_exhaustion"}
    assert {"memory_leak", "prefetch_overshoot"} <= names and set(results) == {"torch", "zero3"}
    assert "skipped, memory cgroups do not enforce" in (drv.rc.OUT / "progress.log").read_text()


def _fake_main(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpus: int
) -> tuple[FakeRuns, Path]:
    fake = FakeRuns(drv.rc)
    monkeypatch.setattr(drv.rc, "run_case", fake)
    monkeypatch.setattr(drv.rc, "install_deepspeed", lambda wheels: "/venv/bin/deepspeed")
    monkeypatch.setattr(drv.rc, "collect_env", lambda ds: {"gpus": ["NVIDIA H200"] * gpus})
    monkeypatch.setattr(drv, "count_gpus", lambda: gpus)
    monkeypatch.setattr(drv, "cgroup_enforced", lambda: (True, "probe"))
    monkeypatch.setattr(drv, "bench", lambda ds, mode, out_dir: {"mode": mode})
    monkeypatch.setattr(drv, "start_cpu_adam_build", lambda out, jobs: None)
    monkeypatch.setattr(drv.rc, "T0", time.time())
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["run_capture.py", "--wheels", ".wheels", "--out", str(out)])
    drv.main()
    return fake, out


def test_on_two_gpus_main_runs_the_cases_as_the_corpus_did(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake, out = _fake_main(drv, monkeypatch, tmp_path, gpus=2)
    runs = fake.by_name()
    assert set(runs) == {
        "fragmentation",
        "memory_leak",
        "prefetch_overshoot",
        "pinned_memory_exhaustion",
    }
    assert drv.rc.DEADLINE == pytest.approx(drv.rc.T0 + 6.3 * 60) and drv.rc.OVERRUN_S == 75
    for name, budget in (("memory_leak", "8"), ("prefetch_overshoot", "6.75")):
        assert "--num_gpus 2 " in runs[name]["command"]
        assert "--module oomlens.capture" in runs[name]["command"]
        assert runs[name]["env"]["EMULATE_GPU_MEMORY_GIB"] == budget
    assert "--model 1.3b" in runs["prefetch_overshoot"]["command"]
    assert runs["pinned_memory_exhaustion"]["cgroup_max"] == drv.PINNED_CAP_BYTES
    assert "gpus: 2 (two-GPU plan)" in (out / "progress.log").read_text()


def test_main_picks_the_one_gpu_plan_and_leaves_the_files_the_call_returns(
    drv: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake, out = _fake_main(drv, monkeypatch, tmp_path, gpus=1)
    assert drv.MACHINE == {"gpus": 1, "ranks_per_job": 1}
    assert drv.rc.DEADLINE == pytest.approx(drv.rc.T0 + 7.2 * 60)
    assert drv.rc.OVERRUN_S == 100
    assert {"fragmentation", "memory_leak", "prefetch_overshoot"} <= set(fake.by_name())
    env = json.loads((out / "env.json").read_text())
    assert env["gpu_count"] == 1 and env["cgroup_memory_enforced"] == [True, "probe"]
    assert json.loads((out / "bench.json").read_text()) == {
        "torch": {"mode": "torch"},
        "zero3": {"mode": "zero3"},
    }
    assert (out / "DONE").exists() and (out / "capture_runs.tar.gz").stat().st_size > 0
    assert len(list(out.iterdir())) <= 8
    assert "gpus: 1 (one-GPU plan)" in (out / "progress.log").read_text()


def test_the_scenario_model_knows_the_one_gpu_overshoot_size(drv: ModuleType) -> None:
    pytest.importorskip("torch")
    model = _module("model")
    config = model.GPTConfig.named("3.5b")
    config.seq_len = 512
    params = config.num_params()
    assert params == drv.PREFETCH_PARAMS
    # the 1e10 knobs gather it all in 16 bits; the defaults at most 1e9 parameters
    assert 2 * params / GIB > 2 * 1e9 / GIB + 4


# ----------------------------------------------------------------------------- real cgroups

HOLD = textwrap.dedent(
    """
    import mmap, os, sys, time
    anon_mb, shmem_mb = int(sys.argv[1]), int(sys.argv[2])
    anon = bytearray(anon_mb << 20)
    for offset in range(0, anon_mb << 20, 4096):
        anon[offset] = 1
    fd = os.memfd_create("pinned-like")
    os.ftruncate(fd, max(1, shmem_mb) << 20)
    shared = mmap.mmap(fd, max(1, shmem_mb) << 20)
    for offset in range(0, shmem_mb << 20, 4096):
        shared[offset] = 1
    time.sleep(1.5)
    print("held", anon_mb, shmem_mb, flush=True)
    """
)


def _memory_cgroups_writable(drv: ModuleType) -> bool:
    if os.geteuid() != 0:
        return False
    cg = drv.rc.cgroup_create(f"probe-{os.getpid()}")
    if cg is None:
        return False
    cg.remove()
    return True


def test_the_probe_finds_that_this_kernel_enforces_memory_cgroups(drv: ModuleType) -> None:
    if not _memory_cgroups_writable(drv):
        pytest.skip("needs root and a writable memory cgroup controller")
    enforced, why = drv.cgroup_enforced()
    assert enforced, why
    assert "oom_kill" in why


def test_pinned_like_shmem_is_sampled_the_cap_goes_between_and_the_capped_run_is_killed(
    drv: ModuleType, tmp_path: Path
) -> None:
    """The one-GPU pinned branch with CPU processes: a 'pinned' process (anon + shmem, as
    cudaHostAlloc'd buffers are) and an 'unpinned' one (the same bytes, fewer of them
    unreclaimable) run uncapped in cgroups; the cap between their sampled peaks kills the
    first when it runs again."""
    if not _memory_cgroups_writable(drv):
        pytest.skip("needs root and a writable memory cgroup controller")
    script = drv.rc.WORK / "hold.py"
    script.write_text(HOLD)
    py = sys.executable
    pinned = drv.rc.run_case("pinned_like", f"{py} hold.py 120 200", 60, cgroup=True, gpus="")
    unpinned = drv.rc.run_case("unpinned_like", f"{py} hold.py 200 0", 60, cgroup=True, gpus="")
    assert pinned["exit_code"] == 0 and unpinned["exit_code"] == 0
    p, u = (
        pinned["cgroup"]["peak_unreclaimable_sampled"],
        unpinned["cgroup"]["peak_unreclaimable_sampled"],
    )
    assert p >= 300 * 2**20 and 200 * 2**20 <= u < p
    cap, how = drv.pinned_cap(pinned["cgroup"], unpinned["cgroup"])
    assert u < cap < p, how
    capped = drv.rc.run_case(
        "pinned_like_capped", f"{py} hold.py 120 200", 60, cgroup=True, cgroup_max=cap, gpus=""
    )
    assert capped["exit_code"] in (-9, 137), capped
    events = capped["cgroup"].get("memory.events") or capped["cgroup"].get("memory.oom_control")
    assert drv.events_count(events, "oom_kill") >= 1


# ----------------------------------------------------------------------------- the manifests


def _one_gpu_run(tmp_path: Path, case: str, log_from: str, **run: Any) -> Path:
    run_dir = tmp_path / "runs" / case
    run_dir.mkdir(parents=True)
    shutil.copy(CORPUS_DIR / log_from / "train.log", run_dir / "train.log")
    shutil.copy(CORPUS_DIR / log_from / "ds_config.json", run_dir / "ds_config.json")
    info = {
        "case": case,
        "command": f"EMULATE_GPU_MEMORY_GIB=12.5 /venv/bin/deepspeed --num_gpus 1 --master_port "
        f"29531 --module oomlens.capture train_zero3.py --out-dir runs/{case}",
        "cwd": "/home/user/llm-train",
        "env": {"EMULATE_GPU_MEMORY_GIB": "12.5"},
        "exit_code": 1,
        "wall_seconds": 61.0,
        "note": "one GPU, one rank; budget 12.5 GiB = ...",
        "machine": {"gpus": 1, "ranks_per_job": 1},
        "calibration": {"run": "leak_calibration", "budget_gib": 12.5},
        **run,
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


ENV = {"gpus": ["NVIDIA H200"], "gpu_count": 1, "torch": "2.11.0+cu130"}


def test_a_one_gpu_manifest_says_which_machine_how_many_ranks_and_how_the_budget_was_set(
    tmp_path: Path,
) -> None:
    collect_captured = _module("collect_captured")
    # a real log of the leak (two ranks; its OOM messages are what the collector reads)
    run_dir = _one_gpu_run(tmp_path, "memory_leak", "memory_leak")
    m = collect_captured.collect("memory_leak", run_dir, ENV, tmp_path / "dest")
    assert m is not None and m["captured"] is True
    assert m["machine"] == {"gpus": 1, "gpu": "NVIDIA H200", "ranks": 1}
    assert "one GPU (one rank" in m["scenario"]
    assert "1x NVIDIA H200" in m["generated_by"] and "one-GPU plan" in m["generated_by"]
    assert m["measured"]["calibration"] == {"run": "leak_calibration", "budget_gib": 12.5}
    assert "12.5 GiB" in m["emulation"] and "one rank" in m["emulation"]
    assert m["expected"]["verdict"] == "gpu_oom" and m["expected"]["phase"] is None
    assert (tmp_path / "dest" / "memory_leak_captured" / "case.json").exists()


def test_runs_that_did_not_crash_as_the_case_needs_are_not_made_into_fixtures(
    tmp_path: Path,
) -> None:
    collect_captured = _module("collect_captured")
    healthy = _one_gpu_run(tmp_path, "prefetch_overshoot", "prefetch_fits")
    assert collect_captured.collect("prefetch_overshoot", healthy, ENV, tmp_path / "d") is None
    unkilled = _one_gpu_run(
        tmp_path,
        "pinned_memory_exhaustion",
        "offload_pinned_uncapped",
        cgroup={"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"},
    )
    collected = collect_captured.collect("pinned_memory_exhaustion", unkilled, ENV, tmp_path / "d")
    assert collected is None
    assert not (tmp_path / "d").exists()
