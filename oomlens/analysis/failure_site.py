"""The training phase of a failure when the log reader's phase table says nothing.

The reader classifies a traceback by its frames (``oomlens.ingest.log.traceback``).  A paste
often keeps only the innermost frames, which are library internals: the reader's table knows
the common ones (``Module.to``'s ``convert``, the HF Trainer's ``nested_concat``); this module
adds what only says where memory went once the outer frames are gone: a state-dict loader
placing weights on the device (model loading), the HF Trainer padding predictions together
(evaluation).  ``phase_of(event)`` is the reader's phase, or, when that is unknown, what those
inner frames show.
"""

from __future__ import annotations

from oomlens.facts.log import Frame, OomEvent, Phase

_INNER = (
    # Loading weights onto the device.
    (
        Phase.MODEL_INIT,
        frozenset(
            {
                "load_state_dict",
                "_load_from_state_dict",
                "_load_state_dict_into_meta_model",
                "load_model_dict_into_meta",
                "set_module_tensor_to_device",
                "load_checkpoint_in_model",
                "load_checkpoint_and_dispatch",
            }
        ),
        "",
    ),
    # The HF Trainer padding evaluation outputs to one tensor.
    (Phase.EVALUATION, frozenset({"torch_pad_and_concatenate", "nested_truncate"}), ""),
)


def _inner_phase(frame: Frame) -> Phase | None:
    path = frame.filename.replace("\\", "/")
    for phase, functions, where in _INNER:
        if frame.function in functions and where in path:
            return phase
    return None


def phase_of(event: OomEvent) -> tuple[Phase, str | None]:
    """The phase of ``event`` and the frame that shows it (``file:line in function``)."""
    if event.phase is not Phase.UNKNOWN or event.traceback is None:
        return event.phase, event.phase_evidence
    for frame in reversed(event.traceback.frames):
        phase = _inner_phase(frame)
        if phase is not None:
            return phase, f"{frame.filename}:{frame.line} in {frame.function}"
    return Phase.UNKNOWN, None
