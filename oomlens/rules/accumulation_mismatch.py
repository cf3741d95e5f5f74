"""Batch arithmetic: ``train_batch_size = micro_batch_per_gpu x gradient_accumulation_steps x
world_size``.

Two ways it kills a run: DeepSpeed's assertion rejects a triple that does not multiply out,
or - silently - DeepSpeed *derives* the micro batch from a ``train_batch_size`` written for
more GPUs, so each GPU gets a multiple of the micro batch the author tested, and the forward
pass runs out of memory."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_count
from oomlens.facts.log import BatchAssertion, Phase
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import ConfigRejection, Rejection
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import oom_evidence, quote, size
from oomlens.rules.common.message import allocator_oom
from oomlens.rules.common.timeline import phase
from oomlens.rules.thresholds import Thresholds


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def corrected_triples(a: BatchAssertion) -> list[tuple[str, dict[str, int]]]:
    """Ways to make the triple multiply out at the run's world size, each as (what changes,
    ds_config merge patch); the ones that keep the global batch first."""
    train, micro = _as_int(a.train_batch_size), _as_int(a.micro_batch_per_gpu)
    gas, world = _as_int(a.gradient_accumulation_steps), _as_int(a.world_size)
    if None in (train, micro, gas, world) or not micro or not gas or not world:
        return []
    assert train is not None and micro is not None and gas is not None and world is not None
    options: list[tuple[str, dict[str, int]]] = []
    if train % (micro * world) == 0 and train // (micro * world) >= 1:
        options.append(
            (
                f"keep train_batch_size {train} and micro batch {micro}: "
                f"gradient_accumulation_steps = {train // (micro * world)}",
                {"gradient_accumulation_steps": train // (micro * world)},
            )
        )
    if train % (gas * world) == 0 and train // (gas * world) >= 1:
        options.append(
            (
                f"keep train_batch_size {train} and accumulation {gas}: "
                f"train_micro_batch_size_per_gpu = {train // (gas * world)}",
                {"train_micro_batch_size_per_gpu": train // (gas * world)},
            )
        )
    options.append(
        (
            f"keep micro batch {micro} and accumulation {gas}: train_batch_size = "
            f"{micro * gas * world} (changes the global batch from {train})",
            {"train_batch_size": micro * gas * world},
        )
    )
    return options


SPEC = RuleSpec(
    id="accumulation_mismatch",
    title="Batch settings disagree with each other or with the GPU count",
    severity=Severity.HIGH,
    explanation=(
        "DeepSpeed requires train_batch_size = micro batch per GPU x gradient accumulation "
        "steps x world size. Give all three and they must multiply out at the world size the "
        "job runs with, or DeepSpeed stops at startup. Give only two and DeepSpeed derives the "
        "third with floor divisions: a train_batch_size written for 8 GPUs, run on 2, makes "
        "each GPU's micro batch four times larger - and activations grow with it."
    ),
    verify=(
        "DeepSpeed's startup dump prints train_batch_size = micro batch x gradient accumulation "
        "steps x world size at the GPU count the job really runs with."
    ),
    precedence=110,
)


class AccumulationMismatchRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        for log in facts.logs:
            if log.batch_assertions:
                yield self._assertion(log.batch_assertions[0])
                return
        batch = [r for r in facts.signals.config_rejections if r.kind is Rejection.BATCH]
        if batch:
            yield self._rejected(batch[0])
            return
        yield from self._derived_micro(facts)

    @staticmethod
    def _rejected(r: ConfigRejection) -> Diagnosis:
        """A framework refused the batch arithmetic (transformers' DeepSpeed integration, a
        trainer's divisibility check) before any training."""
        listed = ", ".join(r.keys)
        return SPEC.diagnose(
            confidence=0.85 if r.keys or "divisible" in r.text else 0.7,
            summary=(
                f"the batch settings were refused before training: the DeepSpeed config's "
                f"{listed} {'does' if len(r.keys) == 1 else 'do'} not match the trainer's "
                "arguments"
                if r.keys
                else "the batch settings were refused before training: the batch sizes, "
                "accumulation steps and number of processes do not agree"
            ),
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    quote(r.text),
                    r.source,
                    "raised while the trainer checks its batch arithmetic, before any step",
                    verbatim=True,
                ),
            ),
            fixes=(
                Fix(
                    'Let one side derive the batch: set the DeepSpeed batch keys to "auto" '
                    "under the HF Trainer, or make micro batch x accumulation x processes "
                    "equal the global batch (and divisible as the trainer requires) for the "
                    "number of processes the job really runs with.",
                    config_patch={
                        key: "auto"
                        for key in r.keys
                        if key
                        in (
                            "train_batch_size",
                            "train_micro_batch_size_per_gpu",
                            "gradient_accumulation_steps",
                        )
                    }
                    or None,
                    cost="none",
                ),
            ),
            rank=r.source.rank,
        )

    def _assertion(self, a: BatchAssertion) -> Diagnosis:
        fixes = tuple(
            Fix(
                f"Make the batch triple consistent: {text}.",
                config_patch=patch,
                cost="none"
                if "changes the global batch" not in text
                else "a different global batch changes the optimization",
            )
            for text, patch in corrected_triples(a)
        )
        return SPEC.diagnose(
            confidence=0.95,
            summary=(
                f"DeepSpeed rejected the batch settings: train_batch_size {a.train_batch_size} "
                f"!= micro batch {a.micro_batch_per_gpu} x accumulation "
                f"{a.gradient_accumulation_steps} x world size {a.world_size}"
            ),
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    f"AssertionError: Check batch related parameters ... {a.train_batch_size} != "
                    f"{a.micro_batch_per_gpu} * {a.gradient_accumulation_steps} * {a.world_size}",
                    a.source,
                    "DeepSpeed's _batch_assertion, raised before any training",
                ),
            ),
            fixes=fixes,
            rank=a.source.rank,
            figures={
                "train_batch_size": a_count(a.train_batch_size),
                "micro_batch_per_gpu": a_count(a.micro_batch_per_gpu),
                "gradient_accumulation_steps": a_count(a.gradient_accumulation_steps),
                "world_size": a_count(a.world_size),
            },
        )

    def _derived_micro(self, facts: RunFacts) -> Iterator[Diagnosis]:
        if facts.config is None or facts.world_size is None or facts.world_size.lower_bound:
            return  # a micro batch divided by the least world size is not the one that ran
        raw: Mapping[str, object] = facts.config.reading.raw
        if not raw or "train_micro_batch_size_per_gpu" in raw or "train_batch_size" not in raw:
            return
        train = _as_int(raw.get("train_batch_size"))
        gas = _as_int(raw.get("gradient_accumulation_steps", 1))
        world = facts.world_size.value
        if train is None or not gas or world < 1:
            return
        micro = train // gas // world
        if micro < 2:
            return
        event = allocator_oom(facts)
        if event is None or phase(facts, event) not in (Phase.FORWARD, Phase.BACKWARD):
            return
        source = facts.config.reading.effective.source
        evidence = [
            Evidence(
                EvidenceKind.CONFIG,
                f"train_batch_size = {train}, gradient_accumulation_steps = {gas}, "
                "train_micro_batch_size_per_gpu not set",
                source,
                "DeepSpeed derives the micro batch from the GPU count",
            ),
            Evidence(
                EvidenceKind.DERIVED,
                f"micro batch = {train} // {gas} // {world} (world size, "
                f"{facts.world_size.origin}) = {micro}",
                facts.world_size.source,
                f"on {world * 4} GPUs the same config gives {max(1, train // gas // (world * 4))}",
            ),
            oom_evidence(
                event,
                f"the {phase(facts, event).value} pass with micro batch {micro} ran out of GPU "
                "memory",
            ),
        ]
        half = micro // 2
        yield SPEC.diagnose(
            confidence=0.85 if phase(facts, event) is Phase.FORWARD else 0.75,
            summary=(
                f"DeepSpeed derived a micro batch of {micro} per GPU from train_batch_size "
                f"{train} on {world} GPUs, and the {phase(facts, event).value} pass ran out of "
                f"memory "
                f"({size(event.message.allocated_by_pytorch)} allocated)"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    f"Set the micro batch explicitly and let accumulation make up the global "
                    f"batch: {half} x {gas * 2} x {world} = {half * gas * 2 * world}.",
                    config_patch={
                        "train_micro_batch_size_per_gpu": half,
                        "gradient_accumulation_steps": gas * 2,
                    },
                    cost="more accumulation steps per optimizer step; same global batch",
                ),
            ),
            rank=event.rank,
            figures={
                "train_batch_size": a_count(train),
                "gradient_accumulation_steps": a_count(gas),
                "world_size": a_count(world),
                "derived_micro_batch": a_count(micro),
            },
        )


RULE = AccumulationMismatchRule()
