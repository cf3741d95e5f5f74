"""Files that are not logs are refused with what they are, never read as a crash or as a
healthy run: this repository's README and docs, its pyproject.toml, its source, a CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.errors import NoUsableInputError
from oomlens.ingest.detect import detect_kind
from oomlens.ingest.documents import document_kind
from oomlens.session import AnalysisOptions, analyze

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "fixtures" / "field_logs"


def _lines(path: Path) -> list[str]:
    text = path.read_bytes()[:65536].decode("utf-8", "replace")
    return [line for line in text.splitlines()[:400] if line.strip()]


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("README.md", "a Markdown document"),
        ("docs/triage.md", "a Markdown document"),
        ("docs/epilog.md", "a Markdown document"),
        ("fixtures/field_logs/README.md", "a Markdown document"),
        ("pyproject.toml", "a TOML/INI file"),
        ("oomlens/units.py", "Python source code"),
        ("oomlens/report.py", "Python source code"),
    ],
)
def test_the_repositorys_own_files_are_refused(name: str, what: str) -> None:
    detection = detect_kind(ROOT / name)
    assert detection.kind is None and not detection.plain_text
    assert detection.reason == f"{what}, not a log"
    with pytest.raises(NoUsableInputError, match="not an input oomlens reads"):
        analyze([ROOT / name], options=AnalysisOptions(prefer_deepspeed=False))


def test_a_csv_of_training_metrics_is_a_table(tmp_path: Path) -> None:
    target = tmp_path / "metrics.csv"
    rows = ["step,loss,lr,gpu_mem_gib"] + [
        f"{s},{10 - s * 0.01:.3f},0.0001,{40 + s % 3}" for s in range(50)
    ]
    target.write_text("\n".join(rows) + "\n")
    assert detect_kind(target).reason == "a CSV table, not a log"


def test_no_real_log_is_taken_for_a_document() -> None:
    logs = [p / "paste.txt" for p in FIELD.iterdir() if (p / "paste.txt").is_file()]
    logs += list((ROOT / "fixtures" / "crash_logs").glob("*/*.log"))
    logs += list((ROOT / "tests" / "assets" / "logs").glob("*.txt"))
    assert len(logs) > 200
    taken = [p for p in logs if document_kind(_lines(p)) is not None]
    assert taken == []
