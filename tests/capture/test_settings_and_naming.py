"""Capture settings (defaults, environment, overrides) and the names that make the ranks of one
run meet in one directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.capture import naming
from oomlens.capture.settings import (
    CaptureSettings,
    SettingsError,
    enabled,
    environment_of,
    resolve,
)


def test_environment_then_overrides() -> None:
    env = {"OOMLENS_CAPTURE_MAX_MB": "5", "OOMLENS_CAPTURE_STACKS_AT": "0.9"}
    settings = resolve({"stacks_at": "0.5", "history": False}, env)
    assert settings.max_mb == 5.0 and settings.stacks_at == 0.5 and settings.history is False
    assert settings.series_budget + settings.events_budget + settings.snapshot_budget <= 5 * 2**20
    assert resolve({}, environment_of(settings)) == settings


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OOMLENS_CAPTURE_MAX_MB": "lots"}, "OOMLENS_CAPTURE_MAX_MB must be a number"),
        ({"OOMLENS_CAPTURE_MAX_ENTRIES": "-1"}, "must not be negative"),
        ({"OOMLENS_CAPTURE_SENTINEL": "maybe"}, "must be 0 or 1"),
        ({"OOMLENS_CAPTURE_INTERVAL": "nan"}, "must be a number >= 0"),
    ],
)
def test_bad_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        resolve({}, env)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(SettingsError, match="unknown capture setting 'colour'"):
        resolve({"colour": "red"}, {})


def test_default_budget_is_20_mb_per_rank() -> None:
    settings = CaptureSettings()
    assert settings.budget_bytes == 20 * 2**20
    assert (
        settings.snapshot_budget + settings.series_budget + settings.events_budget
        == settings.budget_bytes
    )
    assert enabled({}) and not enabled({"OOMLENS_CAPTURE": "0"})


def test_identity_from_launchers() -> None:
    torchrun = naming.identity({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    assert (torchrun.rank, torchrun.local_rank, torchrun.world_size) == (3, 1, 8)
    assert torchrun.launched
    srun = naming.identity({"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"})
    assert (srun.rank, srun.local_rank, srun.world_size) == (2, 0, 4)
    single = naming.identity({})
    assert single.rank is None and not single.launched


def test_run_names_let_the_ranks_of_one_run_meet() -> None:
    ident = naming.identity({"RANK": "0", "LOCAL_RANK": "0"})
    assert naming.run_name(ident, {"SLURM_JOB_ID": "1234"}) == ("slurm-1234", "SLURM_JOB_ID")
    array = {"SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "6"}
    assert naming.run_name(ident, array)[0] == "slurm-1234_6"
    assert naming.run_name(ident, {"TORCHELASTIC_RUN_ID": "abc/def"})[0] == "torchrun-abc_def"
    given = {"OOMLENS_CAPTURE_RUN": "nightly", "SLURM_JOB_ID": "1"}
    assert naming.run_name(ident, given)[0] == "nightly"
    # launched ranks without an id share their launcher's start time and pid
    other = naming.identity({"RANK": "1", "LOCAL_RANK": "1"})
    name, origin = naming.run_name(ident, {"TORCHELASTIC_RUN_ID": "none"})
    assert naming.run_name(other, {})[0] == name and "launcher" in origin


def test_file_prefixes(tmp_path: Path) -> None:
    ident = naming.identity({"RANK": "2", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert naming.file_prefix(ident, str(tmp_path)) == "rank2-restart1"
    (tmp_path / "rank2-restart1.events.jsonl").write_text("")
    assert naming.file_prefix(ident, str(tmp_path)) == f"rank2-restart1-pid{ident.pid}"
    assert naming.safe_name("../../etc") == "etc"
