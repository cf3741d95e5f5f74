"""The package's layers, as the README's "How it works" draws them, hold: the import-linter
contract in pyproject.toml ([tool.importlinter]) is kept, and it does catch an upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("importlinter", reason="import-linter (the test extra) is missing")
    # import-linter reads the contract from pyproject.toml in the working directory and finds
    # the package on sys.path: the copy under test comes first
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_every_import_goes_down_the_layers() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    # GIVEN a copy of the package where a rule module imports the report (a layer above it)
    shutil.copytree(ROOT / "oomlens", tmp_path / "oomlens", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    thresholds = tmp_path / "oomlens" / "rules" / "thresholds.py"
    thresholds.write_text(thresholds.read_text() + "\nimport oomlens.report  # noqa\n")
    # WHEN the contract is checked THEN it is broken, naming the import
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "oomlens.rules.thresholds -> oomlens.report" in result.stdout


def test_the_capture_may_import_nothing_of_oomlens_but_itself(tmp_path: Path) -> None:
    # GIVEN a copy where the capture (it runs inside the training) imports a helper of the
    # analysis side, one layer below it and so allowed by the layers contract
    shutil.copytree(ROOT / "oomlens", tmp_path / "oomlens", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    settings = tmp_path / "oomlens" / "capture" / "settings.py"
    settings.write_text(settings.read_text() + "\nimport oomlens.units  # noqa\n")
    # WHEN the contracts are checked THEN the capture's own contract is broken
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "oomlens.capture.settings -> oomlens.units" in result.stdout
    assert "2 kept, 1 broken" in result.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "oomlens", tmp_path / "oomlens", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "oomlens"


def test_judgment_may_not_reach_how_signals_are_derived(tmp_path: Path) -> None:
    # GIVEN a copy where a rule computes a signal itself (the analysis is below the rules, so
    # the layers allow it) and the report calls the derive stage
    package = _copy(tmp_path)
    rule = package / "rules" / "shm_exhausted.py"
    rule.write_text(rule.read_text() + "\nimport oomlens.analysis.zero_model  # noqa\n")
    report = package / "report.py"
    report.write_text(report.read_text() + "\nimport oomlens.derive.signals  # noqa\n")
    # WHEN the contracts are checked THEN the judgment's contract is broken, naming both
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "oomlens.rules.shm_exhausted -> oomlens.analysis.zero_model" in result.stdout
    assert "oomlens.report -> oomlens.derive.signals" in result.stdout
    assert "2 kept, 1 broken" in result.stdout


def test_every_module_of_the_package_has_a_layer(tmp_path: Path) -> None:
    # GIVEN a copy with a new top-level module no layer names
    package = _copy(tmp_path)
    (package / "stray.py").write_text('"""A module nobody placed."""\n')
    # WHEN the contracts are checked THEN the layers contract says it is missing
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "oomlens.stray" in result.stdout
