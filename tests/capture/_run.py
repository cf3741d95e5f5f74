"""Running the CPU training loop with and without ``python -m oomlens.capture``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "_train_cpu.py"
ROOT = HERE.parents[1]

_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OOMLENS_CAPTURE") and k not in _LAUNCHER_VARS
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def plain(cwd: Path, *script_args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(TRAIN), *script_args], clean_env(**env), cwd)


def captured(
    cwd: Path, *script_args: str, capture_args: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    return run(
        [sys.executable, "-m", "oomlens.capture", *capture_args, str(TRAIN), *script_args],
        clean_env(**env),
        cwd,
    )


def records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a capture file (a cut last line is left out)."""
    lines = path.read_text().splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith("\n")]


def kinds(path: Path) -> list[str]:
    return [r.get("kind", "header") for r in records(path)]


def wait_for(predicate: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())
