"""``oomlens whatif``: the table, the JSON document, and one error line with a documented exit
code for bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oomlens.cli import main
from tests.analysis.whatif._recording import MiB, record, rounds, write
from tests.cli._terminal import on_terminal

ROOT = Path(__file__).resolve().parents[2]
FRAGMENTATION = ROOT / "fixtures" / "crash_logs" / "fragmentation" / "snapshot_rank0.pickle"
STATE_ONLY = ROOT / "tests" / "assets" / "snapshots" / "snapshot_t211_enabled_state.pickle"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["whatif", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture(scope="module")
def rescued(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run recorded from its start that runs out of a 1 GiB limit by fragmentation."""
    path = tmp_path_factory.mktemp("whatif") / "snapshot.pickle"
    recorded, step = record(rounds(15), allowed=1024 * MiB)
    assert step == "final"
    write(recorded, path)
    return path


def test_the_default_ladder_as_a_table(capsys: pytest.CaptureFixture[str], rescued: Path) -> None:
    code, out, err = run(capsys, str(rescued))
    assert code == 0 and err == ""
    assert "self-check: passed" in out
    assert "events from the process start (the whole run)" in out
    rows = {
        line.split("  ")[0]: line
        for line in out.splitlines()
        if line.startswith(("torch", "exp", "max", "gar"))
    }
    assert "OOM at event" in rows["torch defaults (as recorded)"]
    assert "fits with" in rows["expandable_segments:True"]
    assert rows["expandable_segments:True"].rstrip().endswith("yes")
    assert set(rows) >= {"max_split_size_mb:64", "garbage_collection_threshold:0.6"}


def test_json_predictions_under_another_limit(
    capsys: pytest.CaptureFixture[str], rescued: Path
) -> None:
    code, out, _ = run(
        capsys,
        str(rescued),
        "--alloc-conf",
        "expandable_segments:True",
        "--allowed",
        "700MiB",
        "--format",
        "json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["recorded"]["outcome"] == "oom"
    assert document["recorded"]["self_check"]["passed"] is True
    baseline, expandable = document["predictions"]
    assert baseline["baseline"] and baseline["alloc_conf"] == ""
    # 15 kept 40 MiB tensors + 120 MiB need 720 MiB: over a 700 MiB card whatever the setting.
    assert expandable["allowed_bytes"] == 700 * MiB
    assert expandable["outcome"] == "oom" and expandable["live_too_large"] is True
    for key in (
        "alloc_conf",
        "allowed_bytes",
        "outcome",
        "peak_reserved_bytes",
        "peak_allocated_bytes",
        "oom_request_bytes",
        "covers",
        "self_check",
    ):
        assert key in expandable


def test_a_mid_run_corpus_recording_says_it_is_not_a_forecast(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, str(FRAGMENTATION), "--alloc-conf", "expandable_segments:True")
    assert code == 0
    assert "events from mid-run" in out and "self-check: passed" in out
    assert "not a forecast where:" in out and "before the recording decides" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--alloc-conf", "expandable:True"], 2, "Unrecognized key 'expandable'"),
        (["--alloc-conf", "max_split_size_mb:8"], 2, "must be >= 20"),
        (["--allowed", "lots"], 2, "lots"),
        (["--device", "3"], 3, "device 3 has no recorded allocations"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    capsys: pytest.CaptureFixture[str], rescued: Path, args: list[str], code: int, message: str
) -> None:
    got, out, err = run(capsys, str(rescued), *args)
    assert got == code and out == ""
    # Option values refused by click come after its usage lines, as for every command.
    assert message in err.strip().splitlines()[-1]


def test_a_snapshot_without_history_or_a_missing_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, str(STATE_ONLY))
    assert code == 3 and "no allocation history" in err and "_record_memory_history" in err
    code, _, err = run(capsys, str(tmp_path / "missing.pickle"))
    assert code == 3 and "missing.pickle" in err


def test_a_damaged_trace_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import pickle

    recorded, _ = record(rounds(3), allowed=1024 * MiB)
    data = recorded.snapshot()
    trace = data["device_traces"][0]
    index = next(i for i, entry in enumerate(trace) if entry["action"] == "alloc")
    trace[index]["size"] = "64MiB"
    path = tmp_path / "damaged.pickle"
    path.write_bytes(pickle.dumps(data))
    code, out, err = run(capsys, str(path))
    assert code == 3 and out == ""
    assert f"device_traces[0][{index}].size is a str, not an int" in err
    assert len(err.strip().splitlines()) == 1


def test_fitting_only_up_to_the_recorded_oom_says_the_rest_is_unknown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # prefetch_overshoot's lab run needed 8.02 GiB against its 6.75 GiB cap: no allocator
    # setting saves it, yet expandable segments "fit, forecast yes" (the failing request would
    # have been served, with 14 MiB left) and nothing said the recording ends there.
    snapshot = ROOT / "fixtures" / "crash_logs" / "prefetch_overshoot" / "snapshot_rank0.pickle"
    code, out, _ = run(capsys, str(snapshot))
    assert code == 0
    assert "fits with 14.00 MiB to spare (up to the recorded OOM)" in out
    assert "whether the rest of the run fits is not known" in out
    assert "the least room left was 14.00 MiB" in out


def test_a_request_larger_than_the_card_is_said_to_be_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # torch 2.11's snapshot of a 1 TiB request with 174 MiB in use: "the memory in use itself
    # is too large" and "the device was full", with 138.82 GiB free.
    sample = ROOT.parent / "shared" / "samples" / "snapshot_t211_stacks_all_oom.pickle"
    if not sample.is_file():
        pytest.skip(f"{sample} is not there")
    code, out, _ = run(capsys, str(sample))
    assert code == 0
    assert "OOM at event 178 (1.00 TiB request): the request alone is larger than the limit" in out
    assert "in use itself is too large" not in out and "device was full" not in out


def test_an_output_file_ending_json_gets_json(
    capsys: pytest.CaptureFixture[str], rescued: Path, tmp_path: Path
) -> None:
    # as analyze picks the format from -o's extension; whatif wrote text into w.json
    target = tmp_path / "w.json"
    assert run(capsys, str(rescued), "-o", str(target))[0] == 0
    assert json.loads(target.read_text())["schema_version"]
    text = tmp_path / "w.txt"
    assert run(capsys, str(rescued), "-o", str(text))[0] == 0
    assert text.read_text().startswith("oomlens whatif:")


_RAW_BYTES = re.compile(r"\b\d{4,} bytes\b")


@pytest.mark.parametrize(
    "snapshot", sorted((ROOT / "fixtures" / "whatif").glob("*/snapshot.pickle")), ids=str
)
def test_the_text_gives_sizes_with_units_and_wraps_at_width(
    capsys: pytest.CaptureFixture[str], snapshot: Path
) -> None:
    code, out, _ = run(capsys, str(snapshot), "--width", "56")
    assert code == 0
    assert not _RAW_BYTES.search(out), out
    long = [line for line in out.splitlines() if len(line) > 56]
    # only a word longer than the line itself (the snapshot's path) may go over
    assert all(" " not in line.strip().split(": ", 1)[-1] for line in long), long
    _, unwrapped, _ = run(capsys, str(snapshot), "--width", "0")
    assert " ".join(out.split()) == " ".join(unwrapped.split()) or "- " in out


def test_on_a_terminal_it_wraps_to_the_terminal(rescued: Path) -> None:
    code, shown = on_terminal(["whatif", str(rescued)], 64)
    assert code == 0
    assert shown.splitlines() and all(len(line) <= 64 for line in shown.splitlines()[1:]), shown
    assert "self-check: passed" in " ".join(shown.split())
