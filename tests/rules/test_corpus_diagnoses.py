"""The analyzer on the real corpus: the right verdict and top diagnosis for every case, from
everything a case left behind, and from its logs alone (what `oomlens analyze run.log` sees)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.report import Report
from oomlens.session import analyze
from tests._corpus import case_dir, case_names, manifest


def _accepts(report: Report, expected: dict[str, object]) -> bool:
    top = report.top
    wanted = expected["diagnosis"]
    if wanted is None:
        return top is None or top.id == "config_hazard"
    acceptable = {wanted, *expected.get("acceptable", [])}  # type: ignore[misc]
    return top is not None and top.id in acceptable


@pytest.mark.parametrize("name", case_names())
def test_every_input_of_a_case_gives_the_expected_verdict_and_cause(name: str) -> None:
    expected = manifest(name)["expected"]
    report = analyze([case_dir(name)])
    assert report.verdict.value == expected["verdict"], report.verdict_reason
    assert _accepts(report, expected), [(d.id, d.confidence) for d in report.diagnoses]
    top = report.top  # never a cause whose own main evidence is against it
    assert top is None or not top.evidence or top.evidence[0].supports, top
    if expected["diagnosis"] is not None:
        assert report.top is not None and report.top.confidence >= 0.6


@pytest.mark.parametrize("name", case_names())
def test_logs_alone_give_the_expected_verdict_and_cause(name: str) -> None:
    m = manifest(name)
    expected = m["expected"]["log_only"]
    logs = [case_dir(name) / "train.log"]
    logs += [case_dir(name) / p for p in m["files"].get("rank_logs", []) if p.endswith(".log")]
    report = analyze(logs)
    assert report.verdict.value == expected["verdict"], report.verdict_reason
    assert _accepts(report, expected), [(d.id, d.confidence) for d in report.diagnoses]


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in case_names()
        if manifest(n)["expected"]["failed_ranks"]
        and manifest(n)["expected"]["verdict"] != "no_failure"
    ],
)
def test_the_first_failed_rank_is_one_that_really_failed(name: str) -> None:
    m = manifest(name)
    report = analyze([case_dir(name)])
    first = report.facts.ranks.first_failed
    assert first is not None
    assert first.rank in m["expected"]["failed_ranks"]


@pytest.mark.parametrize("name", case_names())
def test_every_cited_source_exists_and_fixes_never_repeat_the_config(name: str) -> None:
    report = analyze([case_dir(name)])
    for diagnosis in report.diagnoses:
        for item in diagnosis.evidence:
            if item.source is not None:
                assert Path(item.source.path).exists(), item.source
        effective = report.facts.config.reading.effective if report.facts.config else None
        if effective is None:
            continue
        in_force = {v.key_path.rsplit(".", 1)[-1]: v.value for v in effective.all_values()}
        for fix in diagnosis.fixes:
            for key, value in _leaves(fix.config_patch or {}):
                assert in_force.get(key, object()) != value, (diagnosis.id, key, value)


def _micro_batch_1(name: str) -> bool:
    config = case_dir(name) / "ds_config.json"
    return (
        config.exists()
        and json.loads(config.read_text()).get("train_micro_batch_size_per_gpu") == 1
    )


@pytest.mark.parametrize("name", [n for n in case_names() if _micro_batch_1(n)])
def test_no_fix_halves_a_micro_batch_that_is_already_1(name: str) -> None:
    report = analyze([case_dir(name)])
    effective = report.facts.config.reading.effective if report.facts.config else None
    assert effective is not None and effective.batch.micro_batch_per_gpu.value == 1
    for diagnosis in report.diagnoses:
        for fix in diagnosis.fixes:
            said = f"{fix.summary} {fix.command or ''}".lower()
            assert "micro batch" not in said and "batch_size n/2" not in said, (diagnosis.id, said)
            patch = fix.config_patch or {}
            assert patch.get("train_micro_batch_size_per_gpu", 1) >= 1


def _leaves(patch: object, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(patch, dict):
        found = []
        for key, value in patch.items():
            found += _leaves(value, key)
        return found
    return [(prefix, patch)]


def test_a_snapshot_alone_still_gives_a_diagnosis() -> None:
    report = analyze([case_dir("fragmentation") / "snapshot_rank0.pickle"])
    assert report.verdict.value == "gpu_oom"
    assert report.diagnoses


def test_host_memory_comes_from_deepspeeds_cpu_line_when_not_given() -> None:
    from oomlens.session import AnalysisOptions, gather_facts

    facts = gather_facts([case_dir("memory_leak")])
    # "CPU Virtual Memory: used = U GB, percent = P%" is node-wide: the 256 GiB VM
    assert facts.host_memory is not None
    assert 240 * 1024**3 < facts.host_memory < 270 * 1024**3
    assert "see_memory_usage" in facts.host_memory_origin
    given = gather_facts([case_dir("memory_leak")], options=AnalysisOptions(host_memory=1024**3))
    assert given.host_memory == 1024**3 and given.host_memory_origin == "--host-memory"
