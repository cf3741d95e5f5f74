"""``oomlens fix INPUT... --write DIR [--command CMD]``: exit codes, one line per problem, and
names that are not UTF-8, as the other commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.cli import main
from oomlens.errors import ExitCode
from tests._corpus import case_dir, manifest


def _main(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _command(name: str) -> str:
    words = shlex.split(manifest(name)["command"])
    return shlex.join(w for w in words if not w.startswith("EMULATE_GPU_MEMORY_GIB="))


def test_writes_the_fix_and_prints_the_changed_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_dir = tmp_path / "fix"
    code, out, err = _main(
        capsys,
        [
            "fix",
            str(case_dir("fragmentation")),
            "--write",
            str(out_dir),
            "--command",
            _command("fragmentation"),
        ],
    )
    assert code == ExitCode.OK, err
    lines = out.splitlines()
    assert lines[0].startswith("fix for fragmentation: ")
    assert f"  wrote {out_dir / 'fix.env'}" in lines
    assert f"  wrote {out_dir / 'fix.json'}" in lines
    command = next(line for line in lines if line.startswith("  command: "))
    assert command == (
        "  command: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + _command("fragmentation")
    )
    record = json.loads((out_dir / "fix.json").read_text())
    assert record["diagnosis"] == "fragmentation"


def test_a_run_with_no_fix_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _main(
        capsys, ["fix", str(case_dir("fragmentation_fixed")), "--write", str(tmp_path / "x")]
    )
    assert code == ExitCode.USAGE
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("oomlens: ") and "no fix" in err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "x").exists()


def test_write_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(capsys, ["fix", str(case_dir("fragmentation"))])
    assert code == ExitCode.USAGE
    assert "--write" in err


def test_a_folder_that_cannot_be_made_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = _main(
        capsys, ["fix", str(case_dir("fragmentation")), "--write", str(blocker / "sub")]
    )
    assert code == ExitCode.USAGE
    assert err.count("\n") == 1 and err.startswith("oomlens: --write ")


def test_an_unreadable_input_exits_as_analyze_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "absent.log")
    code_analyze, _, _ = _main(capsys, ["analyze", missing])
    code, out, err = _main(capsys, ["fix", missing, "--write", str(tmp_path / "x")])
    assert code == code_analyze != ExitCode.OK
    assert err.count("\n") == 1 and "Traceback" not in err


def test_names_that_are_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a run folder, its log and the output folder with bytes a Linux file system allows
    root = os.fsencode(tmp_path)
    run = os.path.join(root, b"r\x80n")
    os.mkdir(run)
    shutil.copy(
        os.fsencode(case_dir("fragmentation") / "train.log"), os.path.join(run, b"tr\xc3.log")
    )
    shutil.copy(
        os.fsencode(case_dir("fragmentation") / "snapshot_rank0.pickle"),
        os.path.join(run, b"s.pickle"),
    )
    out_dir = os.fsdecode(os.path.join(root, b"o\xffut"))
    code, out, err = _main(
        capsys,
        ["fix", os.fsdecode(run), "--write", out_dir, "--command", "python3 s\udcfe.py --x 1"],
    )
    assert code == ExitCode.OK, err
    out.encode("utf-8")  # strict: no lone surrogate reaches the terminal
    assert "o\\xffut" in out
    assert os.path.exists(os.path.join(root, b"o\xffut", b"fix.json"))
    # the command file keeps the command's own bytes
    with open(os.path.join(root, b"o\xffut", b"command.txt"), "rb") as written:
        assert b"s\xfe.py" in written.read()


def test_as_a_process_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "oomlens",
            "fix",
            str(case_dir("fragmentation_fixed")),
            "--write",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == b""
    assert result.stderr.decode("utf-8").count("\n") == 1


def test_a_command_a_shell_cannot_split_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _main(
        capsys,
        [
            "fix",
            str(case_dir("fragmentation")),
            "--write",
            str(tmp_path / "x"),
            "--command",
            "python3 sample_cached.py --out-dir 'runs/fragmentation",
        ],
    )
    assert code == ExitCode.USAGE
    assert err.count("\n") == 1 and err.startswith("oomlens: --command: ")


def test_a_folder_of_several_runs_is_refused_as_analyze_refuses_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    for name in ("fragmentation", "compiled_activation"):
        (tree / name).mkdir(parents=True)
        shutil.copy(case_dir(name) / "train.log", tree / name / "train.log")
    code_analyze, _, _ = _main(capsys, ["analyze", str(tree)])
    code, out, err = _main(capsys, ["fix", str(tree), "--write", str(tmp_path / "x")])
    assert code == code_analyze == ExitCode.USAGE
    assert out == "" and err.count("\n") == 1 and "holds 2 runs" in err
    assert not (tmp_path / "x").exists()
    # told they are one run, it answers for them as one
    code, out, err = _main(capsys, ["fix", str(tree), "--one-run", "--write", str(tmp_path / "x")])
    assert code == ExitCode.OK, err
    assert out.startswith("fix for ")


def test_a_log_on_standard_input(tmp_path: Path) -> None:
    log = (case_dir("fragmentation") / "train.log").read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "oomlens", "fix", "-", "--write", str(tmp_path / "x")],
        input=log,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert result.returncode == ExitCode.OK, result.stderr
    assert result.stdout.decode("utf-8").startswith("fix for fragmentation: ")
    assert (tmp_path / "x" / "fix.env").exists()
