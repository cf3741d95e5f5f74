"""``activation_memory``: the evidence it cites."""

from __future__ import annotations

from oomlens.session import analyze
from tests._corpus import case_dir


def test_a_zero3_gather_oom_is_not_blamed_on_activations_the_snapshot_does_not_show() -> None:
    # prefetch_overshoot: the failing allocation is a ZeRO-3 parameter gather (its traceback
    # passes through _fetch_sub_module_impl) and the snapshot shows no activations filling the
    # card: the activation cause, whose own evidence said "gathered parameters, not
    # activations, were being allocated", used to follow at 25%; it is not named now.
    for inputs in (
        [case_dir("prefetch_overshoot")],
        [case_dir("prefetch_overshoot") / "train.log"],
    ):
        report = analyze(inputs)
        assert report.top is not None and report.top.id == "prefetch_overshoot"
        assert "activation_memory" not in [d.id for d in report.diagnoses]
