"""Rules on a real OOM message whose printed limits are zero (found by the fuzzer: a mutated
paste said "a total capacity of 0 GiB"): a rule never divides by a limit of zero, and no rule
fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.session import analyze
from tests._corpus import case_dir

OOM_LINE = 31
"""fragmentation/train.log's torch.OutOfMemoryError line."""


def _log(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    lines = (case_dir("fragmentation") / "train.log").read_text().splitlines(keepends=True)
    line = lines[OOM_LINE - 1]
    for old, new in changes:
        assert old in line
        line = line.replace(old, new)
    lines[OOM_LINE - 1] = line
    log = tmp_path / "train.log"
    log.write_text("".join(lines))
    return log


@pytest.mark.parametrize(
    "changes",
    [
        # fragmentation: 3.02 GiB reserved-unallocated "of the 0 bytes allowed"
        (("6.50 GiB allowed", "0 bytes allowed"),),
        # other_process: another process holds memory on a card of "0 GiB"
        (
            ("6.50 GiB allowed; ", ""),
            ("total capacity of 139.80 GiB", "total capacity of 0 GiB"),
            ("is free. ", "is free. Process 101553 has 1.19 GiB memory in use. "),
        ),
    ],
)
def test_a_zero_limit_fails_no_rule(tmp_path: Path, changes: tuple[tuple[str, str], ...]) -> None:
    report = analyze([_log(tmp_path, *changes)])
    assert report.facts.oom_events()[0].message.total_capacity is not None
    assert "internal_error" not in {d.id for d in report.diagnoses}
