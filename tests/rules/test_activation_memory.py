"""``activation_memory``: the evidence it cites."""

from __future__ import annotations

from oomlens.session import analyze
from tests._corpus import case_dir


def test_the_zero3_gather_against_activations_cites_the_gathers_frame() -> None:
    # audit: the item said "the failing allocation is a ZeRO-3 parameter gather" and cited the
    # OOM message's line, which says nothing of a gather: the traceback's frames show it
    log = case_dir("prefetch_overshoot") / "train.log"
    printed = log.read_text().splitlines()
    report = analyze([case_dir("prefetch_overshoot")])
    (activations,) = [d for d in report.diagnoses if d.id == "activation_memory"]
    (against,) = [e for e in activations.evidence if not e.supports]
    assert against.source is not None and against.source.line is not None
    assert "ZeRO-3 parameter gather" in against.text
    line = printed[against.source.line - 1]  # the gather's own frame
    assert 'File "' in line and ", in _fetch_sub_module_impl" in line
    assert "_fetch_sub_module_impl" in against.text
