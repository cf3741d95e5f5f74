"""The Epilog's site settings file: TOML data, every key checked, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oomlens.epilog.settings import KNOWN_KEYS, EpilogSettings, load_settings, with_spool
from oomlens.errors import UsageError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "epilog.toml"
    path.write_text(text)
    return path


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "absent.toml") == EpilogSettings()


def test_defaults_are_safe_for_a_cluster() -> None:
    settings = EpilogSettings()
    assert settings.budget_seconds < 30  # under the wrapper's default hard limit
    assert settings.copy_to_workdir is False
    assert settings.log_path == Path("/var/spool/oomlens/epilog.log")


def test_every_key_can_be_set(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
spool_dir = "/srv/oomlens"
budget_seconds = 12.5
copy_to_workdir = true
log_file = "/var/log/oomlens-epilog.log"
syslog = true
syslog_facility = "local3"
log_successful_jobs = false
max_log_bytes = "64 MiB"
max_snapshot_bytes = 1073741824
max_memory_bytes = "0"
tmp_dir = "/scratch/tmp"
workdir_patterns = ["*.pickle", "my_ds.json"]
workdir_recent_seconds = 3600
workdir_max_entries = 500
workdir_max_files = 4
""",
    )
    settings = load_settings(path)
    assert settings == EpilogSettings(
        spool_dir=Path("/srv/oomlens"),
        budget_seconds=12.5,
        copy_to_workdir=True,
        log_file=Path("/var/log/oomlens-epilog.log"),
        syslog=True,
        syslog_facility="local3",
        log_successful_jobs=False,
        max_log_bytes=64 * 1024**2,
        max_snapshot_bytes=1024**3,
        max_memory_bytes=0,
        tmp_dir=Path("/scratch/tmp"),
        workdir_patterns=("*.pickle", "my_ds.json"),
        workdir_recent_seconds=3600.0,
        workdir_max_entries=500,
        workdir_max_files=4,
    )
    assert settings.log_path == Path("/var/log/oomlens-epilog.log")
    assert set(settings.describe()) == set(KNOWN_KEYS)


def test_relative_log_file_is_in_the_spool(tmp_path: Path) -> None:
    settings = load_settings(_write(tmp_path, 'spool_dir = "/s"\nlog_file = "jobs.log"\n'))
    assert settings.log_path == Path("/s/jobs.log")


def test_unknown_key_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, "budget_second = 5\n")
    with pytest.raises(UsageError) as caught:
        load_settings(path)
    message = caught.value.message
    assert message.startswith(f"{path}: unknown setting 'budget_second'")
    assert "budget_seconds" in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("budget_seconds = 0.5", "budget_seconds = 0.5 is not a number of seconds from 1"),
        ("budget_seconds = true", "is not a number of seconds"),
        ('budget_seconds = "10"', "is not a number of seconds"),
        ('copy_to_workdir = "yes"', "copy_to_workdir = 'yes' is not true or false"),
        ('spool_dir = "relative/spool"', "is not an absolute path"),
        ('max_log_bytes = "lots"', 'is not a size such as "64 MiB"'),
        ("max_log_bytes = 10", "is not at least 1 KiB"),
        ('syslog_facility = "kern"', "is not one of user, daemon"),
        ('workdir_patterns = ["../*.pickle"]', "is not a list of file-name patterns"),
        ("workdir_patterns = '*.pickle'", "is not a list of file-name patterns"),
        ("workdir_max_files = -1", "is not a whole number from 0"),
        ("[epilog]\nbudget_seconds = 5", "unknown setting 'epilog'"),
    ],
)
def test_bad_values_are_refused_with_what_to_write(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_settings(_write(tmp_path, text + "\n"))
    assert words in caught.value.message


@pytest.mark.parametrize("spool", ["relspool", "", "./spool"])
def test_spool_option_must_be_absolute_as_spool_dir_must(spool: str) -> None:
    with pytest.raises(UsageError) as caught:
        with_spool(EpilogSettings(), spool)
    assert caught.value.message == f"--spool {spool!r}: give an absolute path, as for spool_dir"
    assert with_spool(EpilogSettings(), "/srv/s").spool_dir == Path("/srv/s")


def test_not_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, "spool_dir = /var/spool\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_settings(path)


def test_not_text_and_too_large(tmp_path: Path) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_settings(binary)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(UsageError, match="larger than 1 MiB"):
        load_settings(huge)


def test_a_directory_is_not_a_settings_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the settings file"):
        load_settings(tmp_path)


def test_a_fifo_as_the_settings_file_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "epilog.toml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"named pipe \(FIFO\), not a settings file"):
        load_settings(fifo)
