"""The registries keep their promise: adding a rule is adding one module and its card
(``templates/rules/<id>.html``); adding an input kind is adding one module (its label and the
reason it gives for a file are its own words: no template, no list to edit).  Each is checked
by writing the files into the package for real and running ``oomlens analyze`` in a fresh
process, and nothing else is touched.  The kind here is a plain-text kind that checks content
before every built-in kind (precedence 1): JSON documents are still decided among the JSON
kinds (the precedence trap: a text kind ahead of them used to refuse every JSON file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import oomlens
from tests._corpus import case_dir

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(oomlens.__file__).resolve().parent
pytestmark = pytest.mark.skipif(
    PACKAGE.parent != REPO or not os.access(PACKAGE / "rules", os.W_OK),
    reason="needs the checkout's own package, writable (an editable install)",
)

RULE_MODULE = '''"""A dummy rule: every run that printed an allocator OOM gets it."""
from collections.abc import Iterable
from typing import ClassVar

from oomlens.diagnosis import Diagnosis, Evidence, EvidenceKind, Severity
from oomlens.facts.run import RunFacts
from oomlens.rules.base import Rule, RuleSpec
from oomlens.rules.thresholds import Thresholds


class ZzDummyRule(Rule):
    spec: ClassVar[RuleSpec] = RuleSpec(
        id="zz_dummy_rule",
        title="A dummy cause",
        severity=Severity.LOW,
        explanation="Written by a test to show that a rule is one module and one card.",
        precedence=99_999,
    )

    def evaluate(self, facts: RunFacts, thresholds: Thresholds) -> Iterable[Diagnosis]:
        event = facts.first_gpu_oom()
        if event is not None:
            yield self.spec.diagnose(
                confidence=0.3,
                summary="the dummy rule saw the OOM",
                evidence=(Evidence(EvidenceKind.LOG, "dummy", event.source),),
            )


RULE = ZzDummyRule()
'''
RULE_CARD = """{% extends "rules/_rule.html" %}
{% block card_extra %}<p>zz-dummy-card</p>{% endblock %}
"""
KIND_MODULE = '''"""A dummy input kind: a plain-text manifest checked before every other kind."""
from typing import ClassVar

from oomlens.ingest.kinds.base import FoundInput, InputKind, Reading, ReadOptions, Sample


class ZzDummyKind(InputKind):
    id: ClassVar[str] = "zz_dummy_kind"
    label: ClassVar[str] = "a dummy manifest"
    slot: ClassVar[str] = "zz_manifests"
    precedence: ClassVar[int] = 1
    order: ClassVar[int] = 999
    reader: ClassVar[str] = "json"

    def recognise(self, sample: Sample) -> str | None:
        return "a ZZ-MANIFEST line" if sample.text.startswith("ZZ-MANIFEST") else None

    def read(self, found: FoundInput, options: ReadOptions) -> Reading:
        with open(found.path, encoding="utf-8") as handle:
            return Reading((handle.read(),), "dummy manifest")


KIND = ZzDummyKind()
'''


@contextmanager
def _added(files: dict[Path, str]) -> Iterator[None]:
    assert not any(path.exists() for path in files)
    try:
        for path, text in files.items():
            path.write_text(text)
        yield
    finally:
        for path in files:
            path.unlink(missing_ok=True)


def _analyze(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "oomlens", "analyze", *args, "--format", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 2, 3), done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def test_a_new_rule_is_one_module_and_one_card(tmp_path: Path) -> None:
    log = case_dir("fragmentation") / "train.log"
    html = tmp_path / "report.html"
    module = PACKAGE / "rules" / "zz_dummy_rule.py"
    card = REPO / "templates" / "rules" / "zz_dummy_rule.html"
    before = _analyze(str(log))
    with _added({module: RULE_MODULE, card: RULE_CARD}):
        after = _analyze(str(log), "--html", str(html))
    ids = [d["id"] for d in after["diagnoses"]]  # type: ignore[attr-defined]
    assert "zz_dummy_rule" in ids
    assert "zz_dummy_rule" not in [d["id"] for d in before["diagnoses"]]  # type: ignore[attr-defined]
    assert "zz-dummy-card" in html.read_text()
    assert after["verdict"] == before["verdict"]


def test_a_new_input_kind_is_one_module_whatever_its_precedence(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    crash = case_dir("accumulation_mismatch")
    (run / "train.log").write_bytes((crash / "train.log").read_bytes())
    (run / "ds_config.json").write_bytes((crash / "ds_config.json").read_bytes())
    (run / "error.json").write_text(
        json.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": {}}})
    )
    (run / "manifest.txt").write_text("ZZ-MANIFEST v1\ncommand: train.py\n")
    module = PACKAGE / "ingest" / "kinds" / "zz_dummy_kind.py"
    before = _analyze(str(run))
    with _added({module: KIND_MODULE}):
        after = _analyze(str(run))
    kinds_of = {
        Path(str(i["path"])).name: i["kind"]
        for i in after["inputs"]  # type: ignore[attr-defined]
    }
    assert kinds_of["manifest.txt"] == "zz_dummy_kind"
    # a text kind checked first takes nothing from the JSON kinds
    assert kinds_of["ds_config.json"] == "ds_config"
    assert kinds_of["error.json"] == "elastic_error"
    assert after["verdict"] == before["verdict"]
    assert [d["id"] for d in after["diagnoses"]] == [  # type: ignore[attr-defined]
        d["id"]
        for d in before["diagnoses"]  # type: ignore[attr-defined]
    ]
