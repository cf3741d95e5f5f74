"""``oomlens triage merge`` of tables made by hand or by an attacker: a cell holding an object,
a list or a huge number is flattened or the table refused with one line, never a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oomlens.cli import main
from oomlens.triage.table import COLUMNS

ROW: dict[str, Any] = {
    **dict.fromkeys(COLUMNS),
    "run": "r",
    "path": "/runs/r",
    "time": "2026-03-01T10:00:00.000Z",
    "time_source": "file",
    "verdict": "gpu_oom",
    "diagnosis": "fragmentation",
    "confidence": 0.7,
    "tried_to_allocate": 1024,
    "figures": {"free_bytes": 1},
}


def _merge(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cells: dict[str, Any]
) -> tuple[int, str, str]:
    table = tmp_path / "shard.jsonl"
    table.write_text(json.dumps({**ROW, **cells}) + "\n", encoding="utf-8")
    outputs = [str(tmp_path / f"merged.{suffix}") for suffix in ("csv", "jsonl", "html")]
    with pytest.raises(SystemExit) as info:
        main(["triage", "merge", str(table), *(x for o in outputs for x in ("-o", o))])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.parametrize(
    "cells",
    [
        {"figures": {"nested": {"deeper": [1, {"x": [2, 3]}]}, "n": 7}},
        {"figures": [["a", 1], {"b": None}]},
        {"summary": {"text": "an object where text goes", "lines": ["a\nb", "\x1b[31m"]}},
        {"knob": ["max_split_size_mb", 128], "phase": {"forward": True}},
        {"free": 10**40, "capacity": "9" * 5000, "allocated_by_pytorch": 1e400},
        {"confidence": "0.25", "first_failed_rank": "3", "problems": 2.0},
    ],
    ids=["nested-figures", "list-figures", "object-summary", "lists", "huge", "as-text"],
)
def test_nested_and_huge_cells_are_flattened(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cells: dict[str, Any]
) -> None:
    code, out, err = _merge(capsys, tmp_path, cells)
    assert code == 0, err
    assert out.startswith("1 run: 1 gpu_oom")
    merged = json.loads((tmp_path / "merged.jsonl").read_text(encoding="utf-8"))
    for name, value in cells.items():
        if isinstance(value, dict | list) and name != "figures":  # flattened to JSON text
            assert merged[name] == json.dumps(value, sort_keys=True, ensure_ascii=False)
    if isinstance(cells.get("figures"), dict):
        assert merged["figures"] == cells["figures"]
    if "free" in cells:  # past int64: missing, as in the tables oomlens writes
        assert merged["free"] is None and merged["capacity"] is None
    if "confidence" in cells:
        read = (merged["confidence"], merged["first_failed_rank"], merged["problems"])
        assert read == (0.25, 3, 2)


@pytest.mark.parametrize(
    ("cells", "said"),
    [
        ({"tried_to_allocate": {"bytes": 1}}, "column 'tried_to_allocate', row 1: an object"),
        ({"confidence": [0.5, 0.6]}, "column 'confidence', row 1: a list, not a number"),
        ({"problems": 2.5}, "column 'problems', row 1: 2.5, not an integer"),
        ({"free": "lots"}, "column 'free', row 1: the text 'lots', not an integer"),
    ],
    ids=["object-int", "list-float", "fraction", "word"],
)
def test_a_cell_that_is_no_number_refuses_the_table_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cells: dict[str, Any], said: str
) -> None:
    code, out, err = _merge(capsys, tmp_path, cells)
    assert code == 3
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "shard.jsonl: cannot be read as a triage table" in err and said in err
