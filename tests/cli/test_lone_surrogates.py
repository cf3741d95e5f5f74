"""A config whose JSON holds a lone surrogate escape (``"\\udbff"``: valid JSON, a ``str`` that
no UTF-8 output can hold) is analyzed and checked like any other: every format, on standard
output and in a file, is UTF-8 text that shows the escape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.cli import main
from tests._corpus import case_dir

LOG = case_dir("fragmentation") / "train.log"

# Written as JSON text by hand: json.dumps would escape the surrogate the same way, but the
# point is the escape a file on disk holds.
PLACES = {
    "known key's value": '"offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/\\udbffa"}',
    "unknown key's name": '"\\udc01tag": 1',
    "unknown key's value": '"comment": "\\ude00 low alone, \\ud83d high alone"',
    "unknown top-level key": '"stage": 3}, "\\udfffnote": {"\\udbc0": "\\udc9a"',
}
SHOWN = {"known key's value": "/mnt/\\udbffa"}
"""What the full reports' table of settings shows (DeepSpeed's models refuse a key that is no
valid string: the report says so, without the key; the table leaves unknown keys out)."""


def _config(tmp_path: Path, place: str) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(
        '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, '
        f'"zero_optimization": {{"stage": 3, {PLACES[place]}}}}}',
        encoding="ascii",
    )
    return path


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _assert_utf8(text: str, fmt: str) -> None:
    text.encode("utf-8")  # strict: a surrogate left in the text raises
    if fmt == "json":
        document = json.dumps(json.loads(text), ensure_ascii=False)
        document.encode("utf-8")  # no "\udbff" escape that decodes to a lone surrogate


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_analyze_with_such_a_config_writes_every_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, place: str, fmt: str
) -> None:
    config = str(_config(tmp_path, place))
    code, out, err = _run(capsys, ["analyze", str(LOG), "--config", config, "--format", fmt])
    assert code == 0, err
    _assert_utf8(out, fmt)
    target = tmp_path / f"report.{fmt}"
    code, _, err = _run(
        capsys, ["analyze", str(LOG), "--config", config, "--format", fmt, "-o", str(target)]
    )
    assert code == 0, err
    written = target.read_bytes().decode("utf-8")
    assert written == out
    if fmt in ("markdown", "html") and place in SHOWN:
        assert SHOWN[place] in written


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_check_of_such_a_config_prints_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, place: str, fmt: str
) -> None:
    config = str(_config(tmp_path, place))
    code, out, err = _run(capsys, ["check", config, "--format", fmt, "--params", "1B"])
    assert code in (0, 4), err
    assert "internal error" not in err
    _assert_utf8(out, fmt)
    if fmt == "json":
        assert json.loads(out)["config"] == config
