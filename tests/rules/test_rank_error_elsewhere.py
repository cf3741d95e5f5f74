"""A worker that exited with a code of its own whose error is not in the inputs: unknown.

torchrun's failure table says ``exitcode: 1`` and, when the worker left no error file (its
entry point was not decorated with ``@record``), puts torch's pointer to the docs in the
``traceback`` field; the worker's traceback went to its own stderr.  When that stderr is not
among the inputs (``--redirects``, ``--log-dir``, a paste of the launcher's lines only) nothing
says what the worker died of: not ``not_oom``, and the report says where the output is.
"""

from __future__ import annotations

import re
from pathlib import Path

from oomlens.diagnosis import Verdict
from oomlens.session import analyze
from tests._corpus import case_dir

_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")  # torch and --tee prefixes


def _launcher_lines_only(case: str) -> list[str]:
    """A real torchrun run's console with every line a rank printed removed: what is left when
    the ranks' output went to files (``--redirects 3 --log-dir ...``)."""
    lines = (case_dir(case) / "train.log").read_text().splitlines()
    return [ln for ln in lines if not _RANK_PREFIX.match(ln) and not ln.startswith("[memdebug]")]


def test_a_worker_whose_error_went_elsewhere_is_unknown_and_the_report_says_where(
    tmp_path: Path,
) -> None:
    # generation_oom is a real OOM run; with the ranks' lines gone only torchrun's remain.
    path = tmp_path / "console.log"
    path.write_text("\n".join(_launcher_lines_only("generation_oom")) + "\n")
    report = analyze([path])
    assert report.verdict is Verdict.UNKNOWN
    assert "not in the inputs" in report.verdict_reason
    assert not [d for d in report.diagnoses if d.id == "not_oom" and d.confidence >= 0.5]
    for d in report.diagnoses:  # the launcher's own summing up is no rank's failure
        assert not any("ChildFailedError" in e.text for e in d.evidence if e.supports)
    missing = " ".join(m for d in report.diagnoses for m in d.missing)
    assert "--redirects" in missing and "--log-dir" in missing and "@record" in missing


def test_the_failure_table_alone_is_unknown_and_its_ranks_bound_the_world_size(
    tmp_path: Path,
) -> None:
    # The table of the second node of a 2 x 2 run: global ranks 2 and 3 only.
    table = _launcher_lines_only("activation_memory")
    start = next(i for i, ln in enumerate(table) if "ChildFailedError:" in ln)
    node = [
        re.sub(r"rank      : (\d)", lambda m: f"rank      : {int(m.group(1)) + 2}", ln)
        for ln in table[start + 1 :]
    ]
    path = tmp_path / "paste.txt"
    path.write_text("\n".join(node) + "\n")
    report = analyze([path])
    assert report.verdict is Verdict.UNKNOWN
    assert not [d for d in report.diagnoses if d.id == "not_oom" and d.confidence >= 0.5]
    world = report.facts.world_size
    assert world is not None and world.value == 4 and world.lower_bound
