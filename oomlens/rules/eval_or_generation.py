"""Evaluation or generation (the KV cache) ran out after training steps had fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.log import OomEvent, Phase
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import (
    oom_evidence,
    oom_figures,
    oversized_evidence,
    phase_evidence,
)
from oomlens.rules.common.fit import prompts_fix
from oomlens.rules.common.message import allocator_oom, fullness, near_full, oversized
from oomlens.rules.common.timeline import CUT_PLACE_CONFIDENCE, phase, steps_completed_before
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="eval_or_generation",
    title="Evaluation or generation ran out of memory",
    severity=Severity.HIGH,
    explanation=(
        "Evaluation and generation run next to the training state: parameters, gradients "
        "buffers and optimizer states stay on the GPU while the evaluation batch (often larger "
        "than the training batch) or the generation KV cache (which grows with every token: "
        "2 x layers x hidden x batch x tokens x bytes per value) is added on top."
    ),
    verify=(
        "the evaluation or generation call completes; torch.cuda.max_memory_allocated() measured "
        "around that call alone stays below the card's limit."
    ),
    thresholds=("capacity_near_full_fraction",),
    precedence=50,
)


_PLACED_BY_A_LINE_CONFIDENCE = 0.6
"""The most an error with no traceback is named evaluation or generation from the line above it
(``generate()``'s own log line, the code that raised): a frame says where the error was raised,
a line only what ran last (a training forward that follows a generation prints nothing either:
an RLHF step after its rollouts)."""

_ACCUMULATING_FRAMES = frozenset(
    {"nested_concat", "torch_pad_and_concatenate", "_nested_gather", "gather_for_metrics"}
)
"""transformers' evaluation loop concatenating every batch's outputs on the device
(``trainer_pt_utils.nested_concat``) until ``eval_accumulation_steps`` moves them to the CPU."""


def _computed_fixes(facts: RunFacts, event: OomEvent) -> Iterator[Fix]:
    """Fixes with their values: the prompts per ``generate`` that fit; for an evaluation
    that concatenates every batch's outputs on the GPU, moving them to the CPU each step (no
    eval batch fits an accumulation that grows with the dataset)."""
    account = facts.account
    if account is not None and phase(facts, event) is Phase.GENERATION:
        computed = prompts_fix(account, facts.context)
        if computed is not None:
            yield computed
    frames = event.traceback.frames if event.traceback is not None else ()
    if any(f.function in _ACCUMULATING_FRAMES for f in frames):
        yield Fix(
            "Move the accumulated predictions to the CPU after every evaluation step, and keep "
            "only what the metric needs (argmax ids instead of logits).",
            command="--eval_accumulation_steps 1  (and preprocess_logits_for_metrics="
            "lambda logits, labels: logits.argmax(-1))",
            arguments={"--eval_accumulation_steps": "1"},
            cost="a device-to-host copy per evaluation step",
        )


class EvalOrGenerationRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        event = allocator_oom(facts)
        if event is None:
            yield from self._cut_in_evaluation(facts)
            return
        if phase(facts, event) not in (Phase.EVALUATION, Phase.GENERATION):
            return
        n = event.message
        confidence = 0.75
        evidence = [oom_evidence(event)]
        placed = phase_evidence(facts, event)
        if placed is not None:
            evidence.append(placed)
        done = steps_completed_before(facts, event)
        if done:
            confidence += 0.05
            evidence.append(
                Evidence(
                    EvidenceKind.LOG,
                    f"{done} training step(s) completed before it",
                    event.source,
                    "training itself fit; the evaluation/generation did not",
                )
            )
        if near_full(n, thresholds):
            confidence += 0.05
        if event.traceback is None:
            confidence = min(confidence, _PLACED_BY_A_LINE_CONFIDENCE)
        if oversized(n):
            confidence = min(confidence, 0.3)
            evidence.append(oversized_evidence(event))
        what = "generation" if phase(facts, event) is Phase.GENERATION else "evaluation"
        fixes = list(_computed_fixes(facts, event))
        fixes += [
            Fix(
                f"Use a smaller {what} batch than the training batch allows you to assume.",
                command="--per_device_eval_batch_size N (HF) / your eval loader's batch_size",
                cost="longer evaluation",
            ),
        ]
        if phase(facts, event) is Phase.GENERATION:
            fixes.append(
                Fix(
                    "Bound the KV cache: fewer new tokens, fewer prompts per call, or a "
                    "static/offloaded cache.",
                    command="generate(..., max_new_tokens=N) or cache_implementation='offloaded'",
                    cost="shorter outputs or slower generation",
                )
            )
        fixes.append(
            Fix(
                "Run evaluation under torch.inference_mode() and free the training "
                "step's tensors first (optimizer.zero_grad(set_to_none=True)).",
                cost="none",
            )
        )
        yield SPEC.diagnose(
            confidence=confidence,
            summary=(
                f"{what} ran out of GPU memory ({fullness(n)}) after training steps had fit"
                if done
                else f"{what} ran out of GPU memory ({fullness(n)})"
            ),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            rank=event.rank,
            figures=oom_figures(n),
        )

    @staticmethod
    def _cut_in_evaluation(facts: RunFacts) -> Iterator[Diagnosis]:
        """A traceback cut before its exception inside evaluation or generation, and no error
        anywhere: where it failed is known, what failed is not (named low, see
        ``CUT_PLACE_CONFIDENCE``)."""
        cut = facts.signals.cut_in(frozenset({Phase.EVALUATION, Phase.GENERATION}))
        if cut is None or cut.phase_evidence is None:
            return
        what = "generation" if cut.phase is Phase.GENERATION else "evaluation"
        yield SPEC.diagnose(
            confidence=CUT_PLACE_CONFIDENCE,
            summary=f"the traceback stops inside {what}; its error is cut off",
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    cut.phase_evidence,
                    cut.phase_source or cut.source,
                    f"the failure happened during {what}; if it was out of memory, the "
                    + (
                        "KV cache or the generation batch"
                        if what == "generation"
                        else "evaluation batch or the predictions kept across it"
                    )
                    + " is what did not fit",
                ),
            ),
            fixes=(
                Fix(
                    f"Use a smaller {what} batch; keep only what the metrics need "
                    "(eval_accumulation_steps, preprocess_logits_for_metrics) or bound "
                    "max_new_tokens.",
                    cost="longer evaluation or shorter outputs",
                ),
            ),
            missing=("the end of the traceback: its exception line (out of memory or not)",),
        )


RULE = EvalOrGenerationRule()
