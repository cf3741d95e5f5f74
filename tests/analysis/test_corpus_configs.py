"""The crash corpus (real GPU runs, DeepSpeed 0.19.8): each case's ds_config.json and the config
dump DeepSpeed printed in its log resolve to the same effective config, and the batch errors
DeepSpeed raised are the ones oomlens predicts from the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oomlens.analysis.batch import check_batch, with_derived_batch
from oomlens.analysis.ds_resolve import resolve_effective_config
from oomlens.analysis.ds_validation import validate
from oomlens.facts.run import WorldSizeFact
from oomlens.ingest.ds_config import read_ds_config, scan_log_for_config_dumps

CORPUS = Path(__file__).parents[2] / "fixtures" / "crash_logs"
CASES = (
    sorted(
        p.parent
        for p in CORPUS.glob("*/ds_config.json")
        # a config of "auto" values is the HF Trainer's to resolve: DeepSpeed never sees it
        if '"auto"' not in p.read_text()
    )
    if CORPUS.is_dir()
    else []
)

BATCH_ASSERTION = re.compile(
    r"AssertionError: ((?:Check batch related|Micro batch size|Train batch size"
    r"|Gradient accumulation steps)[^\n]*)"
)

pytestmark = pytest.mark.skipif(not CASES, reason="crash corpus not present")


def _logs(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*.log") if p.name != "kernel.log")


def _world_size(case: Path) -> int | None:
    """From the manifest's launch command (``deepspeed --num_gpus N``)."""
    for name in ("case.json", "run.json"):
        manifest = case / name
        if manifest.exists():
            match = re.search(
                r"--num_gpus (\d+)", json.loads(manifest.read_text()).get("command", "")
            )
            if match:
                return int(match.group(1))
    return None


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_config_file_and_log_dump_agree(case: Path) -> None:
    doc = read_ds_config(case / "ds_config.json")
    file_effective = resolve_effective_config(doc)
    dumps = [d for log in _logs(case) for d in scan_log_for_config_dumps(log)]
    if not dumps:
        pytest.skip("no config dump in the logs (DeepSpeed prints it at INFO level, once valid)")
    for dump in dumps:
        assert dump.complete, dump.problems
        effective = dump.effective()
        assert effective.world_size is not None
        world = WorldSizeFact(int(effective.world_size.value), "config dump")
        assert with_derived_batch(file_effective, world).settings() == effective.settings()
        assert dump.user_config is not None
        assert set(dump.user_config.data) == set(doc.data)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_batch_errors_in_the_log_are_predicted_from_the_file(case: Path) -> None:
    text = "\n".join(log.read_text(errors="replace") for log in _logs(case))
    raised = sorted(set(BATCH_ASSERTION.findall(text)))
    world = _world_size(case)
    if world is None:
        pytest.skip("world size unknown")
    doc = read_ds_config(case / "ds_config.json")
    problems = [p for p in validate(doc, world_size=world) if p.code.startswith("batch_")]
    assert sorted({p.message for p in problems}) == raised
    check = check_batch(resolve_effective_config(doc), WorldSizeFact(world, "run.json"))
    assert (check.error is None) == (not raised)


def test_a_file_that_differs_from_the_log_s_dump_is_said_in_words(tmp_path: Path) -> None:
    # the run's log printed the config it ran with; the file beside it was edited afterwards
    from oomlens.render.registry import Format, RenderOptions, render
    from oomlens.session import analyze

    case = CORPUS / "prefetch_overshoot"
    config = json.loads((case / "ds_config.json").read_text())
    config["zero_optimization"]["stage3_prefetch_bucket_size"] = 50_000_000
    (tmp_path / "ds_config.json").write_text(json.dumps(config, indent=2))
    (tmp_path / "train.log").write_bytes((case / "train.log").read_bytes())
    report = analyze([tmp_path])
    notes = [n for i in report.facts.inputs for n in i.notes if "differs" in n]
    notes += [n for n in report.facts.config.reading.notes if "differs" in n]  # type: ignore[union-attr]
    assert notes
    for note in notes:
        assert "zero_optimization.stage3_prefetch_bucket_size" in note
        assert "50_000_000" in note and "10_000_000_000" in note
        assert "ds_config.json" in note and "train.log" in note
    for fmt in Format:
        shown = render(report, fmt, RenderOptions())
        assert "ConfigDifference(" not in shown and "ConfigValue(" not in shown, fmt
        assert "Origin." not in shown and "SourceRef(" not in shown, fmt
