"""One renderer contract: one format enum, renderers with one signature, picked in one place
(``oomlens.render.registry``) by every command; ``oomlens check`` and ``oomlens whatif`` render
through it too, and their JSON is versioned like the analysis report's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import oomlens
from oomlens.errors import UsageError
from oomlens.render.registry import Format, RenderOptions, available, formats_for, render, renderer
from oomlens.report import CHECK_SCHEMA_VERSION, SCHEMA_VERSION
from oomlens.session import analyze, check_config, what_if
from tests._corpus import case_dir

PACKAGE = Path(oomlens.__file__).parent


@pytest.mark.parametrize("fmt", list(Format))
def test_every_format_has_one_renderer_that_renders_an_analysis(fmt: Format) -> None:
    assert available(fmt) and renderer(fmt).format is fmt
    report = analyze([case_dir("fragmentation") / "train.log"])
    text = render(report, fmt, RenderOptions())
    assert "fragmentation" in text


def test_a_check_renders_in_the_formats_that_make_it_and_is_refused_in_the_others() -> None:
    check = check_config(case_dir("memory_leak") / "ds_config.json", gpus=2)
    assert set(formats_for("check")) == {Format.TEXT, Format.JSON}
    data = json.loads(render(check, Format.JSON))
    assert data["schema_version"] == CHECK_SCHEMA_VERSION and data["oomlens_version"]
    assert data["valid"] is True and data["failed"] is False
    assert render(check, Format.TEXT).rstrip().endswith("Verdict: OK: valid (no memory check)")
    with pytest.raises(UsageError, match="--format html is not available for check"):
        render(check, Format.HTML)


def test_a_whatif_renders_in_the_formats_that_make_it_and_is_refused_in_the_others() -> None:
    report = what_if(
        case_dir("fragmentation") / "snapshot_rank0.pickle", ["expandable_segments:True"]
    )
    assert set(formats_for("whatif")) == {Format.TEXT, Format.JSON}
    data = json.loads(render(report, Format.JSON))
    assert data["schema_version"] == "1.0" and data["oomlens_version"] == oomlens.__version__
    assert [p["alloc_conf"] for p in data["predictions"]] == ["", "expandable_segments:True"]
    text = render(report, Format.TEXT)
    assert text.startswith("oomlens whatif: ") and "expandable_segments:True" in text
    for refused in (Format.HTML, Format.MARKDOWN):
        with pytest.raises(UsageError, match=f"--format {refused} is not available for whatif"):
            render(report, refused)


def test_the_analysis_json_keeps_its_schema_version() -> None:
    data = json.loads(render(analyze([case_dir("fragmentation") / "train.log"]), Format.JSON))
    # 1.1: the memory account and the run's context added (keys only: a minor version)
    assert data["schema_version"] == SCHEMA_VERSION == "1.1"


@pytest.mark.parametrize(
    ("fmt", "output", "chosen"),
    [
        (None, None, Format.TEXT),
        ("json", "report.html", Format.JSON),
        (None, "report.HTM", Format.HTML),
        (None, "ticket.md", Format.MARKDOWN),
        (None, "out.txt", Format.TEXT),
    ],
)
def test_the_format_comes_from_the_option_else_the_extension(
    fmt: str | None, output: str | None, chosen: Format
) -> None:
    assert Format.choose(fmt, output) is chosen


def test_an_unknown_extension_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="cannot tell the format"):
        Format.choose(None, "report.pdf")


def test_nothing_outside_the_renderers_picks_a_renderer_by_name() -> None:
    # the commands, the epilog and triage render through the registry only
    pattern = re.compile(
        r"render_(html|markdown|text|json)\(|(whatif|check)_(text|to_dict)\("
        r"|oomlens\.render\.(html|markdown|text|whatif|check_text)\b"
    )
    outside = [
        path
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "render"
        and path.name != "session.py"  # preloads the renderers' modules by name
        and pattern.search(path.read_text())
    ]
    assert outside == []
