"""File names that are not UTF-8 (bytes a Linux file system allows, which ``os.fsdecode``
turns into lone surrogates): every report on standard output and in a file is UTF-8 text
that shows each such byte as ``\\xNN``, for analyze, check, whatif and triage's per-run
reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.cli import main
from tests._corpus import case_dir

CASE = case_dir("fragmentation")
# 0x80 (a continuation byte alone), 0xc3 (a lead byte cut), 0xfe (never in UTF-8)
RUN = b"r\x80n"
LOG = b"tr\xc3.log"
SNAPSHOT = b"s\xfe.pickle"


def _run_dir(tmp_path: Path) -> str:
    folder = os.path.join(os.fsencode(tmp_path), RUN)
    os.mkdir(folder)
    shutil.copy(CASE / "train.log", os.path.join(folder, LOG))
    shutil.copy(CASE / "snapshot_rank0.pickle", os.path.join(folder, SNAPSHOT))
    return os.fsdecode(folder)


def _main(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_analyze_writes_utf8_naming_the_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    run = _run_dir(tmp_path)
    code, out, err = _main(capsys, ["analyze", run, "--format", fmt, "--width", "0"])
    assert code == 0, err
    out.encode("utf-8")  # strict: a surrogate would reach the terminal as a raw byte
    shown = [i["path"] for i in json.loads(out)["inputs"]] if fmt == "json" else [out]
    assert all("r\\x80n" in text for text in shown)
    # the report file's own name is not UTF-8 either
    target = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"report\xff." + fmt.encode()))
    html = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"page\xff.html"))
    code, _, err = _main(
        capsys, ["analyze", run, "--format", fmt, "-o", target, "--html", html, "--width", "0"]
    )
    assert code == 0, err
    assert f"report written to {tmp_path}{os.sep}report\\xff.{fmt}" in err
    with open(target, "rb") as written:
        assert written.read().decode("utf-8") == out
    with open(html, "rb") as page:
        assert "tr\\xc3.log" in page.read().decode("utf-8")


def test_analyze_json_on_stdout_is_utf8_json(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "oomlens", "analyze", run, "--format", "json"],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout.decode("utf-8"))
    paths = {item["path"] for item in document["inputs"]}
    assert {os.path.basename(path) for path in paths} == {"tr\\xc3.log", "s\\xfe.pickle"}


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_check_and_whatif_of_such_files_print_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    run = _run_dir(tmp_path)
    config = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"ds\xe9.json"))
    with open(config, "w", encoding="utf-8") as out:
        json.dump({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}, out)
    code, out, err = _main(capsys, ["check", config, "--format", fmt, "--params", "1B"])
    assert code == 0, err
    out.encode("utf-8")
    assert "ds\\xe9.json" in (json.loads(out)["config"] if fmt == "json" else out)
    snapshot = os.fsdecode(os.path.join(os.fsencode(run), SNAPSHOT))
    target = os.path.join(str(tmp_path), f"whatif.{fmt}")
    code, out, err = _main(capsys, ["whatif", snapshot, "--format", fmt])
    assert code == 0, err
    out.encode("utf-8")
    code, _, err = _main(capsys, ["whatif", snapshot, "--format", fmt, "-o", target])
    assert code == 0, err
    Path(target).read_bytes().decode("utf-8")


def test_triage_writes_each_runs_report_in_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "tree").mkdir()
    _run_dir(tmp_path / "tree")
    reports = tmp_path / "reports"
    code, _, err = _main(
        capsys,
        [
            "triage",
            str(tmp_path / "tree"),
            "--no-store",
            "-o",
            str(tmp_path / "t.csv"),
            "--reports",
            str(reports),
        ],
    )
    assert code == 0, err
    pages = [page.read_bytes().decode("utf-8") for page in reports.glob("*.html")]
    assert len(pages) == 1 and "tr\\xc3.log" in pages[0]
