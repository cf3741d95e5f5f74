"""The replay held to real GPU runs: for each family in ``fixtures/whatif/``, the prediction made
from the one recorded run must give every other run's real outcome (and the step it ran out
at) with a peak reserved within 5 % of torch's own ``max_memory_reserved``.

An OOM is checked at the request: where the run kept its own recording, the predicted OOM must
be the request the run ran out on (the same ordinal among the allocations, the same rounded
size; the workloads are deterministic, so every run asks for the same sequence), and the step
named by the recording's ``user_metadata`` must be the step the run died in.

The fixtures come from one GPU session (``fixtures/whatif/_scenarios/run_whatif.py``, then
``collect.py``); until they are collected those tests skip.  The driver and collect step
themselves are exercised here without a GPU, with a model-backed stand-in for the per-run child.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oomlens.analysis.whatif import parse_alloc_conf, run_whatif
from oomlens.analysis.whatif.allocator_model import CachingAllocatorModel, Limit
from oomlens.ingest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "fixtures" / "whatif"
SCENARIOS = FIXTURES / "_scenarios"
PEAK_TOLERANCE = 0.05
FAMILIES = (
    "expandable_limit",
    "expandable_rescues",
    "live_too_large",
    "rounding",
    "rounding_wide",
    "small_pool",
    "split_carve",
    "transformer",
    "two_stream",
)


def family_folders(root: Path) -> list[Path]:
    return sorted(path.parent for path in root.glob("*/case.json"))


def step_at(trace: list[Any], index: int) -> str | None:
    """The workload step of ``trace[index]``.  torch keeps the metadata per thread
    (``DeviceCachingAllocator::user_metadata`` is ``static thread_local``), so what autograd
    allocates and frees on its own device thread during ``backward()`` carries none: such an
    entry belongs to the step labelled last before it."""
    for position in range(index, -1, -1):
        label = trace[position].get("user_metadata")
        if label:
            return str(label)
    return None


def allocations_before(trace: list[Any], index: int) -> int:
    return sum(1 for entry in trace[:index] if entry["action"] == "alloc")


def real_oom(folder: Path, run: dict[str, Any]) -> tuple[int, int] | None:
    """The run's own OOM as (allocations served before it, rounded request), from the run's
    recording; None where it kept none or it shows no OOM."""
    if not run.get("snapshot"):
        return None
    own = load_snapshot(folder / run["snapshot"]).raw.device_traces[0]
    index = next((i for i, entry in enumerate(own) if entry["action"] == "oom"), None)
    if index is None:
        return None
    return allocations_before(own, index), int(own[index]["size"])


def check_family(folder: Path) -> list[str]:
    """Every disagreement between the predictions from ``folder``'s recording and its runs."""
    case = json.loads((folder / "case.json").read_text())
    snapshot = load_snapshot(folder / "snapshot.pickle")
    trace = snapshot.raw.device_traces[0]
    # Steps are told apart by the entries' user_metadata (torch.cuda.memory._set_memory_metadata).
    labelled = any(entry.get("user_metadata") for entry in trace)
    problems = []
    runs: list[dict[str, Any]] = [case["recorded"], *case["runs"]]
    for run in runs:
        if run.get("outcome") is None:
            continue
        conf = parse_alloc_conf(run["alloc_conf"] or "")
        whatif = run_whatif(snapshot, [conf], allowed=run["allowed_bytes"])
        if not whatif.self_check.passed:
            problems.append(f"self-check failed: {whatif.self_check.first_mismatch}")
            break
        prediction = next(
            item
            for item in whatif.predictions
            if parse_alloc_conf(item.alloc_conf).canonical() == conf.canonical()
        )
        result = prediction.result
        name = f"{folder.name}/{run['run']} ({run['alloc_conf'] or 'defaults'}, "
        name += f"{run['allowed_bytes']} bytes)"
        if not prediction.conclusive:
            problems.append(f"{name}: not a forecast: {'; '.join(prediction.notes)}")
        if result.outcome != run["outcome"]:
            problems.append(f"{name}: predicted {result.outcome}, ran {run['outcome']}")
            continue
        if result.outcome == "oom" and result.oom_event_index is not None:
            index = result.oom_event_index
            if labelled:
                step = step_at(trace, index) if index >= 0 else None
                if step != run["oom_step"]:
                    problems.append(
                        f"{name}: predicted the OOM at {step!r}, ran out at {run['oom_step']!r}"
                    )
            ran_out = real_oom(folder, run)
            if ran_out is not None and index >= 0 and result.oom_request_bytes is not None:
                rounded = CachingAllocatorModel(conf, Limit()).round_size(result.oom_request_bytes)
                predicted = (allocations_before(trace, index), rounded)
                if predicted != ran_out:
                    problems.append(
                        f"{name}: predicted the OOM after {predicted[0]} allocations asking "
                        f"{predicted[1]} bytes, the run after {ran_out[0]} asking {ran_out[1]}"
                    )
        real = run["max_memory_reserved"]
        if abs(result.peak_reserved_bytes - real) > PEAK_TOLERANCE * real:
            problems.append(
                f"{name}: predicted peak reserved {result.peak_reserved_bytes}, real {real}"
            )
    for index, run in enumerate(case["runs"], start=1):
        if not run.get("snapshot"):
            continue
        own = load_snapshot(folder / run["snapshot"])
        check = run_whatif(own, []).self_check
        if not check.passed:
            problems.append(f"{folder.name}/run {index}: self-check failed: {check.first_mismatch}")
    return problems


GPU_FAMILIES = family_folders(FIXTURES)


@pytest.mark.skipif(
    not GPU_FAMILIES,
    reason="the GPU validation fixtures are not collected yet: run "
    "fixtures/whatif/_scenarios/run_whatif.py on a GPU, then collect.py (see "
    "fixtures/whatif/README.md)",
)
@pytest.mark.parametrize("folder", GPU_FAMILIES, ids=[path.name for path in GPU_FAMILIES])
def test_predictions_match_the_real_runs(folder: Path) -> None:
    assert check_family(folder) == []


@pytest.mark.skipif(not GPU_FAMILIES, reason="the GPU validation fixtures are not collected yet")
def test_every_family_of_the_issue_is_there() -> None:
    names = {path.name for path in GPU_FAMILIES}
    assert set(FAMILIES) <= names
    outcomes = {
        run["outcome"]
        for path in GPU_FAMILIES
        for run in json.loads((path / "case.json").read_text())["runs"]
    }
    assert outcomes == {"oom", "fits"}


def test_driver_and_collect_without_a_gpu(tmp_path: Path) -> None:
    """The driver, the bundle and collect.py, with the model standing in for the GPU: the
    families come out complete and the predictions agree with the stand-in's runs."""
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            str(SCENARIOS / "run_whatif.py"),
            "--out",
            str(out),
            "--jobs",
            "2",
            "--child",
            str(Path(__file__).with_name("fake_run_one.py")),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert sorted(path.name for path in out.iterdir()) == [
        "DONE",
        "progress.log",
        "results.json",
        "snapshots.tar",
    ]
    dest = tmp_path / "fixtures"
    collected = subprocess.run(
        [sys.executable, str(SCENARIOS / "collect.py"), str(out), "--dest", str(dest)],
        capture_output=True,
        text=True,
    )
    assert collected.returncode == 0, collected.stderr
    folders = family_folders(dest)
    assert tuple(path.name for path in folders) == FAMILIES
    for folder in folders:
        assert check_family(folder) == []
    case = json.loads((dest / "expandable_rescues" / "case.json").read_text())
    assert case["recorded"]["outcome"] == "oom"
    assert {run["outcome"] for run in case["runs"]} == {"oom", "fits"}


@pytest.mark.skipif(not GPU_FAMILIES, reason="the GPU validation fixtures are not collected yet")
@pytest.mark.parametrize("folder", GPU_FAMILIES, ids=[path.name for path in GPU_FAMILIES])
def test_each_run_shows_the_limit_it_ran_under(folder: Path) -> None:
    """The limit inferred from each run's own recording brackets the exact ``allowed`` bytes it
    ran under, wherever the recording hit its limit (with expandable segments, too: the
    fraction is checked against the segment asked for, not the pages mapped)."""
    case = json.loads((folder / "case.json").read_text())
    bracketed = 0
    for run in [case["recorded"], *case["runs"]]:
        if not run.get("snapshot"):
            continue
        whatif = run_whatif(load_snapshot(folder / run["snapshot"]), [])
        limit = whatif.recorded_limit
        if limit.bytes is None:
            assert run["outcome"] == "fits", run["run"]
            continue
        assert limit.source == "allowed", run["run"]
        assert abs(limit.bytes - run["allowed_bytes"]) <= limit.uncertainty, run["run"]
        bracketed += 1
    assert bracketed or all(run["outcome"] == "fits" for run in case["runs"])


@pytest.mark.skipif(not GPU_FAMILIES, reason="the GPU validation fixtures are not collected yet")
def test_the_whatif_docs_show_the_agreement_as_it_is() -> None:
    spec = importlib.util.spec_from_file_location("agreement", SCENARIOS / "agreement.py")
    assert spec is not None and spec.loader is not None
    agreement = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agreement)
    table = agreement.table(FIXTURES)
    assert table.count("\n") >= len(GPU_FAMILIES) + 2
    assert table in (ROOT / "docs" / "whatif.md").read_text()
