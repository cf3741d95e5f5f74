"""sbatch output patterns, expanded as slurmstepd did on Slurm 22.05 (tests/assets/epilog)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oomlens.epilog.environment import parse_job_environment
from oomlens.epilog.inputs import pattern_values
from oomlens.epilog.patterns import (
    WILDCARD,
    FoundFile,
    NotFound,
    PatternValues,
    default_output_pattern,
    expand_output_pattern,
    find_output_file,
)
from tests.epilog._assets import measured_environment, measured_output_files

MEASURED_HOST = "vm"
"""The short host name of the machine the captures were made on (slurmd's %N)."""


def _expand_measured(capture: str, job: int, context: str) -> list[str | None]:
    env = measured_environment(capture, job, context)
    parsed = parse_job_environment(env)
    values = pattern_values(parsed, MEASURED_HOST)
    pattern = parsed.stdout_pattern or default_output_pattern(values)[0]
    return [e.literal for e in expand_output_pattern(pattern, values, parsed.work_dir)]


@pytest.mark.parametrize(
    ("job", "context"),
    [(2, "slurmd"), (3, "slurmd"), (3, "slurmctld"), (4, "slurmctld"), (5, "slurmd")],
)
def test_fully_known_patterns_expand_to_the_file_slurm_created(job: int, context: str) -> None:
    # GIVEN the job's pattern as the Epilog saw it, and the files Slurm created
    created = measured_output_files("slurm-22.05")
    # WHEN it is expanded with what that Epilog knows
    literals = _expand_measured("slurm-22.05", job, context)
    # THEN the first expansion is a file Slurm really created
    assert literals[0] is not None
    assert os.path.basename(literals[0]) in created


def test_every_specifier_as_slurm_expanded_it() -> None:
    # o-%J-%s-%t-%n-%N-%u-%x-%5j-%A-%a.out -> o-1-batch-0-0-vm-root-pat1-00001-1-4294967294.out
    literals = _expand_measured("slurm-22.05", 1, "slurmctld")
    # The slurmctld Epilog does not know the batch host's name: %N is a wildcard there.
    assert literals == [None]
    values = PatternValues(job_id="1", user="root", job_name="pat1", hostname="vm",
                           is_array_task=False)  # fmt: skip
    (expansion,) = expand_output_pattern("o-%J-%s-%t-%n-%N-%u-%x-%5j-%A-%a.out", values, "/jobs")
    assert expansion.literal == "/jobs/o-1-batch-0-0-vm-root-pat1-00001-1-4294967294.out"
    assert "o-1-batch-0-0-vm-root-pat1-00001-1-4294967294.out" in measured_output_files(
        "slurm-22.05"
    )


def test_backslash_turns_expansion_off() -> None:
    env = measured_environment("slurm-22.05", 2, "slurmd")
    assert env["SLURM_JOB_STDOUT"].endswith("o2-%j\\\\%x.out")
    literals = _expand_measured("slurm-22.05", 2, "slurmd")
    assert literals == ["/tmp/slx/b1/jobs/o2-%j\\%x.out"]
    assert "o2-%j\\%x.out" in measured_output_files("slurm-22.05")


def test_percent_escape_width_cap_and_unknown_letter() -> None:
    literals = _expand_measured("slurm-22.05", 3, "slurmd")
    assert literals[0] == "/tmp/slx/b1/jobs/o3-%z-%j-0000000003-0000000003.out"


def test_default_output_without_o() -> None:
    literals = _expand_measured("slurm-22.05-b", 1, "slurmd")
    assert literals[0] == "/tmp/slx/b2/jobs/slurm-1.out"
    assert "slurm-1.out" in measured_output_files("slurm-22.05-b")


def test_array_task_in_the_slurmctld_epilog_is_exact() -> None:
    assert _expand_measured("slurm-22.05", 6, "slurmctld") == ["/tmp/slx/b1/jobs/arr-4_4-6.out"]
    assert _expand_measured("slurm-22.05", 4, "slurmctld") == ["/tmp/slx/b1/jobs/arr-4_5-4.out"]


def test_array_task_in_the_slurmd_epilog_needs_a_wildcard() -> None:
    # The slurmd Epilog has no SLURM_ARRAY_*: first the non-array guess, then wildcards.
    env = measured_environment("slurm-22.05", 6, "slurmd")
    parsed = parse_job_environment(env)
    values = pattern_values(parsed, MEASURED_HOST)
    first, second = expand_output_pattern(parsed.stdout_pattern or "", values, parsed.work_dir)
    assert first.literal == "/tmp/slx/b1/jobs/arr-6_4294967294-6.out"
    assert second.literal is None
    assert second.glob_pattern == "/tmp/slx/b1/jobs/arr-*_*-6.out"


def test_host_name_unknown_in_slurmctld_epilog(tmp_path: Path) -> None:
    # GIVEN the files of the capture, and job 1's pattern (with %N) moved there
    for name in measured_output_files("slurm-22.05"):
        (tmp_path / name).write_text("x")
    env = measured_environment("slurm-22.05", 1, "slurmctld")
    env["SLURM_JOB_STDOUT"] = env["SLURM_JOB_STDOUT"].replace("/tmp/slx/b1/jobs", str(tmp_path))
    parsed = parse_job_environment(env)
    # WHEN
    expansions = expand_output_pattern(
        parsed.stdout_pattern or "", pattern_values(parsed, "not-used"), parsed.work_dir
    )
    found = find_output_file(expansions)
    # THEN
    assert isinstance(found, FoundFile)
    assert found.path == str(tmp_path / "o-1-batch-0-0-vm-root-pat1-00001-1-4294967294.out")


def test_wildcard_finds_the_array_file(tmp_path: Path) -> None:
    # GIVEN the files the array created, in a work directory
    for name in measured_output_files("slurm-22.05"):
        (tmp_path / name).write_text("x")
    env = measured_environment("slurm-22.05", 6, "slurmd")
    env["SLURM_JOB_STDOUT"] = str(tmp_path / "arr-%A_%a-%j.out")
    parsed = parse_job_environment(env)
    expansions = expand_output_pattern(
        parsed.stdout_pattern or "", pattern_values(parsed, MEASURED_HOST), str(tmp_path)
    )
    # WHEN
    found = find_output_file(expansions)
    # THEN
    assert isinstance(found, FoundFile)
    assert found.path == str(tmp_path / "arr-4_4-6.out") and found.matches == 1


def test_job_name_unknown_in_slurmd_epilog(tmp_path: Path) -> None:
    (tmp_path / "train-12.out").write_text("mine")
    (tmp_path / "train-13.out").write_text("another job's")
    values = PatternValues(job_id="12", hostname="h", is_array_task=None)
    expansions = expand_output_pattern("%x-%j.out", values, str(tmp_path))
    found = find_output_file(expansions)
    assert isinstance(found, FoundFile) and found.path == str(tmp_path / "train-12.out")


def test_several_matches_take_the_newest_and_say_so(tmp_path: Path) -> None:
    for index, name in enumerate(["a-7.out", "b-7.out", "c-7.out"]):
        path = tmp_path / name
        path.write_text(name)
        os.utime(path, (1000 + index, 1000 + index))
    expansions = expand_output_pattern("%x-%j.out", PatternValues(job_id="7"), str(tmp_path))
    found = find_output_file(expansions)
    assert isinstance(found, FoundFile)
    assert found.path.endswith("c-7.out") and found.matches == 3


def test_wildcard_in_a_directory_part(tmp_path: Path) -> None:
    (tmp_path / "exp-a").mkdir()
    (tmp_path / "exp-a" / "9.log").write_text("x")
    expansions = expand_output_pattern("%x/%j.log", PatternValues(job_id="9"), str(tmp_path))
    found = find_output_file(expansions)
    assert isinstance(found, FoundFile) and found.path == str(tmp_path / "exp-a" / "9.log")


def test_glob_characters_in_literal_parts_are_literal(tmp_path: Path) -> None:
    (tmp_path / "run[1]-5.out").write_text("x")
    (tmp_path / "run1-5.out").write_text("decoy")
    expansions = expand_output_pattern("run[1]-%j%x.out", PatternValues(job_id="5"), str(tmp_path))
    assert expansions[0].segments[-1] is WILDCARD or expansions[0].literal is None
    found = find_output_file(expansions)
    assert isinstance(found, FoundFile) and found.path == str(tmp_path / "run[1]-5.out")


def test_not_found_says_what_was_tried(tmp_path: Path) -> None:
    expansions = expand_output_pattern("%j.out", PatternValues(job_id="5"), str(tmp_path))
    found = find_output_file(expansions)
    assert isinstance(found, NotFound)
    assert found.tried == (str(tmp_path / "5.out"),)
    assert "No such file" in found.reason


def test_a_directory_or_fifo_is_not_an_output_file(tmp_path: Path) -> None:
    (tmp_path / "5.out").mkdir()
    os.mkfifo(tmp_path / "6.out")
    for job in ("5", "6"):
        expansions = expand_output_pattern("%j.out", PatternValues(job_id=job), str(tmp_path))
        found = find_output_file(expansions)
        assert isinstance(found, NotFound) and "not a regular file" in found.reason


def test_listing_is_bounded(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"f{index:02d}-1.out").write_text("x")
    expansions = expand_output_pattern("%x-%j.out", PatternValues(job_id="1"), str(tmp_path))
    found = find_output_file(expansions, max_entries=10)
    assert isinstance(found, FoundFile) and found.matches <= 10


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("5", []),  # a task number other than 0 means /dev/null for the batch script
        ("%", ["/w/%"]),
        ("a%5", ["/w/a5"]),
        ("a%5z", ["/w/a5z"]),
        ("%%%j", ["/w/%3"]),
        ("/abs/%j.out", ["/abs/3.out"]),
    ],
)
def test_edge_patterns(pattern: str, expected: list[str]) -> None:
    expansions = expand_output_pattern(pattern, PatternValues(job_id="3"), "/w")
    assert [e.literal for e in expansions] == expected


def test_relative_pattern_without_work_dir_names_nothing() -> None:
    assert expand_output_pattern("%j.out", PatternValues(job_id="3"), None) == []
