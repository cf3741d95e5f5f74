"""A config DeepSpeed refuses (its own validation, or oomlens' restatement of it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Fix, Severity
from oomlens.facts.config import ConfigSeverity
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import ConfigRejection, Rejection
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.common.evidence import quote
from oomlens.rules.thresholds import Thresholds

SPEC = RuleSpec(
    id="config_invalid",
    title="DeepSpeed rejects this config",
    severity=Severity.HIGH,
    explanation=(
        "DeepSpeed validates its config when the engine starts (pydantic models for the ZeRO, "
        "offload and precision blocks, and the batch arithmetic): an invalid config stops the "
        "job before training. oomlens runs the same checks."
    ),
    verify=(
        "oomlens check ds_config.json exits 0 before the launch, and DeepSpeed prints its "
        "configuration dump without an error."
    ),
    precedence=150,
)


class ConfigInvalidRule(Rule):
    spec: ClassVar[RuleSpec] = SPEC

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterator[Diagnosis]:
        refused = [r for r in facts.signals.config_rejections if r.kind is Rejection.SCHEMA]
        if refused:
            yield self._refused(refused[0])
            return
        if facts.config is None:
            return
        if any(log.batch_assertions for log in facts.logs):
            return  # the batch rule explains it with the run's own numbers
        errors = [
            p
            for p in facts.config.reading.problems
            if p.severity is ConfigSeverity.ERROR and p.code != "batch_mismatch"
        ]
        if not errors:
            return
        failed = facts.has_failure_evidence()
        yield SPEC.diagnose(
            confidence=0.85 if failed else 0.4,
            summary=f"{len(errors)} setting(s) DeepSpeed refuses: "
            + "; ".join(f"{p.key_path}: {p.message}" for p in errors[:3]),
            evidence=tuple(
                Evidence(
                    EvidenceKind.CONFIG,
                    f"{p.key_path}: {p.message} ({p.code}, checked by {p.validator})",
                    p.source,
                )
                for p in errors[:5]
            ),
            fixes=(
                Fix(
                    "Fix the listed keys; `oomlens check CONFIG` re-validates before launch.",
                    command="oomlens check ds_config.json",
                    cost="none",
                ),
            ),
        )

    @staticmethod
    def _refused(r: ConfigRejection) -> Diagnosis:
        """The run's own output shows a config model refusing a key or a value."""
        what = f"{r.model} refused " if r.model else "the config was refused: "
        return SPEC.diagnose(
            confidence=0.85,
            summary=what + quote(r.text.split("\n", 1)[-1], 160),
            evidence=(
                Evidence(
                    EvidenceKind.LOG,
                    quote(r.text),
                    r.source,
                    "the config's validation failed: an unknown key, or a value of the wrong "
                    "type (often a key from a newer version, or a removed one)",
                    verbatim=True,
                ),
            ),
            fixes=(_to_auto(r.keys) if r.keys else _fix_the_keys(),),
            rank=r.source.rank,
        )


def _fix_the_keys() -> Fix:
    return Fix(
        "Fix the listed keys (remove unknown ones, give the type the model expects), or use "
        "the DeepSpeed/framework version the config was written for; `oomlens check CONFIG` "
        "re-validates before launch.",
        command="oomlens check ds_config.json",
        cost="none",
    )


def _to_auto(keys: tuple[str, ...]) -> Fix:
    """transformers' listing of DeepSpeed keys that disagree with TrainingArguments: "auto"
    lets the Trainer fill each from its own arguments (the error's own advice); the listing
    names only keys that are not "auto" already."""
    patch: dict[str, Any] = {}
    for key in keys:
        *parents, leaf = key.split(".")
        node = patch
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break  # a key listed with one of its own parents: the parent's "auto" holds
            node = child
        else:
            node.setdefault(leaf, "auto")
    return Fix(
        'Set the listed keys to "auto": the HF Trainer then fills them from '
        "TrainingArguments, so the two cannot disagree.",
        config_patch=patch,
        cost="none",
    )


RULE = ConfigInvalidRule()
