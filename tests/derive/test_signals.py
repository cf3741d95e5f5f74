"""What torchrun's closing signals say about the worker that died."""

from __future__ import annotations

from pathlib import Path

from oomlens.derive.signals import silent_death
from oomlens.session import analyze


def _teardown(tmp_path: Path, pids: list[int]) -> str:
    # torchrun's agent, as transformers-22373 pasted it (rich logging): one line per survivor
    lines = [
        f"           WARNING  Sending process {pid} closing signal SIGTERM          api.py:699"
        for pid in pids
    ]
    path = tmp_path / "paste.txt"
    path.write_text("loading weights file ./llama1/pytorch_model.bin\n" + "\n".join(lines) + "\n")
    death = silent_death(analyze([path]).facts)
    assert death is not None
    return death.text


def test_the_signalled_pid_is_a_survivor_and_the_missing_one_is_named(tmp_path: Path) -> None:
    # The headline quoted 854275 as if it had died: the launcher signals the survivors.
    text = _teardown(tmp_path, [854275, 854276, 854277, 854279, 854280, 854281])
    assert "and 5 more: the launcher stopping the workers still alive" in text
    assert "pid 854278, missing from them, is most likely the one that died" in text


def test_no_pid_is_named_when_the_list_does_not_single_one_out(tmp_path: Path) -> None:
    assert "missing" not in _teardown(tmp_path, [100, 101, 102])
    assert "missing" not in _teardown(tmp_path, [100, 103, 4_000_000])
