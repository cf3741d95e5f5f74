"""The verdict is a declared, ordered table in the rules layer (``oomlens.rules.verdict``),
read with the user's thresholds, not a ladder frozen at the defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from oomlens.cli import cli
from oomlens.diagnosis import Verdict
from oomlens.rules.thresholds import Thresholds
from oomlens.rules.verdict import VERDICT_TABLE
from oomlens.session import AnalysisOptions, analyze, gather_facts

FIELD = Path(__file__).resolve().parents[2] / "fixtures" / "field_logs"


def _silent_death_at(tmp_path: Path, percent: float) -> Path:
    """A DeepSpeed launcher log whose rank dies silently while the node's memory is
    ``percent`` used: the real lines of a ZeRO-2 offload run (field case deepspeed-4571),
    with the node-wide figure set to ``percent``."""
    real = (FIELD / "deepspeed-4571" / "paste.txt").read_text().splitlines()
    kept = [line for line in real if "see_memory_usage" in line or "Killing subprocess" in line]
    assert any("CPU Virtual Memory" in line for line in kept)
    lines = [re.sub(r"percent = [\d.]+%", f"percent = {percent}%", line) for line in kept]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    return log


@pytest.mark.parametrize(
    ("percent", "fraction", "expected"),
    [
        (91.5, 0.9, Verdict.HOST_OOM),
        (91.5, 0.95, Verdict.OTHER_FAILURE),
        (72.0, 0.7, Verdict.HOST_OOM),
        (72.0, 0.8, Verdict.OTHER_FAILURE),
    ],
)
def test_a_silent_death_under_host_pressure_is_judged_at_the_users_threshold(
    tmp_path: Path, percent: float, fraction: float, expected: Verdict
) -> None:
    log = _silent_death_at(tmp_path, percent)
    options = AnalysisOptions(thresholds=Thresholds(host_memory_pressure_fraction=fraction))
    report = analyze([log], options=options)
    assert report.verdict is expected
    if expected is Verdict.HOST_OOM:
        assert f"{percent}% used" in report.verdict_reason


def test_the_thresholds_file_of_the_command_line_reaches_the_verdict(tmp_path: Path) -> None:
    log = _silent_death_at(tmp_path, 72.0)
    settings = tmp_path / "settings.toml"
    settings.write_text("[thresholds]\nhost_memory_pressure_fraction = 0.7\n")
    runner = CliRunner()
    default = runner.invoke(cli, ["analyze", str(log), "--format", "json"])
    lowered = runner.invoke(
        cli, ["analyze", str(log), "--format", "json", "--thresholds", str(settings)]
    )
    assert '"verdict": "other_failure"' in default.output
    assert '"verdict": "host_oom"' in lowered.output


def test_every_verdict_has_a_row_and_the_last_row_always_holds(tmp_path: Path) -> None:
    assert {row.verdict for row in VERDICT_TABLE} == set(Verdict)
    assert len({row.name for row in VERDICT_TABLE}) == len(VERDICT_TABLE)
    quiet = tmp_path / "notes.log"
    quiet.write_text("starting\n")
    facts = gather_facts([quiet])
    assert VERDICT_TABLE[-1].reading(facts, Thresholds()) is not None
