"""The corpus' captured crashes (``<case>_captured``, ``"captured": true``): real crashes run
again under ``oomlens capture`` on the GPU machine.  From the capture directory alone, and from
the whole case folder, oomlens must name the cause at confidence >= 0.8 and ask for nothing the
capture could have recorded.

They are produced by ``fixtures/crash_logs/_scenarios/run_capture.py`` (one GPU call, on a
2-GPU machine or, with one rank per job and budgets calibrated in the call, on a 1-GPU one) and
assembled by ``collect_captured.py``; until then these tests skip, saying so.  The expectations
are the same on either machine; each manifest says which machine and how many ranks it had.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.report import Report
from oomlens.rules.common.advice import (
    CAPTURE_CONFIG,
    CAPTURE_KERNEL,
    CAPTURE_MEMORY_SERIES,
    CAPTURE_SNAPSHOT,
)
from oomlens.session import analyze
from tests._corpus import CORPUS_DIR, manifest

CAPTURED = (
    "fragmentation_captured",
    "prefetch_overshoot_captured",
    "memory_leak_captured",
    "pinned_memory_exhaustion_captured",
)
RECORDABLE = (CAPTURE_SNAPSHOT, CAPTURE_MEMORY_SERIES, CAPTURE_CONFIG, CAPTURE_KERNEL)
"""What the capture records: none of it may be asked for again."""
RECORDABLE_WORDS = ("snapshot", "memory after every step", "ds_config", "kernel log", "OOM message")


def _case(name: str) -> Path:
    path = CORPUS_DIR / name
    if not (path / "case.json").exists():
        pytest.skip(
            f"{name} not produced yet: run fixtures/crash_logs/_scenarios/run_capture.py on a "
            "1- or 2-GPU machine and collect_captured.py here (see run_capture.py's docstring)"
        )
    return path


CAPTURE_BUDGET_KNOB = "OOMLENS_CAPTURE_MAX_MB"


def _asks_for_nothing_recordable(report: Report) -> None:
    """Nothing the capture records is asked for again, and nothing is asked by hand: where the
    capture's own budget cut what it kept (the fixtures ran with 3 MB to stay small), the only
    request allowed names the capture's setting to raise."""
    by_hand = [m for m in report.missing if "_record_memory_history" in m]
    assert not by_hand, by_hand
    rest = [m for m in report.missing if CAPTURE_BUDGET_KNOB not in m]
    asked = [m for m in rest if m in RECORDABLE]
    asked += [m for m in rest if any(w in m for w in RECORDABLE_WORDS)]
    assert not asked, asked


def _names_the_cause(report: Report, expected: dict[str, object]) -> None:
    assert report.verdict.value == expected["verdict"], report.verdict_reason
    top = report.top
    assert top is not None
    acceptable = {expected["diagnosis"], *expected.get("acceptable", [])}  # type: ignore[misc]
    assert top.id in acceptable, [(d.id, d.confidence) for d in report.diagnoses]
    assert top.confidence >= 0.8, [(d.id, d.confidence) for d in report.diagnoses]


@pytest.mark.parametrize("name", CAPTURED)
def test_the_capture_directory_alone_names_the_cause(name: str) -> None:
    case = _case(name)
    m = manifest(name)
    assert m["captured"] is True
    report = analyze([case / "oomlens-capture"])
    _names_the_cause(report, m["expected"])
    _asks_for_nothing_recordable(report)
    assert report.facts.captures
    if m["expected"]["verdict"] == "gpu_oom":
        assert report.facts.snapshots, "the capture's snapshot at the OOM"
    if m["expected"]["verdict"] == "host_oom":
        assert report.facts.captured_kills() or report.facts.kernel_oom_kills()


@pytest.mark.parametrize("name", CAPTURED)
def test_the_whole_case_names_the_cause(name: str) -> None:
    case = _case(name)
    report = analyze([case])
    _names_the_cause(report, manifest(name)["expected"])
    _asks_for_nothing_recordable(report)


@pytest.mark.parametrize("name", CAPTURED)
def test_the_capture_stayed_within_its_budget(name: str) -> None:
    case = _case(name)
    capture = case / "oomlens-capture"
    for run in capture.iterdir():
        ranks: dict[str, int] = {}
        for path in run.iterdir():
            prefix = path.name.split(".", 1)[0]
            ranks[prefix] = ranks.get(prefix, 0) + path.stat().st_size
        # the fixtures ran with OOMLENS_CAPTURE_MAX_MB=3
        assert all(size <= 3 * 2**20 + 64 * 1024 for size in ranks.values()), ranks


def test_captured_cases_declare_themselves_and_the_machine_they_ran_on() -> None:
    for path in sorted(CORPUS_DIR.glob("*_captured")):
        m = manifest(path.name)
        assert m.get("captured") is True, path.name
        machine = m["machine"]
        assert machine["gpus"] in (1, 2) and 1 <= machine["ranks"] <= machine["gpus"]
        assert f"{machine['gpus']}x" in m["generated_by"]
        ranks = {r["rank"] for r in m["measured"]["capture"]["ranks"]} - {None}  # None: python
        assert ranks <= set(range(machine["ranks"])), (path.name, ranks)
        if machine["gpus"] == 1 and m["launcher"] == "deepspeed":
            # one rank: the budget or the host cap was calibrated in the same call
            assert "--num_gpus 1 " in m["command"] and m["measured"]["calibration"]


def test_a_history_the_capture_cut_asks_for_the_capture_budget_not_a_recording_by_hand() -> None:
    """fragmentation_captured kept only the newest trace entries within its 3 MB budget: the
    replay of expandable segments cannot run from the start, and the report says which capture
    setting would have kept the whole history."""
    report = analyze([_case("fragmentation_captured")])
    fragmentation = next(d for d in report.diagnoses if d.id == "fragmentation")
    assert any(CAPTURE_BUDGET_KNOB in m and "18,438" in m for m in fragmentation.missing), (
        fragmentation.missing
    )
