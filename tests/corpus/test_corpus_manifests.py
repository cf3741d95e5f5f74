"""The corpus is complete and self-consistent: every later test trusts these manifests."""

from __future__ import annotations

import re

import pytest

from oomlens.ingest.snapshot import load_snapshot
from tests._corpus import (
    ASKED_FOR,
    CORPUS_DIR,
    DIAGNOSES,
    VERDICTS,
    case_dir,
    case_names,
    manifest,
)

REQUIRED = (
    "case",
    "scenario",
    "command",
    "cwd",
    "launcher",
    "environment",
    "emulation",
    "exit_code",
    "versions",
    "files",
    "expected",
    "why",
    "measured",
)


def test_corpus_has_every_scenario_the_issue_asks_for() -> None:
    expected_ids = {manifest(c)["expected"]["diagnosis"] for c in case_names()}
    assert ASKED_FOR - {"host_oom_killed"} <= expected_ids
    assert any(manifest(c)["expected"]["verdict"] == "no_failure" for c in case_names())
    launchers = {manifest(c)["launcher"] for c in case_names()}
    assert {"deepspeed", "torchrun"} <= launchers


def test_corpus_stays_small() -> None:
    total = sum(p.stat().st_size for p in CORPUS_DIR.rglob("*") if p.is_file())
    assert total < 20 * 1024 * 1024
    for pickle_file in CORPUS_DIR.rglob("*.pickle"):
        assert pickle_file.stat().st_size < 2 * 1024 * 1024, pickle_file


@pytest.mark.parametrize("name", case_names())
def test_manifest_is_complete(name: str) -> None:
    m = manifest(name)
    missing = [k for k in REQUIRED if k not in m]
    assert not missing, missing
    assert m["case"] == name
    expected = m["expected"]
    assert expected["verdict"] in VERDICTS
    assert expected["diagnosis"] is None or expected["diagnosis"] in DIAGNOSES
    assert set(expected["acceptable"]) <= DIAGNOSES
    assert expected["log_only"]["verdict"] in VERDICTS
    assert set(expected["log_only"].get("acceptable", [])) <= DIAGNOSES
    assert m["versions"]["torch"].startswith("2.11")
    assert "H200" in m["versions"]["nvidia_smi"]
    # a run that failed has a non-zero exit code, a healthy one exits 0
    assert (m["exit_code"] == 0) == (expected["verdict"] == "no_failure")
    if expected["verdict"] == "no_failure":
        assert expected["diagnosis"] is None


@pytest.mark.parametrize("name", case_names())
def test_listed_files_exist_and_logs_are_the_launchers_output(name: str) -> None:
    m = manifest(name)
    for value in m["files"].values():
        for rel in value if isinstance(value, list) else [value]:
            assert (case_dir(name) / rel).is_file(), rel
    log = (case_dir(name) / "train.log").read_text(errors="replace")
    assert log.strip(), "empty log"
    # the first line is the launcher's (nothing was prepended)
    first = log.splitlines()[0]
    if m["launcher"] == "deepspeed":
        assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(INFO|WARNING)\]", first), (
            first
        )


@pytest.mark.parametrize("name", case_names())
def test_gpu_oom_cases_carry_the_oom_message_numbers(name: str) -> None:
    m = manifest(name)
    ooms = m["measured"]["oom_messages_by_rank"]
    log = "".join(p.read_text(errors="replace") for p in case_dir(name).rglob("*.log"))
    if m["expected"]["verdict"] != "gpu_oom":
        # only a run that caught its OOMs and went on to finish printed OOM numbers
        assert not ooms or (m["exit_code"] == 0 and "Tried to allocate" in log)
        return
    if "Tried to allocate" not in log:
        # a driver-level or cudaMallocAsync message: no caching-allocator numbers to record
        assert not ooms
        return
    assert ooms
    for numbers in ooms.values():
        assert numbers["tried_to_allocate"] > 0
        assert numbers["total_capacity"] > numbers["allocated_by_pytorch"]
    assert m["expected"]["failed_ranks"] == sorted(int(r) for r in ooms)


@pytest.mark.parametrize("name", case_names())
def test_snapshots_load_through_the_safe_loader_with_one_oom_entry(name: str) -> None:
    m = manifest(name)
    for snap_meta in m["measured"]["snapshots"]:
        snap = load_snapshot(case_dir(name) / snap_meta["file"], freeze_gc=False)
        assert snap.source.rank == int(
            snap_meta["file"].removeprefix("snapshot_rank").split(".")[0]
        )
        oom_entries = [e for t in snap.raw.device_traces for e in t if e["action"] == "oom"]
        assert len(oom_entries) == 1
        assert oom_entries[0]["size"] == snap_meta["oom_entry"]["size"]
