"""Every number torch writes into a snapshot has the range of the C++ field it copies: a value
outside it (None, a float, a string, an int past 64 bits or negative where torch's is
unsigned) is refused by the layout check with one line naming the field, never met later as an
internal error of the analysis or the what-if replay."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oomlens.cli import main
from oomlens.errors import ExitCode, InputError
from oomlens.ingest.snapshot import load_snapshot
from tests.assets.snapshots import make_variants as variants

_REAL = variants.load_real("python_expandable")


def _segment(data: dict[str, Any]) -> dict[str, Any]:
    segment: dict[str, Any] = data["segments"][1]
    return segment


def _block(data: dict[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = data["segments"][1]["blocks"][-1]
    return block


def _entry(action: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def pick(data: dict[str, Any]) -> dict[str, Any]:
        trace = data["device_traces"][0]
        entry: dict[str, Any] = next(e for e in reversed(trace) if e["action"] == action)
        return entry

    return pick


_FIELDS: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    *[
        ("segment", _segment, key)
        for key in (
            "device",
            "address",
            "total_size",
            "allocated_size",
            "active_size",
            "requested_size",
            "stream",
        )
    ],
    *[("block", _block, key) for key in ("address", "size", "requested_size")],
    *[("alloc", _entry("alloc"), key) for key in ("addr", "size", "stream", "time_us")],
    ("oom", _entry("oom"), "device_free"),
]
_BAD_VALUES = {
    "none": None,
    "float": 4096.0,
    "text": "4096",
    "digits": 7 * 10**4400,  # past str()'s 4,300-digit limit
    "past_64_bits": 2**64 + 5,
    "negative_huge": -(2**80),
    "bool": True,  # an int to isinstance and to min/max: the column checks must refuse it too
}


@pytest.mark.parametrize("bad", list(_BAD_VALUES), ids=list(_BAD_VALUES))
@pytest.mark.parametrize(
    ("owner", "pick", "key"), _FIELDS, ids=[f"{owner}.{key}" for owner, _, key in _FIELDS]
)
def test_a_numeric_field_out_of_torch_range_is_refused_naming_it(
    owner: str,
    pick: Callable[[dict[str, Any]], dict[str, Any]],
    key: str,
    bad: str,
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(_REAL)
    record = pick(data)
    assert key in record
    record[key] = _BAD_VALUES[bad]
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    text = str(caught.value)
    assert f".{key} is " in text, text
    assert "\n" not in text and len(text) < 400, text


def test_the_real_snapshot_itself_passes() -> None:
    assert load_snapshot(variants.REAL["python_expandable"]).block_count == 30


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_cli_refuses_with_the_no_input_code(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy.deepcopy(_REAL)
    _block(data)["address"] = None
    _entry("alloc")(data)["size"] = 3 * 10**5000
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))

    with pytest.raises(SystemExit) as info:
        main([command, str(path)])

    _, err = capsys.readouterr()
    assert info.value.code == ExitCode.NO_INPUT
    assert "internal error" not in err
    assert ".address is None, not an int" in err


@pytest.mark.parametrize(
    ("pick", "key", "value", "named"),
    [
        (_segment, "segment_type", ["large"], "segment_type"),
        (_segment, "segment_pool_id", (0, 2**64), "segment_pool_id"),
        (_segment, "blocks", {}, "blocks"),
        (_block, "state", ["inactive"], "state"),
        (_block, "state", "freed", "state"),
        (_block, "size", True, "size"),
        (_entry("alloc"), "action", ["alloc"], "has no 'action' string"),
        (_entry("alloc"), "addr", False, "addr"),
    ],
)
def test_unhashable_or_unknown_values_in_a_column_are_named_not_crashed_on(
    pick: Callable[[dict[str, Any]], dict[str, Any]],
    key: str,
    value: object,
    named: str,
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(_REAL)
    pick(data)[key] = value
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    assert named in str(caught.value)
