"""A ds_config with tens of thousands of unknown keys: bounded work, bounded reports, the
count kept."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from oomlens.analysis.config_hazards import MAX_COMPARED
from oomlens.analysis.ds_validation import read_and_check
from oomlens.analysis.findings_cap import MAX_LISTED
from oomlens.cli import main
from oomlens.ingest.ds_config import read_ds_config

UNKNOWN = 6_000


def _write(tmp_path: Path, block: str) -> Path:
    """A config of ``UNKNOWN`` unknown keys, at the top level or in ``block``."""
    config: dict[str, object] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
    }
    if block == "top":
        config["gradient_clippin"] = 1.0  # a misspelling before them, still found
    target = config if block == "top" else config.setdefault(block, {})
    assert isinstance(target, dict)
    target.update({f"x_{i:05x}_opt": [i] for i in range(UNKNOWN)})
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("validator", [True, False], ids=["deepspeed", "oomlens"])
@pytest.mark.parametrize("block", ["top", "zero_optimization"])
def test_unknown_keys_are_listed_up_to_the_cap_and_counted(
    tmp_path: Path, block: str, validator: bool
) -> None:
    reading = read_and_check(read_ds_config(_write(tmp_path, block)), prefer_deepspeed=validator)
    findings = [*reading.problems, *reading.hazards]
    codes = {finding.code for finding in findings}
    for code in codes:
        assert sum(1 for finding in findings if finding.code == code) <= MAX_LISTED + 1, code
    if block == "top":
        unknown = [h for h in reading.hazards if h.code == "unknown_top_level_key"]
        assert f"{UNKNOWN - MAX_LISTED:,} more like the {MAX_LISTED} above" in unknown[-1].message
        assert any(h.code == "misspelled_top_level_key" for h in reading.hazards)
    else:
        assert sum(problem.count for problem in reading.problems) == UNKNOWN
        assert reading.problems[-1].key_path == "zero_optimization"


def test_no_more_than_max_compared_keys_go_through_difflib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = difflib.get_close_matches

    def counted(*args: object, **kwargs: object) -> list[str]:
        calls.append(args[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    read_and_check(read_ds_config(_write(tmp_path, "top")), prefer_deepspeed=False)
    assert len(calls) == MAX_COMPARED


def test_check_json_of_such_a_config_is_small_and_its_headline_counts_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_write(tmp_path, "zero_optimization"))
    with pytest.raises(SystemExit) as info:
        main(["check", config, "--format", "json", "--validator", "oomlens"])
    out, err = capsys.readouterr()
    assert info.value.code == 4
    assert f"INVALID ({UNKNOWN:,} problem(s))" in err
    assert len(out) < 50_000
    assert len(json.loads(out)["problems"]) == MAX_LISTED + 1
