"""The 16-bit checkpoint gather ran rank 0 out of (host) memory."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts import SourceRef
from oomlens.facts.log import OomEvent, Phase
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.advice import CAPTURE_KERNEL
from oomlens.rules.common.evidence import (
    config_evidence,
    leaf_key,
    oom_evidence,
    phase_evidence,
    quote,
)
from oomlens.rules.common.host import host_kill_evidence, host_kill_seen
from oomlens.rules.common.model_states import effective_config
from oomlens.rules.common.timeline import CUT_PLACE_CONFIDENCE, phase, printed_line
from oomlens.rules.thresholds import Thresholds

_SAVE_MARKER = re.compile(
    r"(?i)save_16bit_model|save_checkpoint|is about to be saved|saving (?:the )?(?:16-bit )?"
    r"(?:model|checkpoint|weights|state)|_zero3_consolidated_16bit_state_dict|Saving model weights"
)


_STATE_DICT = re.compile(r"state_dict|save_pretrained|save_checkpoint|_save\b|saving", re.I)


SPEC = RuleSpec(
    id="checkpoint_save_gather",
    title="Out of memory while saving a checkpoint",
    severity=Severity.HIGH,
    explanation=(
        "With stage3_gather_16bit_weights_on_model_save, save_16bit_model() (and HF Trainer's "
        "save under ZeRO-3) gathers every partitioned parameter, module by module, and rank 0 "
        "copies the full 16-bit state dict into host memory before writing it: 2 bytes per "
        "parameter on one process, on top of what training already uses. Large models kill "
        "rank 0 at save time, after hours of training."
    ),
    verify=(
        "the checkpoint save completes without a kernel OOM kill on rank 0's node; consolidate "
        "the partitioned checkpoint offline with DeepSpeed's zero_to_fp32.py."
    ),
    precedence=100,
)


class CheckpointSaveRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        evidence: list[Evidence] = []
        confidence = 0.0
        save_events = [e for e in facts.oom_events() if phase(facts, e) is Phase.CHECKPOINT_SAVE]
        said = self._said_while_saving(facts)
        if said is not None and not save_events:
            event, line = said
            evidence.append(
                oom_evidence(
                    event,
                    "the line that reports the error says it was building the state dict "
                    "(saving): " + quote(line, 160),
                )
            )
            confidence = 0.6
        elif save_events:
            event = save_events[0]
            evidence.append(oom_evidence(event, "the failure is inside a checkpoint save"))
            placed = phase_evidence(facts, event)
            if placed is not None:
                evidence.append(placed)
            confidence = 0.75
        else:
            marker = self._save_marker_in_tail(facts)
            cut = self._cut_in_a_save(facts) if marker is None else None
            if cut is not None:
                yield cut
                return
            if marker is None:
                return
            kill_evidence, kill_confidence, _ = host_kill_evidence(facts)
            if not kill_confidence or facts.gpu_oom_events():
                return
            evidence.append(marker)
            evidence.extend(kill_evidence)
            confidence = 0.45 + kill_confidence * 0.3
        effective = effective_config(facts)
        fixes = []
        gather = effective.zero.gather_16bit_weights_on_model_save if effective else None
        if gather is not None:
            evidence.append(
                config_evidence(
                    gather, "rank 0 gathers the full 16-bit model" if gather.value else ""
                )
            )
            if gather.value:
                confidence += 0.1
                fixes.append(
                    Fix(
                        "Save the partitioned checkpoint instead and consolidate it offline, where "
                        "memory is plentiful.",
                        config_patch={"zero_optimization": {leaf_key(gather): False}},
                        command=(
                            "engine.save_checkpoint(dir); then python zero_to_fp32.py dir out.bin"
                        ),
                        cost="a conversion step after training",
                    )
                )
        fixes.append(
            Fix(
                "Give rank 0's node enough host memory for 2 bytes per parameter on top "
                "of training, or save less often.",
                cost="hardware",
            )
        )
        yield SPEC.diagnose(
            confidence=confidence,
            summary="the run died while gathering the model for a checkpoint save",
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            missing=() if (host_kill_seen(facts) or save_events) else (CAPTURE_KERNEL,),
        )

    @staticmethod
    def _cut_in_a_save(facts: RunFacts) -> Diagnosis | None:
        """A traceback cut before its exception, inside a checkpoint save (its frames, or the
        call on its innermost frame's highlighted line), and no error anywhere else: what
        failed is lost, where it failed says a save.  Saving is where a run that trained fine
        runs out (a 16-bit gather, a state dict built on the GPU), so it is named, low."""
        cut = facts.signals.cut_in(frozenset({Phase.CHECKPOINT_SAVE}))
        if cut is None or cut.phase_evidence is None:
            return None
        return SPEC.diagnose(
            confidence=CUT_PLACE_CONFIDENCE + 0.05,  # a save fails for memory more than most
            summary="the traceback stops inside a checkpoint save; its error is cut off",
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    cut.phase_evidence,
                    cut.phase_source or cut.source,
                    "the failure happened while saving; if it was out of memory, the save's "
                    "gather or state dict is what did not fit",
                ),
            ),
            fixes=(
                Fix(
                    "Move the model to the CPU (or gather it there) before saving, or save "
                    "the partitioned checkpoint and consolidate it offline.",
                    cost="a slower save",
                ),
            ),
            missing=(
                "the end of the traceback: its exception line (out of memory or not)",
                CAPTURE_KERNEL,
            ),
        )

    @staticmethod
    def _said_while_saving(facts: RunFacts) -> tuple[OomEvent, str] | None:
        """A GPU OOM whose own line says a save was under way (FSDP's "Failed to clone()
        tensor ... state_dict" warning, a save_pretrained message around it)."""
        for event in facts.gpu_oom_events():
            line = printed_line(facts, event.source)
            if line is None:
                continue
            head = line[: max(0, line.find(event.message.text[:40]))] or line
            if _STATE_DICT.search(head):
                return event, head
        return None

    @staticmethod
    def _save_marker_in_tail(facts: RunFacts) -> Evidence | None:
        for log in facts.logs:
            for number, text in reversed(log.tail):
                if _SAVE_MARKER.search(text):
                    return Evidence(
                        EvidenceKind.LOG,
                        quote(text),
                        SourceRef(log.path, number, log.layout_rank),
                        "the last thing the run did was saving a checkpoint",
                        verbatim=True,
                    )
        return None


RULE = CheckpointSaveRule()
