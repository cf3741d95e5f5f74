"""The Epilog environments Slurm 22.05 really produced (tests/assets/epilog/*/)."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "epilog"


def measured_environment(capture: str, job: int, context: str) -> dict[str, str]:
    """``env | sort`` of one Epilog run, as a dict (``context``: slurmd or slurmctld)."""
    path = ASSETS / capture / f"epilog_env.{job}.epilog_{context}.txt"
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        env[name] = value
    return env


def measured_output_files(capture: str) -> list[str]:
    """The files slurmstepd created for that capture's jobs."""
    return (ASSETS / capture / "output-files.txt").read_text().splitlines()
