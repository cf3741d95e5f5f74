"""The capture directory as an input kind: its files recognised by their header line (before
the JSON kinds: a capture file with nothing after its header is a JSON object), each file read
on its own and the two files of one process joined in the run's facts whichever of them are
given; the layout rules that name a capture's files and a SLURM job's capture directory agree
with what the capture writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.capture import naming
from oomlens.capture.settings import CaptureSettings
from oomlens.capture.writer import JsonLines, Stop
from oomlens.facts.capture import CaptureEnd
from oomlens.ingest import kinds
from oomlens.ingest.detect import detect_kind, discover_run
from oomlens.ingest.layout import CAPTURE_DIR, capture_process, capture_run_names
from oomlens.session import gather_facts
from tests._corpus import CORPUS_DIR

CAPTURED = CORPUS_DIR / "memory_leak_captured" / "oomlens-capture"


def _run_dir() -> Path:
    (run,) = CAPTURED.iterdir()
    return run


def test_a_capture_file_with_nothing_but_its_header_is_a_capture_file(tmp_path: Path) -> None:
    path = tmp_path / "rank0.events.jsonl"
    writer = JsonLines(str(path), {"file": "events", "run": "r", "rank": 0}, 10**6, Stop())
    writer.close()
    assert json.loads(path.read_text())  # the whole file is one JSON object
    detection = detect_kind(path)
    assert detection.kind is kinds.kind("capture")
    assert detection.reason == "an oomlens capture file (its header line)"


def test_the_files_of_a_real_capture_directory_are_found_by_content() -> None:
    found = {Path(f.path).name: f.kind.id for f in discover_run(_run_dir()).files}
    assert found == {
        "rank0.events.jsonl": "capture",
        "rank0.series.jsonl": "capture",
        "rank0.snapshot.pickle": "snapshot_pickle",
    }


@pytest.mark.parametrize(
    "given", [("events", "series"), ("series", "events"), ("events",), ("series",)]
)
def test_one_process_whichever_of_its_files_are_given(given: tuple[str, ...]) -> None:
    run = _run_dir()
    facts = gather_facts([run / f"rank0.{name}.jsonl" for name in given])
    (capture,) = facts.captures
    assert capture.rank == 0 and capture.world_size == 1
    listed = {Path(i.path).name: i for i in facts.inputs}
    assert {i.kind for i in listed.values()} == {"capture"}
    if "events" in given:
        assert capture.path == str(run / "rank0.events.jsonl")
        assert capture.end is CaptureEnd.EXCEPTION and capture.oom_events
        assert listed["rank0.events.jsonl"].detail == "capture of rank 0, ended: exception"
    else:
        # a series alone tells that the process existed and what it held, not how it ended
        assert capture.end is CaptureEnd.VANISHED and not capture.oom_events
    if "series" in given:
        assert capture.series_path == str(run / "rank0.series.jsonl")
        assert capture.memory is not None and capture.memory.total_samples > 30
        assert capture.memory.origin == "capture"
        assert listed["rank0.series.jsonl"].detail.startswith("capture series: ")
    else:
        assert capture.memory is None and capture.series_path is None


def test_the_joined_process_is_what_its_directory_gives() -> None:
    run = _run_dir()
    by_directory = gather_facts([run]).captures
    by_files = gather_facts([run / "rank0.series.jsonl", run / "rank0.events.jsonl"]).captures
    assert by_files == by_directory


def test_capture_files_of_one_process_share_their_process_and_others_do_not() -> None:
    run = _run_dir()
    events, series = run / "rank0.events.jsonl", run / "rank0.series.jsonl"
    assert capture_process(str(events)) == capture_process(str(series)) == str(run / "rank0")
    assert capture_process(str(run / "rank1-restart2-pid77.series.jsonl")) == str(
        run / "rank1-restart2-pid77"
    )
    assert capture_process(str(run / "rank0.snapshot.pickle")) is None
    assert capture_process(str(run / "rank0.events.jsonl.gz")) is None


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_ID": "41"},
        {"SLURM_JOB_ID": "57", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7"},
    ],
)
def test_the_slurm_directory_the_readers_look_for_is_the_one_the_capture_writes(
    env: dict[str, str],
) -> None:
    written, _ = naming.run_name(naming.identity(env), env)
    looked_for = capture_run_names(
        env["SLURM_JOB_ID"], env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    )
    assert looked_for[0] == written
    assert CAPTURE_DIR == CaptureSettings().directory
