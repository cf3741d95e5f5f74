"""``oomlens check`` on inputs that are not a usable config, and on option values without a
unit: one clear line and exit code, in every output format."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize(
    "content", [b'{"zero_optimization": {"stage": 3}', b"[1, 2]", b"\x1f\x8b\x08\x00rest"]
)
def test_json_output_is_a_document_for_a_config_that_cannot_be_read(
    capsys, tmp_path: Path, content: bytes
) -> None:
    config = tmp_path / "ds.json"
    config.write_bytes(content)
    code, out, err = run(capsys, str(config), "--format", "json", "--gpus", "2")
    assert code == 4
    document = json.loads(out)
    assert document["failed"] is True and document["valid"] is False
    assert document["error"]["exit_code"] == 4
    assert document["config"] == str(config)
    assert document["error"]["message"] in err


@pytest.mark.parametrize(
    ("option", "value", "meant"),
    [
        ("--gpu-memory", "24", "24GiB"),
        ("--host-memory", "1,024", "1,024GiB"),
        ("--host-memory", "65536", "65536MiB"),
        ("--host-baseline", "1.5", "1.5GiB"),
        ("--params", "13", "13B"),
        ("--largest-layer", "250", "250B"),
    ],
)
def test_a_bare_number_too_small_for_its_option_is_refused_with_the_unit_meant(
    capsys, tmp_path: Path, option: str, value: str, meant: str
) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1}')
    code, out, err = run(capsys, str(config), "--params", "13B", option, value)
    assert code == 2
    assert out == ""
    assert f"did you mean {meant}" in err


def test_small_values_with_a_unit_and_large_bare_ones_are_taken(capsys, tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}')
    code, out, err = run(
        capsys,
        str(config),
        "--params",
        "2K",
        "--gpu-memory",
        str(24 * 2**30),
        "--host-memory",
        "1MiB",
        "--format",
        "json",
    )
    assert "did you mean" not in err
    document = json.loads(out)
    capacities = {v["kind"]: v["capacity_bytes"] for v in document["verdicts"]}
    assert capacities["gpu"] == 24 * 2**30 and capacities["host"] == 2**20
