"""Counts and sizes on the command line: a number no float or no memory can hold (``2e309``
reads as an infinite float, ``9e99999999999`` overflows a Decimal, ``1e21`` parameters is no
model) is refused as a usage error, one line and exit 2, never an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.cli import main
from oomlens.errors import ExitCode
from oomlens.units import parse_count, parse_size

ROOT = Path(__file__).resolve().parents[2]

_ABSURD = ["2e309", "9e99999999999", "1e21", "4.5e5000T", "123456789012345678901234567890"]


@pytest.mark.parametrize("value", _ABSURD)
@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("check", "--params"),
        ("check", "--trainable-params"),
        ("check", "--largest-layer"),
        ("check", "--gpu-memory"),
        ("analyze", "--params"),
    ],
)
def test_an_absurd_number_is_a_usage_error(
    command: str, option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1}')

    with pytest.raises(SystemExit) as info:
        main([command, option, value, str(config)])

    _, err = capsys.readouterr()
    assert info.value.code == ExitCode.USAGE
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and option in errors[0], err
    assert "internal error" not in err


@pytest.mark.parametrize("text", ["7B", "1.3e9", "350M", "1e15"])
def test_real_counts_still_parse(text: str) -> None:
    assert 1 <= parse_count(text) <= 10**15


def test_a_size_bound_is_checked_before_the_integer_is_built() -> None:
    with pytest.raises(ValueError, match="larger than any memory"):
        parse_size("7e888888888 GiB", at_most=2**64)
    assert parse_size("80GiB", at_most=2**64) == 80 * 2**30
