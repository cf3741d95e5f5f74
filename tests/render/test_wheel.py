"""The templates ship inside the wheel: a non-editable install renders the HTML report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests._corpus import case_dir

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_wheel_installed_non_editable_renders_html(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="hatchling (the test extra) builds the wheel offline")
    # GIVEN a wheel built from the checkout
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("oomlens-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "oomlens/templates/html/base.html" in names
    assert "oomlens/templates/rules/fragmentation.html" in names
    assert "oomlens/templates/markdown/report.md.j2" in names
    # WHEN it is installed (not editable) into its own folder, dependencies from this environment
    site = tmp_path / "site"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    # THEN, run from elsewhere with that folder first on the path, it renders a corpus case
    page = tmp_path / "report.html"
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import oomlens, oomlens.render.templates as t; from oomlens.ingest.log import native; "
        "print(oomlens.__file__); print(t.template_dir()); print(native.BUILT)"
    )
    where = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert where.returncode == 0, where.stderr
    module_file, templates, scan_built = where.stdout.split()
    assert Path(module_file).is_relative_to(site)
    assert Path(templates) == site / "oomlens" / "templates"
    # the build hook compiled the C scan into the wheel where a compiler is (hatch_build.py)
    if shutil.which(os.environ.get("CC", "cc")):
        assert any(name.startswith("oomlens/ingest/log/_scan.") for name in names)
        assert scan_built == "True"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "oomlens",
            "analyze",
            str(case_dir("fragmentation")),
            "--html",
            str(page),
            "--format",
            "markdown",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert 'id="d1-fragmentation"' in page.read_text()
    assert result.stdout.startswith("# oomlens: GPU OOM")
