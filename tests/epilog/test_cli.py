"""``oomlens epilog`` as slurmd runs it: bare environment, exit status always 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oomlens.cli import main
from oomlens.epilog import runner
from oomlens.epilog.settings import load_settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def _slurmd_env(work_dir: Path, **extra: str) -> dict[str, str]:
    """What slurmd hands an Epilog (no PATH, HOME or LANG), plus PYTHONPATH for this checkout."""
    env = {
        "PYTHONPATH": str(REPO_ROOT),
        "SLURM_JOB_ID": "8",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": str(os.geteuid()),
        "SLURM_JOB_GID": str(os.getegid()),
        "SLURM_JOB_EXIT_CODE": "0",
        "SLURM_JOB_EXIT_CODE2": "0:0",
        "SLURM_JOB_DERIVED_EC": "0",
        "SLURM_JOB_WORK_DIR": str(work_dir),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURMD_NODENAME": "localhost",
        "SLURM_NODELIST": "localhost",
    }
    env.update(extra)
    return env


def _epilog(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", "epilog", "--spool", str(tmp_path / "spool"), *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_healthy_job_from_a_bare_environment(tmp_path: Path) -> None:
    settings = tmp_path / "epilog.toml"
    settings.write_text("budget_seconds = 5\n")
    done = _epilog(tmp_path, _slurmd_env(tmp_path), "--settings", str(settings))
    assert done.returncode == 0
    assert "job 8: skipped" in done.stderr
    (line,) = (tmp_path / "spool" / "epilog.log").read_text().splitlines()
    assert json.loads(line)["action"] == "skipped"


@pytest.mark.parametrize(
    "args",
    [
        ("--settings", "/nonexistent/dir/epilog.toml"),
        ("--hard-limit", "soon"),
        ("--settings", "/etc/passwd"),
    ],
)
def test_bad_arguments_still_exit_0(tmp_path: Path, args: tuple[str, ...]) -> None:
    env = _slurmd_env(tmp_path, SLURM_JOB_EXIT_CODE="256", SLURM_JOB_EXIT_CODE2="1:0")
    done = _epilog(tmp_path, env, *args)
    assert done.returncode == 0, done.stderr
    assert "job 8:" in done.stderr


def test_a_bad_hard_limit_is_logged(tmp_path: Path) -> None:
    env = _slurmd_env(tmp_path)
    done = _epilog(tmp_path, env, "--settings", str(tmp_path / "none.toml"), "--hard-limit", "abc")
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "spool" / "epilog.log").read_text().splitlines()
    assert json.loads(line)["problems"][0].startswith("--hard-limit 'abc' is not a positive number")


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit(3), MemoryError, OSError])
def test_anything_raised_inside_still_exits_0(
    monkeypatch: pytest.MonkeyPatch, exception: BaseException
) -> None:
    def explode(*args: Any, **kwargs: Any) -> None:
        raise exception

    monkeypatch.setattr(runner, "run_epilog", explode)
    with pytest.raises(SystemExit) as caught:
        main(["epilog", "--settings", "/nonexistent.toml"])
    assert caught.value.code == 0


def test_check_prints_the_effective_settings(tmp_path: Path) -> None:
    settings = tmp_path / "epilog.toml"
    settings.write_text(
        f'budget_seconds = 12\nmax_log_bytes = "1 GiB"\nspool_dir = "{tmp_path}/s"\n'
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "oomlens",
            "epilog",
            "--check",
            "--settings",
            str(settings),
            "--as-user",
            os.environ.get("USER") or "root",
        ],  # fmt: skip
        env={"PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "budget_seconds = 12.0" in done.stdout.splitlines()
    assert 'max_log_bytes = "1.00 GiB"' in done.stdout.splitlines()
    assert f'spool_dir = "{tmp_path}/s"' in done.stdout.splitlines()
    assert any(line.startswith("# ok: spool:") for line in done.stdout.splitlines())
    # The output is itself a settings file with the same meaning (the defaults it spells out,
    # such as the work-directory patterns the input kinds give, included).
    echoed = tmp_path / "echoed.toml"
    echoed.write_text(done.stdout)
    assert load_settings(echoed).describe() == load_settings(settings).describe()
    assert load_settings(echoed).patterns_in_force() == load_settings(settings).patterns_in_force()


def test_check_fails_on_a_bad_settings_file(tmp_path: Path) -> None:
    settings = tmp_path / "epilog.toml"
    settings.write_text("spool = '/x'\n")
    done = subprocess.run(
        [sys.executable, "-m", "oomlens", "epilog", "--check", "--settings", str(settings)],
        env={"PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"oomlens: {settings}: unknown setting 'spool'")
