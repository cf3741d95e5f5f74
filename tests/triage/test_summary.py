"""The triage summary on a terminal: wrapped to its width, groups hanging under their label."""

from __future__ import annotations

import pandas

from oomlens.triage.summary import render_summary
from oomlens.triage.table import COLUMNS, normalize

LONG_RUN = "a-rather-long-run-directory-name-for-prefetch_overshoot-2026-11-30T06-33-53"


def _table() -> pandas.DataFrame:
    rows = [dict.fromkeys(COLUMNS) for _ in range(12)]
    for n, row in enumerate(rows):
        row.update(
            run=f"{LONG_RUN}-{n}",
            path=f"/runs/{LONG_RUN}-{n}",
            time=f"2026-11-30T06:{n:02d}:00.000Z",
            verdict="gpu_oom",
            diagnosis="prefetch_overshoot",
            knob="zero_optimization.stage3_max_live_parameters, "
            "zero_optimization.stage3_max_reuse_distance",
            group="gpu_oom/prefetch_overshoot @ zero_optimization.stage3_max_live_parameters, "
            "zero_optimization.stage3_max_reuse_distance",
        )
    return normalize(pandas.DataFrame(rows, columns=list(COLUMNS)))


def test_on_a_terminal_the_summary_wraps_and_groups_hang_under_their_label() -> None:
    # The summary had lines of 150 columns and more: a group's knob and its newest run.
    text = render_summary(_table(), width=80)
    lines = text.splitlines()
    over = [line for line in lines if len(line) > 80]
    assert all(" " not in line.strip() for line in over)  # only a word longer than a line
    start = next(i for i, line in enumerate(lines) if line.startswith("  12  gpu_oom/"))
    assert lines[start + 1].startswith(" " * 6) and not lines[start + 1].startswith(" " * 7)
    # the same words, in the same order, as the unwrapped summary
    assert text.split() == render_summary(_table()).split()


def test_without_a_width_each_group_is_one_line() -> None:
    lines = render_summary(_table()).splitlines()
    assert any(line.startswith("  12  gpu_oom/") and len(line) > 150 for line in lines)
