"""The phase of a failure from the innermost frames a paste keeps, where the reader's table has
nothing: a weight loader placing tensors on the device, the HF Trainer padding predictions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from oomlens.derive.failure_site import phase_of, phase_site
from oomlens.facts.log import Frame, OomEvent, Phase
from oomlens.session import gather_facts

FIELD = Path(__file__).resolve().parents[2] / "fixtures" / "field_logs"


def _event_with(frames: tuple[Frame, ...]) -> OomEvent:
    # a real pasted OOM (its traceback holds one Module.to frame), its frames replaced
    facts = gather_facts([FIELD / "alpaca-rlhf-6" / "paste.txt"])
    event = facts.oom_events()[0]
    assert event.traceback is not None
    return replace(
        event,
        phase=Phase.UNKNOWN,
        phase_evidence=None,
        traceback=replace(event.traceback, frames=frames),
    )


def test_the_readers_phase_stands_when_it_has_one() -> None:
    facts = gather_facts([FIELD / "alpaca-rlhf-6" / "paste.txt"])
    event = facts.oom_events()[0]
    assert event.phase is Phase.MODEL_INIT  # Module.to's convert, in the reader's table
    assert phase_of(event) == (event.phase, event.phase_evidence)


def test_a_weight_loader_is_model_loading() -> None:
    site = "/usr/local/lib/python3.10/site-packages/accelerate/utils/modeling.py"
    event = _event_with((Frame(site, 329, "set_module_tensor_to_device"),))
    phase, frame = phase_of(event)
    assert phase is Phase.MODEL_INIT
    assert frame == f"{site}:329 in set_module_tensor_to_device"


def test_padding_predictions_together_is_evaluation() -> None:
    site = "/opt/conda/lib/python3.8/site-packages/transformers/trainer_pt_utils.py"
    event = _event_with((Frame(site, 76, "torch_pad_and_concatenate"),))
    assert phase_of(event)[0] is Phase.EVALUATION


def test_frames_that_say_nothing_leave_it_unknown() -> None:
    event = _event_with((Frame("/home/user/train.py", 12, "main"),))
    assert phase_of(event) == (Phase.UNKNOWN, None)


def test_the_inner_frame_is_cited_where_it_was_read() -> None:
    # audit: the frame was cited at the traceback's start, not at its own line
    site = "/usr/local/lib/python3.10/site-packages/accelerate/utils/modeling.py"
    event = _event_with(
        (
            Frame("/home/user/load.py", 3, "main", at=40),
            Frame(site, 329, "set_module_tensor_to_device", at=42),
        )
    )
    assert event.traceback is not None
    assert phase_site(event) == replace(event.traceback.source, line=42, rank=event.source.rank)
