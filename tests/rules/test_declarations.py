"""Every rule is declared once (``RuleSpec``): found by the engine without being listed, with
its id, title, severity, the thresholds it reads, and its own words for the reader; thresholds
that no rule reads do not exist (a settings file naming one is refused)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

import oomlens.rules
from oomlens.diagnosis import Evidence, EvidenceKind, Severity
from oomlens.errors import UsageError
from oomlens.rules.base import Rule
from oomlens.rules.engine import MACHINERY, RULES
from oomlens.rules.thresholds import Thresholds, load_thresholds

RULES_DIR = Path(oomlens.rules.__file__).parent
NOT_RULES = {"__init__"} | MACHINERY
READ_BY_THE_ENGINE = {"min_confidence_to_report"}
_HELPERS_READING = {
    "near_full": {"capacity_near_full_fraction"},
    "little_stuck": {
        "fragmentation_min_unallocated_bytes",
        "fragmentation_min_unallocated_fraction",
    },
    "others_dominate": {"others_dominate_fraction"},
    "message_balance": {"other_process_self_match_bytes"},
    "demand_exceeds_card": {
        "own_tensors_min_fraction",
        "other_process_unlisted_fraction",
        "other_process_unlisted_min_bytes",
        "fragmentation_min_unallocated_bytes",
        "fragmentation_min_unallocated_fraction",
    },
}


def test_every_rule_module_is_found_and_named_by_its_id() -> None:
    modules = {p.stem for p in RULES_DIR.glob("*.py")} - NOT_RULES
    assert {rule.spec.id for rule in RULES} == modules
    assert all(isinstance(rule, Rule) for rule in RULES)
    assert len({rule.spec.precedence for rule in RULES}) == len(RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.spec.id)
def test_a_rule_reads_exactly_the_thresholds_it_declares(rule: Rule) -> None:
    source = (RULES_DIR / f"{rule.spec.id}.py").read_text()
    read = {a or b for a, b in re.findall(r"\bthresholds\.(\w+)|\bth\.(\w+)", source)}
    for helper, names in _HELPERS_READING.items():
        if re.search(rf"\b{helper}\(", source):
            read |= names
    assert read - READ_BY_THE_ENGINE == set(rule.spec.thresholds)


def test_every_threshold_is_read_by_a_rule_or_the_engine() -> None:
    declared = {name for rule in RULES for name in rule.spec.thresholds} | READ_BY_THE_ENGINE
    assert declared == {f.name for f in fields(Thresholds)}


@pytest.mark.parametrize("gone", ["leak_min_monotonic_fraction", "cache_flush_warning_min"])
def test_a_threshold_no_rule_reads_is_refused_not_ignored(tmp_path: Path, gone: str) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text(f"[thresholds]\n{gone} = 0.5\n")
    with pytest.raises(UsageError, match=f"unknown threshold '{gone}'"):
        load_thresholds(settings)


def test_diagnose_fills_the_declaration_and_keeps_confidence_in_range() -> None:
    spec = RULES[0].spec
    evidence = (Evidence(EvidenceKind.DERIVED, "x"),)
    high = spec.diagnose(confidence=1.3, summary="s", evidence=evidence)
    low = spec.diagnose(confidence=-0.2, summary="s", evidence=evidence, severity=Severity.LOW)
    assert (high.id, high.title, high.severity, high.confidence) == (
        spec.id,
        spec.title,
        spec.severity,
        1.0,
    )
    assert (low.confidence, low.severity) == (0.0, Severity.LOW)
