"""Reading all inputs of a run at once."""

from __future__ import annotations

import shutil
from pathlib import Path

from oomlens.analysis.ranks import rank_picture
from oomlens.ingest.detect import discover_run
from oomlens.ingest.run import collect_inputs
from tests.ingest._reading import problems, read_run

ASSETS = Path(__file__).parents[1] / "assets" / "logs"
LAB = ASSETS / "lab_log_torch2.11_h200.txt"


def test_torchrun_log_dir_reads_into_one_rank_picture(tmp_path: Path) -> None:
    # the --log-dir layout of the lab run (E_logdir_listing) with its real contents
    lines = LAB.read_text().splitlines()
    start = next(
        i
        for i, x in enumerate(lines)
        if x.startswith("FILE ") and x.endswith("attempt_0/1/stderr.log 1032")
    )
    rank1 = tmp_path / "12eb2aba_bz6ra3wp" / "attempt_0" / "1"
    rank1.mkdir(parents=True)
    (rank1 / "stderr.log").write_text("\n".join(lines[start + 1 : start + 12]) + "\n")
    shutil.copy(ASSETS / "torchelastic_error_file_example.json", rank1 / "error.json")
    run = read_run(discover_run(tmp_path).files)
    assert len(run.logs) == 1 and len(run.error_files) == 1 and not problems(run)
    (event,) = run.logs[0].oom_events
    assert event.source.rank == 1  # from the layout: the lines carry no prefix
    picture = rank_picture(run.logs, run.error_files)
    assert picture.first_failed is not None and picture.first_failed.rank == 1


def test_files_given_one_by_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    prose = tmp_path / "notes.txt"
    prose.write_text("the job died overnight\n")
    garbage = tmp_path / "blob"
    garbage.write_bytes(bytes(range(256)) * 100)
    files, unusable = collect_inputs([LAB, empty, prose, garbage, tmp_path / "missing.log"])
    assert [Path(f.path).name for f in files] == [LAB.name, "notes.txt"]
    assert [Path(p.path).name for p in unusable] == ["empty.log", "blob", "missing.log"]
    assert "empty" in unusable[0].detail and "binary" in unusable[1].detail
    assert all(p.problem and p.problem.startswith(p.path) for p in unusable)
    run = read_run(files)
    assert len(run.logs) == 2
