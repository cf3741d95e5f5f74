"""The training phase of a failure when the log reader's phase table says nothing.

The reader classifies a traceback by its frames (``oomlens.ingest.log.traceback``), library
frames through the library knowledge (``oomlens.knowledge``: a state-dict loader is model
loading, the HF Trainer padding predictions together is evaluation); this module adds what
only says where memory went once the outer frames are gone and could mean another phase with
them: accelerate placing a weight on the device (model loading).  ``phase_of(event)`` is the
reader's phase, or, when that is unknown, what those inner frames show; ``phase_site(event)``
is where the frame that shows it was read.

``cut_tracebacks(facts)`` are the tracebacks cut before their exception that the reader placed
by their frames (or by the call on the innermost frame's current line), when the inputs hold no
error at all: what failed is lost, where it failed is not.
"""

from __future__ import annotations

from dataclasses import replace

from oomlens.facts import SourceRef
from oomlens.facts.log import ExceptionEvent, Frame, OomEvent, Phase
from oomlens.facts.run import RunFacts
from oomlens.knowledge.frames import frame_role

_INNER = (
    # Accelerate placing a weight on the device: loading a model (dispatch), but also what its
    # offload hooks do in every forward, so it places an event only when nothing else does.
    # The loading and evaluation-padding functions this table held are the library
    # knowledge's (``_INNER_ROLES``).
    (Phase.MODEL_INIT, frozenset({"set_module_tensor_to_device"}), ""),
)


_INNER_ROLES = {
    "model_load": Phase.MODEL_INIT,
    "checkpoint_load": Phase.MODEL_INIT,
    "evaluation": Phase.EVALUATION,
}
"""The library knowledge's roles that place an event from an inner frame alone: loading weights
(onto the device), gathering or padding evaluation outputs."""


def _inner_phase(frame: Frame) -> Phase | None:
    known = frame_role(frame.filename, frame.function)
    if known is not None and known.role in _INNER_ROLES:
        return _INNER_ROLES[known.role]
    path = frame.filename.replace("\\", "/")
    for phase, functions, where in _INNER:
        if frame.function in functions and where in path:
            return phase
    return None


def _inner(event: OomEvent) -> tuple[Phase, Frame] | None:
    """The innermost frame that places ``event`` when the reader could not, with its phase."""
    if event.phase is not Phase.UNKNOWN or event.traceback is None:
        return None
    for frame in reversed(event.traceback.frames):
        phase = _inner_phase(frame)
        if phase is not None:
            return phase, frame
    return None


def phase_of(event: OomEvent) -> tuple[Phase, str | None]:
    """The phase of ``event`` and the frame that shows it (``file:line in function``)."""
    inner = _inner(event)
    if inner is None:
        return event.phase, event.phase_evidence
    phase, frame = inner
    return phase, f"{frame.filename}:{frame.line} in {frame.function}"


def phase_site(event: OomEvent) -> SourceRef:
    """Where the frame that ``phase_of`` quotes was read (its ``File ...`` line); the
    traceback's start, else the error, when that line is unknown (an error file, a capture)."""
    inner = _inner(event)
    if inner is not None and inner[1].at is not None and event.traceback is not None:
        return replace(event.traceback.source, line=inner[1].at, rank=event.source.rank)
    if inner is None and event.phase_source is not None:
        return event.phase_source
    return event.traceback.source if event.traceback is not None else event.source


def cut_tracebacks(facts: RunFacts) -> tuple[ExceptionEvent, ...]:
    """Every traceback cut before its exception whose place its frames (or the call on its
    innermost frame's current line) show, when nothing else in the inputs failed: no OOM, no
    kill, no exception with a message of its own.  What failed is lost, where it failed is
    not."""
    if facts.oom_events() or facts.kernel_oom_kills() or facts.sigkilled_at():
        return ()
    if any(not e.peer_failure and e.text.strip() for e in facts.exceptions()):
        return ()
    return tuple(e for log in facts.logs for e in log.partial_tracebacks if e.phase_evidence)
