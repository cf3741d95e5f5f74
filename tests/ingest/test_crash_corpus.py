"""The real crash corpus (``fixtures/crash_logs/<case>/``): every file is recognised and every
log parses into facts that agree with what the run recorded (``run.json``).

Skipped until the corpus is in the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.analysis.ranks import rank_picture
from oomlens.ingest.detect import InputKind, detect_kind
from oomlens.ingest.log import read_log
from oomlens.ingest.log.kernel import read_kernel_log

CORPUS = Path(__file__).parents[2] / "fixtures" / "crash_logs"
CASES = (
    sorted(p for p in CORPUS.glob("*") if p.is_dir() and not p.name.startswith("_"))
    if CORPUS.is_dir()
    else []
)
needs_corpus = pytest.mark.skipif(not CASES, reason="the crash corpus is not in this checkout")


def _case_ids() -> list[str]:
    return [case.name for case in CASES] or ["none"]


@needs_corpus
@pytest.mark.parametrize("case", CASES or [None], ids=_case_ids())
def test_corpus_files_are_recognised_by_content(case: Path) -> None:
    expected = {
        "train.log": InputKind.TRAINING_LOG,
        "ds_config.json": InputKind.DS_CONFIG,
        "kernel.log": InputKind.KERNEL_LOG,
    }
    for path in case.iterdir():
        kind = detect_kind(path).kind
        if path.name in expected:
            assert kind is expected[path.name], path
        elif path.suffix == ".pickle":
            assert kind is InputKind.SNAPSHOT_PICKLE, path


@needs_corpus
@pytest.mark.parametrize("case", CASES or [None], ids=_case_ids())
def test_corpus_logs_parse_and_agree_with_the_run(case: Path) -> None:
    log = case / "train.log"
    if not log.exists():
        pytest.skip("no train.log")
    facts = read_log(log)
    assert facts.lines > 0
    run_file = case / "run.json"
    run = json.loads(run_file.read_text()) if run_file.exists() else {}
    kernel = [read_kernel_log(case / "kernel.log")] if (case / "kernel.log").exists() else []
    failure_facts = (
        len(facts.oom_events)
        + len(facts.exceptions)
        + len(facts.process_failures)
        + len(facts.launcher_exits)
        + len(facts.batch_assertions)
        + len(facts.fatal_signals)
        + sum(len(k.oom_kills) for k in kernel)
    )
    if run.get("exit_code", 0) != 0 and not run.get("timed_out"):
        # a failed run leaves some trace the reader must find
        assert failure_facts > 0, (case.name, facts.notes)
    for exit_line in facts.launcher_exits:
        assert exit_line.return_code != 0
    picture = rank_picture([facts], kernel_logs=kernel)
    if facts.oom_events and run.get("exit_code", 0) != 0:
        assert picture.first_failed is not None
