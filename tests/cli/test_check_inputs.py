"""``oomlens check`` on inputs that are not a usable config, and on option values without a
unit: one clear line and exit code, in every output format."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["check", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_a_config_with_nothing_in_it_is_called_empty(capsys, tmp_path: Path) -> None:
    blank = tmp_path / "zero3.json"
    blank.write_bytes("\ufeff\r\n\t \r\n".encode())
    code, out, err = run(capsys, str(blank))
    assert code == 4
    assert out == ""
    assert err.count("\n") == 1 and "zero3.json: the file holds only white space" in err
    assert "train_batch_size" not in err
