"""``oomlens capture``: the CLI's command for ``python -m oomlens.capture``, with the same
options, a real ``--help`` on both, and the script run exactly as ``python SCRIPT`` runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from oomlens.capture.__main__ import OPTIONS, parse
from oomlens.capture.settings import ENVIRONMENT, resolve

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "blas": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "name": __name__}))
raise SystemExit(7)
"""


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OOMLENS_CAPTURE") and k != "OPENBLAS_NUM_THREADS"
    }
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, *args],
        env=environment | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _documented_options(help_text: str) -> set[str]:
    return set(re.findall(r"^  (--[a-z][\w-]*)", help_text, re.MULTILINE))


def test_both_helps_document_every_option_the_parser_takes(tmp_path: Path) -> None:
    as_command = _run(["-m", "oomlens", "capture", "--help"], tmp_path)
    as_module = _run(["-m", "oomlens.capture", "-h"], tmp_path)
    assert as_command.returncode == 0, as_command.stderr
    assert as_module.returncode == 0, as_module.stderr
    assert as_command.stdout.startswith("usage: oomlens capture ")
    assert as_module.stdout.startswith("usage: python -m oomlens.capture ")
    # the same text after the usage lines (wrapped to the program's name)
    assert as_command.stdout.split("\n\n", 1)[1] == as_module.stdout.split("\n\n", 1)[1]
    documented = _documented_options(as_command.stdout)
    assert len(documented) >= 5
    for flag in documented:
        # every documented option is one the parser takes, for a setting that resolves
        option = next(o for o in OPTIONS if o.flag == flag)
        value = [] if not option.metavar else ["3"]
        settings, _, _, target = parse([flag, *value, "train.py"])
        assert target == ["train.py"]
        resolve(settings, env={})
        assert ENVIRONMENT[option.setting] in as_command.stdout
    # the command lists it, with what it does
    listing = _run(["-m", "oomlens", "--help"], tmp_path)
    assert re.search(r"^  capture\s+Run a training script", listing.stdout, re.MULTILINE)


def test_the_command_runs_the_script_with_the_options_as_the_module_does(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    result = _run(
        [
            "-m",
            "oomlens",
            "capture",
            "--dir",
            "caps",
            "--run=first",
            "--no-sentinel",
            "--max-mb",
            "2",
            "job.py",
            "--help",
            "--dir",
            "x",
        ],
        tmp_path,
    )
    assert result.returncode == 7, result.stderr
    seen = json.loads(result.stdout)
    # everything from the script on is the script's, --help included
    assert seen == {"argv": ["--help", "--dir", "x"], "blas": None, "name": "__main__"}
    events = tmp_path / "caps" / "first" / "rank0.events.jsonl"
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert records[0]["oomlens_capture"] == 1
    assert any(r.get("kind") == "exit" and r.get("code") == 7 for r in records)


def test_a_bad_command_line_exits_2_with_the_usage_and_where_the_help_is(tmp_path: Path) -> None:
    result = _run(["-m", "oomlens", "capture", "--max-entries"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "oomlens capture: --max-entries needs a value"
    assert lines[1].startswith("usage: oomlens capture ")
    assert lines[-1] == "(more: oomlens capture --help)"
