"""A single request larger than the card can ever serve: a shape, index or dtype bug."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_fraction
from oomlens.facts.log import Frame, OomEvent
from oomlens.facts.oom_balance import LARGEST_DEVICE_BYTES, ROUNDING_BYTES, balance
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import oom_evidence, oom_figures, phase_evidence, size
from oomlens.rules.common.message import allocator_oom
from oomlens.rules.common.model_states import snapshot_oom_evidence, snapshot_ooms
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="oversized_allocation",
    title="One request larger than the card",
    severity=Severity.HIGH,
    explanation=(
        "The allocator asked for more memory in one piece than the whole card has (or nearly "
        "all of it with the card otherwise empty). No batch size, allocator setting or "
        "offload makes room for that: a tensor's shape is far larger than intended. The usual "
        "causes are broadcasting two tensors into an (N, N) result, a sequence length or "
        "vocabulary size read from the wrong place (an attention mask of seq x seq for a huge "
        "seq), an index or a count used as a size, or float64 where float16 was meant."
    ),
    reading=(
        "Compare 'Tried to allocate' with the card's total capacity: a request above it can "
        "never succeed, whatever else the message says."
    ),
    verify=(
        "printing the shapes and dtypes at the failing line shows the intended sizes, and the "
        "request in a repeat of the failure (if any) is a small fraction of the card."
    ),
    thresholds=("oversized_near_card_fraction",),
    precedence=15,
)


_TENSOR_OP_FILES = ("_tensor.py", "tensor.py", "variable.py", "functional.py", "overrides.py")
"""torch's own Python wrappers of tensor operators (``Tensor.__add__``, ``torch.functional``)."""
_TOP_LEVEL_OP_CONFIDENCE = 0.35
"""Where the failure happened is the only sign (the message prints no size): named, low."""


def _tensor_op_frame(frame: Frame) -> bool:
    path = frame.filename.replace("\\", "/")
    if "/torch/" not in path or frame.function == "backward":
        return False
    return path.endswith(_TENSOR_OP_FILES) or "/autograd/_functions/" in path


def _user_statement(frame: Frame) -> bool:
    path = frame.filename.replace("\\", "/")
    return frame.function == "<module>" and not any(
        part in path for part in ("site-packages", "dist-packages", "/torch/")
    )


def top_level_op(event: OomEvent) -> Frame | None:
    """The statement of ``event``'s traceback when the failure is one tensor operation written
    at a script's top level: only module-level frames of the user's files, then (if any)
    torch's own operator wrappers; no model, training loop, data loader or loader frame."""
    tb = event.traceback
    if tb is None or tb.cut or not tb.frames or tb.frames_omitted:
        return None
    users = [f for f in tb.frames if _user_statement(f)]
    if not users or not all(_user_statement(f) or _tensor_op_frame(f) for f in tb.frames):
        return None
    if any(_user_statement(f) for f in tb.frames[len(users) :]):
        return None  # the user's statements must come first, torch's wrappers after them
    return users[-1]


_INCONSISTENT_CONFIDENCE = 0.35
"""A request above a capacity that the message's own allocated figure exceeds: a lead only."""


class OversizedAllocationRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        yield from self._snapshot(facts)
        event = allocator_oom(facts)
        if event is None:
            return
        if event.message.tried_to_allocate is None:
            yield from self._top_level_op(facts)
            return
        n = event.message
        b = balance(n, 0)  # the request against the card: no process to attribute
        share = b.request_share
        if n.message_format == "exabyte":
            confidence = 0.9
            note = "a request of more than 1 EB: no device has that much memory"
        elif b.oversized:
            confidence = 0.85
            note = (
                f"{size(b.request)} requested from a card of {size(b.capacity)}: "
                f"{share or 0:.1f}x the whole card"
            )
        elif (
            share is not None
            and b.allocated is not None
            and b.capacity
            and share >= thresholds.oversized_near_card_fraction
            and b.allocated < (1 - thresholds.oversized_near_card_fraction) * b.capacity
        ):
            confidence = 0.45
            note = (
                f"{size(b.request)} requested in one piece, {share:.0%} of the "
                f"{size(b.capacity)} card, with only {size(b.allocated)} allocated: one tensor "
                "nearly as large as the card"
            )
        else:
            return
        evidence = [oom_evidence(event, note)]
        if b.capacity and b.allocated is not None and b.allocated > b.capacity + ROUNDING_BYTES:
            # The allocator says it holds more than the card has (memory beyond the device:
            # managed memory, a capacity read from another device): the card's size this
            # message gives cannot be the measure of what one request may take.
            confidence = min(confidence, _INCONSISTENT_CONFIDENCE)
            evidence.append(
                Evidence(
                    EvidenceKind.DERIVED,
                    f"{size(b.allocated)} allocated by PyTorch on a card of {size(b.capacity)}",
                    event.source,
                    "the message's own figures disagree: its capacity does not bound the request",
                    supports=False,
                )
            )
        placed = phase_evidence(facts, event)
        if placed is not None:
            evidence.append(placed)
        evidence.append(
            Evidence(
                EvidenceKind.DERIVED,
                "no memory setting serves a request this size",
                event.source,
                "batch size, allocator settings, offload and more GPUs do not change one "
                "tensor's size",
            )
        )
        where = event.traceback.frames[-1] if event.traceback and event.traceback.frames else None
        site = f" ({where.filename}:{where.line} in {where.function})" if where else ""
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"one request of {size(b.request)} on a {size(b.capacity)} card{site}: a "
                "tensor far larger than intended (shape, broadcast, index or dtype)"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Print the shapes and dtypes of the operands at the failing line and find "
                    "the dimension that is far larger than intended (an unintended broadcast "
                    "to (N, N), a length or vocabulary size read from the wrong field, float64 "
                    "instead of float16).",
                    command="CUDA_LAUNCH_BLOCKING=1 python ...  # the traceback then points at "
                    "the exact operation",
                    cost="debugging",
                ),
            ),
            missing=(
                ()
                if event.traceback is not None
                else ("the full traceback of the error: the failing line names the tensor",)
            ),
            rank=event.rank,
            figures={
                **oom_figures(n),
                "request_share_of_card": a_fraction(None if share is None else round(share, 3)),
            },
        )

    @staticmethod
    def _snapshot(facts: RunFacts) -> Iterator[Diagnosis]:
        """A snapshot's OOM (no log message accounts for it) whose request alone is larger
        than the card (``--gpu-memory``) or than any accelerator: the snapshot does not record
        the card's size, so without ``--gpu-memory`` only a request above every card is
        certain."""
        for s in snapshot_ooms(facts):
            if not s.larger_than_card(facts.gpu_memory):
                continue
            card = (
                f"the {size(facts.gpu_memory)} card (--gpu-memory)"
                if facts.gpu_memory
                else f"any accelerator (the largest has {size(LARGEST_DEVICE_BYTES)})"
            )
            yield SPEC.diagnose(
                confidence=0.85,
                summary=(
                    f"one request of {size(s.request)} ({s.where()}), more than {card}: a "
                    "tensor far larger than intended (shape, broadcast, index or dtype)"
                ),
                evidence=(
                    snapshot_oom_evidence(s, f"one request larger than {card}"),
                    Evidence(
                        EvidenceKind.DERIVED,
                        "no memory setting serves a request this size",
                        None,
                        "batch size, allocator settings, offload and more GPUs do not change "
                        "one tensor's size; nor does what other processes held",
                    ),
                ),
                fixes=(
                    Fix(
                        "Print the shapes and dtypes at the request's site and find the "
                        "dimension that is far larger than intended.",
                        cost="debugging",
                    ),
                ),
                rank=s.snapshot.source.rank,
            )

    @staticmethod
    def _top_level_op(facts: RunFacts) -> Iterator[Diagnosis]:
        """A message without sizes whose traceback is one tensor operation at a script's top
        level: no training step, model or data pipeline was running, only that operation, and
        one operation exhausting a GPU is most often a shape far larger than intended (an
        unintended broadcast to (N, N)); the message cannot show the size, so named low."""
        for event in facts.gpu_oom_events():
            statement = top_level_op(event)
            if statement is None:
                continue
            where = f"{statement.filename}:{statement.line}"
            yield SPEC.diagnose(
                confidence=_TOP_LEVEL_OP_CONFIDENCE,
                summary=(
                    f"one tensor operation at the top level of a script ({where}) ran out of "
                    "memory, with no model, training step or data loader running: most often a "
                    "result far larger than intended (a broadcast, a wrong dimension)"
                ),
                evidence=(
                    oom_evidence(event, "the message prints no size"),
                    Evidence(
                        EvidenceKind.LOG,
                        f"the traceback is the statement at {where} and torch's operator code only",
                        event.traceback.source if event.traceback is not None else event.source,
                        "nothing else held or asked for memory at that point",
                    ),
                ),
                fixes=(
                    Fix(
                        "Print the operands' shapes and dtypes at that line: broadcasting "
                        "(N, 1, 1) with (N, 1) makes an (N, N, N)-sized result.",
                        command="print(a.shape, a.dtype, b.shape, b.dtype)  # before the "
                        "failing line",
                        cost="debugging",
                    ),
                ),
                missing=(
                    "the shapes of the failing operation's operands (or a torch build whose "
                    "OOM message prints the request's size)",
                ),
                rank=event.rank,
            )
            return


RULE = OversizedAllocationRule()
