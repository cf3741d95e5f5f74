"""What the README promises holds: it stays under 25 KB, the test command says next to it what
it installs and starts and how long it takes, the first screen says what oomlens does and shows
the commands that try it before capture is introduced, and every ``oomlens COMMAND`` in its
code blocks is a command the CLI has, each option it shows one that command's ``--help``
documents (issue 33: the README named an ``oomlens capture`` that did not exist)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from oomlens.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_COMMAND = re.compile(r"(?:^|[\s|;&(`])oomlens ([a-z]+)((?: [^\n#|]*)?)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_the_readme_is_under_25_kb() -> None:
    assert README.stat().st_size < 25_000


def test_the_test_command_says_what_it_installs_starts_and_takes() -> None:
    text = _text()
    at = text.index("bash scripts/test.sh")
    after = text[at : at + 1200]
    for needed in ("chromium", "munge", "slurm-wlm", "SLURM", "minutes"):
        assert needed in after, needed


def test_the_first_screen_says_what_it_does_and_how_to_try_it_before_capture() -> None:
    text = _text()
    first_screen = "\n".join(text.splitlines()[:40])
    assert "out-of-memory" in first_screen
    assert "oomlens analyze" in first_screen and "bash scripts/test.sh" in first_screen
    assert text.index("oomlens capture") > text.index("bash scripts/test.sh")


def _commands() -> list[tuple[str, str]]:
    found = []
    for block in _BLOCK.findall(_text()):
        for line in block.splitlines():
            line = line.removeprefix("$ ")
            found += [(m.group(1), m.group(2)) for m in _COMMAND.finditer(line)]
    return found


def test_every_command_the_readme_shows_exists_with_the_options_it_shows() -> None:
    commands = _commands()
    assert {name for name, _ in commands} >= {"analyze", "check", "capture"}
    runner = CliRunner()
    for name, rest in commands:
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rest):
            assert option in result.output, (name, option)
