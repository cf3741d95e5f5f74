"""The registry of input kinds: one module per kind, found without being listed; a new kind
(here a stand-in for a run manifest) is recognised by content, read, and its facts reach
the run's facts through its slot, with nothing else changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from oomlens.epilog.settings import EpilogSettings
from oomlens.facts.inputs import InputFacts
from oomlens.ingest import kinds
from oomlens.ingest.detect import accept, detect_kind
from oomlens.ingest.kinds import FoundInput, InputKind, Reading, ReadOptions, Sample
from oomlens.ingest.layout import Location
from oomlens.session import analyze, gather_facts
from oomlens.triage.walk import log_by_name
from tests._corpus import case_dir

BUILT_IN = {
    "training_log",
    "elastic_error",
    "kernel_log",
    "snapshot_pickle",
    "ds_config",
    "capture",
}


def test_every_module_of_the_package_is_a_registered_kind() -> None:
    modules = {
        p.stem
        for p in Path(kinds.__file__).parent.glob("*.py")
        if p.stem not in ("__init__", "base")
    }
    assert {type(k).__module__.rsplit(".", 1)[-1] for k in kinds.KINDS} == modules
    assert {k.id for k in kinds.KINDS} == BUILT_IN
    # orders are total: no two kinds tie for reading or recognising
    assert len({k.order for k in kinds.KINDS}) == len({k.precedence for k in kinds.KINDS})
    assert len({k.order for k in kinds.KINDS}) == len(kinds.KINDS)
    assert [k.order for k in kinds.KINDS] == sorted(k.order for k in kinds.KINDS)


def test_slots_of_the_built_in_kinds_are_fields_of_the_input_facts() -> None:
    fields = set(InputFacts.__dataclass_fields__)
    assert {k.slot for k in kinds.KINDS} <= fields


def test_name_hints_are_used_by_the_tools_that_pick_files_by_name() -> None:
    # the epilog's default work-directory patterns are the kinds' names
    assert EpilogSettings().patterns_in_force() == kinds.workdir_patterns()
    assert "ds_config*.json" in kinds.workdir_patterns()
    assert kinds.kind_by_name("snapshot_rank3.pickle") is kinds.kind("snapshot_pickle")
    # triage leaves kernel logs named as such to their content
    assert log_by_name("kernel.log") is None and log_by_name("dmesg.log.gz") is None
    assert log_by_name("train.log") is True


def test_a_quiet_text_file_is_a_log_only_when_named_placed_or_called_one(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet"
    quiet.write_text("all good\n")
    detection = detect_kind(quiet)
    assert detection.kind is None and detection.plain_text
    assert accept(detection) is None
    log = kinds.kind("training_log")
    for accepted in (
        accept(detection, named_by_user=True),
        accept(detection, where=Location(rank=3)),
        accept(detection, name="job.out.gz"),
    ):
        assert accepted is not None and accepted[0] is log
    binary = tmp_path / "blob"
    binary.write_bytes(bytes(range(256)) * 64)
    assert accept(detect_kind(binary), named_by_user=True) is None


class _ManifestKind(InputKind):
    """A stand-in for a new kind: a JSON manifest that a launcher would write."""

    id: ClassVar[str] = "run_manifest"
    label: ClassVar[str] = "a run manifest"
    slot: ClassVar[str] = "manifests"
    precedence: ClassVar[int] = 16
    order: ClassVar[int] = 60
    reader: ClassVar[str] = "json"
    json_document: ClassVar[bool] = True

    def recognise(self, sample: Sample) -> str | None:
        data = sample.json_object
        return "JSON with a run_manifest version" if data and "run_manifest" in data else None

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        data = json.loads(Path(found.path).read_text())
        return Reading((data,), f"manifest of {data['command']}")


def test_a_new_kind_is_one_module_and_its_facts_reach_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a run directory with a new kind of file next to a real crash's log
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_bytes((case_dir("fragmentation") / "train.log").read_bytes())
    (run / "manifest.json").write_text(json.dumps({"run_manifest": 1, "command": "train.py"}))
    before = detect_kind(run / "manifest.json")
    assert before.kind is None and "neither" in before.reason  # unknown JSON without the kind
    # WHEN the kind is registered (what its module's KIND does)
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, _ManifestKind()))
    facts = gather_facts([run])
    # THEN it is recognised, read, listed and its facts are in the run's facts under its slot
    assert facts.other_inputs["manifests"] == ({"run_manifest": 1, "command": "train.py"},)
    listed = {Path(i.path).name: i for i in facts.inputs}
    assert listed["manifest.json"].kind == "run_manifest"
    assert listed["manifest.json"].detail == "manifest of train.py"
    # and the analysis of the rest is what it was
    with_kind, without = analyze([run]).top, analyze([case_dir("fragmentation") / "train.log"]).top
    assert with_kind is not None and without is not None
    assert (with_kind.id, with_kind.confidence) == (without.id, without.confidence)
