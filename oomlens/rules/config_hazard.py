"""Config hazards: settings DeepSpeed accepts that waste or risk memory, reported below the
causes (they explain what could go wrong, not necessarily what did)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity, a_text, in_bytes
from oomlens.facts.config import ConfigSeverity
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import Rejection
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import quote, size
from oomlens.rules.thresholds import Thresholds

_SEVERITY = {
    ConfigSeverity.ERROR: Severity.MEDIUM,
    ConfigSeverity.HIGH: Severity.MEDIUM,
    ConfigSeverity.MEDIUM: Severity.LOW,
    ConfigSeverity.LOW: Severity.LOW,
    ConfigSeverity.INFO: Severity.INFO,
}


_CONFIDENCE = {
    ConfigSeverity.ERROR: 0.45,
    ConfigSeverity.HIGH: 0.4,
    ConfigSeverity.MEDIUM: 0.3,
    ConfigSeverity.LOW: 0.2,
    ConfigSeverity.INFO: 0.15,
}


SPEC = RuleSpec(
    id="config_hazard",
    title="Config hazard",
    severity=Severity.LOW,
    explanation=(
        "A setting DeepSpeed accepts but that is probably not what was meant, or that spends "
        "memory the card may not have: a misspelled block that silently falls back to its "
        'default, Hugging Face "auto" values outside the HF integration (DeepSpeed drops '
        "them, which can turn bf16 off), fp32 training, buckets larger than the card can spare."
    ),
    verify="oomlens check ds_config.json (with --params and --gpus) no longer lists the hazard.",
    precedence=160,
)


class ConfigHazardRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        yield from self._named_by_the_failure(facts)
        if facts.config is None:
            return
        for hazard in facts.config.reading.hazards:
            evidence = [
                Evidence(
                    EvidenceKind.CONFIG,
                    ", ".join(hazard.key_paths) or hazard.code,
                    source,
                    hazard.message,
                )
                for source in hazard.sources[:1]
            ]
            if not evidence:
                evidence = [
                    Evidence(
                        EvidenceKind.CONFIG,
                        ", ".join(hazard.key_paths) or hazard.code,
                        facts.config.reading.effective.source,
                        hazard.message,
                    )
                ]
            at_stake = f" ({size(hazard.bytes_at_stake)} at stake)" if hazard.bytes_at_stake else ""
            yield Diagnosis(
                id=SPEC.id,
                title=f"{SPEC.title}: {hazard.code.replace('_', ' ')}",
                severity=_SEVERITY[hazard.severity],
                confidence=_CONFIDENCE[hazard.severity],
                summary=hazard.message + at_stake,
                evidence=tuple(evidence),
                figures={
                    "code": a_text(hazard.code),
                    "bytes_at_stake": in_bytes(hazard.bytes_at_stake),
                },
            )

    @staticmethod
    def _named_by_the_failure(facts: RunFacts) -> Iterator[Diagnosis]:
        """The failure's own message blames a memory setting ("No available memory for the
        cache blocks. Try increasing `gpu_memory_utilization`"): the framework refused to run
        with the budget it was given.  A cause, not a hazard in waiting."""
        for refused in facts.signals.config_rejections:
            if refused.kind is not Rejection.SETTING or not refused.keys:
                continue
            name = refused.keys[0]
            yield SPEC.diagnose(
                title=f"{SPEC.title}: {name}",
                severity=Severity.HIGH,
                confidence=0.55,
                summary=f"the framework stopped for lack of memory under its own setting {name}: "
                + quote(refused.text, 200),
                evidence=(
                    Evidence(
                        EvidenceKind.LOG,
                        quote(refused.text),
                        refused.source,
                        f"the error itself names {name} as the setting to change",
                        verbatim=True,
                    ),
                ),
                fixes=(
                    Fix(
                        f"Change {name} as the error says (and the settings that share the same "
                        "memory: the model length, the batch of sequences), then restart.",
                        cost="a smaller cache or batch",
                    ),
                ),
                rank=refused.source.rank,
            )
            return


RULE = ConfigHazardRule()
