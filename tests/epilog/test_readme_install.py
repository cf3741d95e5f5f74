"""The README's Epilog install steps, run as written (issue 12: an admin on a real slurmd found
that they built the venv with whatever ``python3`` was first on PATH and appended a second
``Epilog=`` to a slurm.conf that had one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _install_block() -> list[str]:
    text = README.read_text()
    start = text.index("Install on every node (admins):")
    block = text[text.index("```sh\n", start) + len("```sh\n") :]
    return block[: block.index("```")].splitlines()


def _slurm_conf_step() -> str:
    lines = _install_block()
    at = next(i for i, line in enumerate(lines) if "slurm.conf" in line)
    step = [lines[at]]
    while step[-1].endswith("\\"):
        at += 1
        step.append(lines[at])
    return "\n".join(step)


def _run_step(conf: Path) -> str:
    script = _slurm_conf_step().replace("/etc/slurm/slurm.conf", str(conf))
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    return done.stdout


def test_the_slurm_conf_step_never_adds_a_second_epilog(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\nEpilog=/etc/slurm/site-epilog.sh\n")
    said = _run_step(conf)
    assert conf.read_text() == "ClusterName=lab\nEpilog=/etc/slurm/site-epilog.sh\n"
    assert "oomlens-epilog.sh" in said


def test_the_slurm_conf_step_adds_the_epilog_once_where_there_is_none(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\n")
    _run_step(conf)
    _run_step(conf)  # run twice, as an admin repeating the steps would
    lines = conf.read_text().splitlines()
    assert [line for line in lines if line.startswith("Epilog=")] == [
        "Epilog=/etc/slurm/oomlens-epilog.sh"
    ]


def test_the_venv_is_built_with_a_named_system_interpreter() -> None:
    venv = next(line for line in _install_block() if " -m venv " in line)
    interpreter = venv.split()[0]
    assert interpreter.startswith("/usr/bin/"), venv  # not a python3 found first on PATH
