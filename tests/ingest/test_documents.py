"""Files that are not logs are refused with what they are, never read as a crash or as a
healthy run: this repository's README and docs, its pyproject.toml, its source, a CSV."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from oomlens.errors import NoUsableInputError
from oomlens.ingest.detect import detect_kind, discover_run
from oomlens.session import AnalysisOptions, analyze

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "fixtures" / "field_logs"


def _document(path: Path) -> object:
    from oomlens.ingest.documents import document

    data = path.read_bytes()
    return document(data[:65536].decode("utf-8", "replace"), whole=len(data) <= 65536)


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
    taken = [p for p in logs if _document(p) is not None]
    # a reproduction snippet with its output in comments is read when named (a paste)
    assert taken == [FIELD / "pytorch-67839" / "paste.txt"]
    assert detect_kind(taken[0]).kind is not None


# --- documents by their format's structure, whatever they quote ------------------------------

HEALTHY = ROOT / "fixtures" / "crash_logs" / "activation_memory_fixed"
OOM_CASE = ROOT / "fixtures" / "crash_logs" / "activation_memory"


def _field_threads(count: int) -> list[dict[str, str]]:
    """Issue threads of the field corpus as a dataset's rows: title, address and the paste."""
    rows = []
    for case in sorted(p for p in FIELD.iterdir() if (p / "paste.txt").is_file())[:count]:
        meta = json.loads((case / "case.json").read_text())
        paste = (case / "paste.txt").read_text(errors="replace")
        rows.append(
            {"id": meta["id"], "title": meta["title"], "url": meta["source"], "body": paste}
        )
    return rows


def _junit_report(tmp_path: Path) -> Path:
    """A real pytest JUnit XML report of a test that failed with a run's OOM traceback."""
    log = (OOM_CASE / "train.log").read_text()
    test = tmp_path / "junit_case" / "test_step.py"
    test.parent.mkdir()
    test.write_text(f"def test_step():\n    raise RuntimeError({log[-5000:]!r})\n")
    report = tmp_path / "junit_case" / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
         f"--junitxml={report}"],
        capture_output=True, cwd=test.parent, timeout=120, check=False,
    )  # fmt: skip
    assert report.is_file()
    return report


def _html_page(tmp_path: Path) -> Path:
    """A saved page that quotes an OOM: oomlens' own HTML report of an OOM run."""
    from oomlens.render.registry import Format, render

    report = analyze([OOM_CASE], options=AnalysisOptions(prefer_deepspeed=False))
    page = tmp_path / "saved_page.htm"
    page.write_text(render(report, Format.HTML))
    return page


def _notes(tmp_path: Path) -> Path:
    """Markdown notes: headings, prose, and a field paste quoted in a code block."""
    paste = (FIELD / "deepspeed-3869" / "paste.txt").read_text()
    notes = tmp_path / "notes.txt"
    notes.write_text(
        "# Notes on the first attempt\n\nIt died on node 3 before we lowered the micro batch; "
        "its traceback, as it was printed:\n\n```text\n"
        + paste
        + "\n```\n\n## Next\n\n- lower the micro batch to 2\n- turn activation checkpointing on\n"
    )
    return notes


def test_documents_quoting_an_oom_beside_a_healthy_run_are_not_its_inputs(tmp_path: Path) -> None:
    # GIVEN a healthy run's folder that also holds a dataset of issue threads (JSON and CSV,
    # larger than the 64 KiB a detection reads), Markdown notes quoting a crash, a pytest
    # JUnit report of a failed test and a saved web page of an OOM report
    run = tmp_path / "run"
    shutil.copytree(HEALTHY, run)
    rows = _field_threads(200)
    (run / "issues.json").write_text(json.dumps(rows, indent=2))
    with (run / "issues.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert (run / "issues.csv").stat().st_size > 65536
    shutil.copy(_notes(tmp_path), run / "notes.txt")
    shutil.copy(_junit_report(tmp_path), run / "report.xml")
    shutil.copy(_html_page(tmp_path), run / "saved_page.htm")
    # WHEN the folder is analyzed
    report = analyze([run], options=AnalysisOptions(prefer_deepspeed=False))
    # THEN only the run's log is read, and the run is still healthy
    assert [os.path.basename(i.path) for i in report.facts.inputs if i.kind != "ds_config"] == [
        "train.log"
    ]
    assert report.verdict.value == "no_failure"
    skipped = discover_run(run).skipped
    why = {os.path.basename(path): reason for path, reason in skipped}
    assert why["issues.json"] == "a JSON array, not a log"
    assert why["issues.csv"] == "a CSV table, not a log"
    assert why["report.xml"] == "a JUnit XML test report, not a log"
    assert why["saved_page.htm"] == "an HTML page, not a log"
    assert why["notes.txt"].startswith("a Markdown document that quotes a log")


def test_one_record_exports_and_indented_notes_beside_a_healthy_run_are_not_its_inputs(
    tmp_path: Path,
) -> None:
    # GIVEN a healthy run's folder with a one-record export of an issue thread whose body is a
    # real OOM paste (one line, and many), and notes quoting one in an indented code block
    # (a ".txt": a ".md" is passed over by its name)
    run = tmp_path / "run"
    shutil.copytree(HEALTHY, run)
    threads = [r for r in _field_threads(300) if "CUDA out of memory" in r["body"]]
    one_line = next(r for r in threads if "\n" not in r["body"].strip())
    many = next(r for r in threads if r["body"].count("\n") > 5)
    for name, row in (("issue.csv", one_line), ("thread.csv", many)):
        with (run / name).open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(row))
            writer.writeheader()
            writer.writerow(row)
    quoted = "\n".join("    " + line for line in many["body"].splitlines())
    (run / "notes.txt").write_text(
        f"# {many['title']}\n\nWhat the first attempt printed:\n\n{quoted}\n\n"
        "Lowering the micro batch to 2 fixed it.\n"
    )
    # WHEN the folder is analyzed
    report = analyze([run], options=AnalysisOptions(prefer_deepspeed=False))
    # THEN only the run's log is read, and the run is still healthy
    assert [os.path.basename(i.path) for i in report.facts.inputs if i.kind != "ds_config"] == [
        "train.log"
    ]
    assert report.verdict.value == "no_failure"
    why = {os.path.basename(path): reason for path, reason in discover_run(run).skipped}
    assert why["issue.csv"] == why["thread.csv"] == "a CSV table, not a log"
    assert why["notes.txt"].startswith("a Markdown document that quotes a log")


def _readme_opening(tmp_path: Path) -> Path:
    text = (ROOT / "README.md").read_text()
    part = tmp_path / "readme_section.md"
    part.write_text(text[: text.index("\n## ")])
    return part


def _sbatch_example(tmp_path: Path) -> Path:
    """The SLURM batch script docs/triage.md shows, as its user saves it."""
    text = (ROOT / "docs" / "triage.md").read_text()
    start = text.index("#!/bin/bash")
    script = tmp_path / "triage-array.sbatch"
    script.write_text(text[start : text.index("```", start)])
    return script


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda tmp: ROOT / "fixtures/crash_logs/_scenarios/hog_gpu.py", "Python source code"),
        (lambda tmp: ROOT / "tests/capture/_train_cpu.py", "Python source code"),
        (lambda tmp: ROOT / "contrib/slurm/oomlens-epilog.sh", "a shell script"),
        (lambda tmp: ROOT / "scripts/test.sh", "a shell script"),
        (_sbatch_example, "a SLURM batch script"),
        (_html_page, "an HTML page"),
        (_junit_report, "a JUnit XML test report"),
        (_readme_opening, "a Markdown document"),
    ],
)
def test_a_document_named_on_the_command_line_is_refused(
    tmp_path: Path, make: Callable[[Path], Path], what: str
) -> None:
    path = make(tmp_path)
    assert detect_kind(path).reason == f"{what}, not a log"
    with pytest.raises(NoUsableInputError, match="not an input oomlens reads"):
        analyze([path], options=AnalysisOptions(prefer_deepspeed=False))


@pytest.mark.parametrize(
    "case", ["deepspeed-3869", "transformers-24658", "sdlskeleton-6", "lc0-927", "deeplog-50"]
)
def test_a_log_pasted_in_markdown_is_read_when_named(tmp_path: Path, case: str) -> None:
    # GIVEN a ticket: a heading, prose, and a field case's paste in a fenced block
    paste = (FIELD / case / "paste.txt").read_text()
    ticket = tmp_path / "ticket.md"
    ticket.write_text(
        "## Describe the bug\n\nTraining stops after a few steps with the error below; the "
        "same script ran fine last week.\n\n```\n" + paste + "\n```\n\n## System info\n\n"
        "- torch and deepspeed from pip\n"
    )
    alone = analyze([FIELD / case / "paste.txt"], options=AnalysisOptions(prefer_deepspeed=False))
    # THEN named, it is read as the log it quotes, as the paste alone is
    report = analyze([ticket], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict == alone.verdict
    assert [d.id for d in report.diagnoses][:1] == [d.id for d in alone.diagnoses][:1]


def _ticket(tmp_path: Path, block: str) -> Path:
    ticket = tmp_path / "issue.md"
    ticket.write_text(
        "### Bug\n\nIt stops partway through. The output:\n\n```text\n" + block + "\n```\n\n"
        "Any pointers on what to change would be welcome.\n"
    )
    return ticket


@pytest.mark.parametrize("case", ["csdn-146158524", "fastmri-238", "vllm-42609"])
def test_a_pasted_log_whose_lines_have_no_log_lines_form_is_read_when_named(
    tmp_path: Path, case: str
) -> None:
    # GIVEN a paste of a message cut before its class ("error:GPU 0 has...", "Tried to
    # allocate..."), or an engine's words ("Failed: Cuda error ..."): no logger's record, no
    # traceback, but lines the log reader reads
    paste = (FIELD / case / "paste.txt").read_text()
    alone = analyze([FIELD / case / "paste.txt"], options=AnalysisOptions(prefer_deepspeed=False))
    report = analyze([_ticket(tmp_path, paste)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict == alone.verdict and report.verdict.value != "no_failure"


def test_a_pasted_launcher_exit_is_read_when_named(tmp_path: Path) -> None:
    # the end of DeepSpeed's launcher line, its logger's record cut off by the copy
    log = (ROOT / "fixtures/crash_logs/checkpoint_save_host_oom/train.log").read_text()
    line = next(x for x in log.splitlines() if "exits with return code = -" in x)
    tail = line[line.index("exits with return code") :]
    report = analyze([_ticket(tmp_path, tail)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value != "no_failure"


def test_a_quoted_error_line_is_output_not_a_json_config(tmp_path: Path) -> None:
    # a user quoting the error as a string: JSON would decode it, but a config is an object
    line = next(
        x
        for x in (FIELD / "algoperf-426" / "paste.txt").read_text().splitlines()
        if x.startswith("torch.cuda.OutOfMemoryError")
    )
    report = analyze(
        [_ticket(tmp_path, json.dumps(line))], options=AnalysisOptions(prefer_deepspeed=False)
    )
    assert report.verdict.value == "gpu_oom"


def test_a_paste_whose_code_block_runs_past_the_head_read_is_read_when_named(
    tmp_path: Path,
) -> None:
    # GIVEN a dump printed on one line longer than the head sniffed, then the crash
    steps = (ROOT / "fixtures/crash_logs/memory_leak_fixed/train.log").read_text().splitlines()
    bar = " ".join(x for x in steps if x.startswith("step "))
    bar = (bar + " ") * (100_000 // len(bar) + 1)
    crash = (FIELD / "lc0-927" / "paste.txt").read_text()
    alone = analyze(
        [FIELD / "lc0-927" / "paste.txt"], options=AnalysisOptions(prefer_deepspeed=False)
    )
    report = analyze(
        [_ticket(tmp_path, bar + "\n" + crash)], options=AnalysisOptions(prefer_deepspeed=False)
    )
    assert report.verdict == alone.verdict and report.verdict.value != "no_failure"


def test_windows_of_real_logs_whose_lines_carry_commas_are_logs(tmp_path: Path) -> None:
    # GIVEN every run of lines with the same number of commas in the real logs (a DeepSpeed
    # config dump, kernel assert lines, progress lines, HF metric dicts), as a window of a log
    windows = []
    logs = [p / "paste.txt" for p in FIELD.iterdir() if (p / "paste.txt").is_file()]
    logs += list((ROOT / "fixtures" / "crash_logs").glob("*/*.log"))
    for log in sorted(logs):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        start = 0
        while start < len(lines):
            commas = lines[start].count(",")
            end = start
            while end < len(lines) and lines[end].count(",") == commas:
                end += 1
            if commas and end - start >= 2:  # a table of one record is two lines
                window = tmp_path / f"w{len(windows)}.log"
                window.write_text("\n".join(lines[start:end]) + "\n")
                windows.append(window)
            start = max(end, start + 1)
    assert len(windows) > 50
    # THEN none is taken for a document
    refused = [(w, detect_kind(w).reason) for w in windows if not detect_kind(w).plain_text]
    refused = [(w, why) for w, why in refused if why.endswith("not a log")]
    assert refused == []


# --- documents whose strings hold a real OOM -------------------------------------------------


def _oom_pastes() -> list[str]:
    cases = sorted(p for p in FIELD.iterdir() if (p / "paste.txt").is_file())
    pastes = [(p / "paste.txt").read_text(errors="replace") for p in cases]
    return [paste for paste in pastes if "CUDA out of memory" in paste]


def _python_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def test_python_longer_than_the_head_is_refused_whatever_its_strings_hold(
    tmp_path: Path,
) -> None:
    # GIVEN a test module whose one string holds the field corpus' OOM pastes, larger than the
    # 64 KiB a detection reads: the head ends inside the string, among lines that start like
    # statements (``RuntimeError: ...``), and lines that start with ``#``
    body = _python_string("\n\n".join(_oom_pastes() * 2))
    module = tmp_path / "test_parser_messages.py"
    module.write_text(
        '"""Real OOM messages the parser is tested on."""\n\nimport pytest\n\n'
        f'MESSAGES = """\\\n{body}\n""".split("\\n\\n")\n\n\n'
        '@pytest.mark.parametrize("message", MESSAGES)\ndef test_parse(message):\n'
        "    assert message\n"
    )
    assert module.stat().st_size > 65536
    # THEN it is Python, and named alone it is refused, not read as the OOMs it quotes
    assert detect_kind(module).reason == "Python source code, not a log"
    with pytest.raises(NoUsableInputError, match="not an input oomlens reads"):
        analyze([module], options=AnalysisOptions(prefer_deepspeed=False))


def test_a_module_of_messages_without_def_or_import_is_python(tmp_path: Path) -> None:
    # GIVEN a fixtures module: a docstring and assignments of real OOM pastes, nothing else
    pastes = _oom_pastes()[3:6]
    module = tmp_path / "messages.py"
    module.write_text(
        '"""OOM messages from the field, for the tests."""\n\n'
        + "".join(
            f'MESSAGE_{i} = """\\\n{_python_string(p)}\n"""\n\n' for i, p in enumerate(pastes)
        )
    )
    assert detect_kind(module).reason == "Python source code, not a log"
    with pytest.raises(NoUsableInputError, match="not an input oomlens reads"):
        analyze([module], options=AnalysisOptions(prefer_deepspeed=False))


def _known_failures(tmp_path: Path, quote: str) -> Path:
    """A TOML file of known failures: each a table whose multi-line strings hold a real OOM."""
    crash = (OOM_CASE / "train.log").read_text()
    tail = crash[crash.index("[rank0]: Traceback") :]
    paste = next(p for p in _oom_pastes() if p.count("\n  File ") >= 5)
    message = tail if quote == "'''" else _python_string(paste)
    toml = tmp_path / "known_failures.toml"
    toml.write_text(
        "# What killed our runs, and what fixed it\n\n"
        f'[[failure]]\nrun = "7b-zero3"\ndate = 2026-10-14\nmessage = {quote}\n{message}{quote}\n'
        'fix = "turn activation checkpointing on"\n\n'
        '[[failure]]\nrun = "13b"\nfix = "a smaller micro batch"\n'
    )
    assert "out of memory" in toml.read_text()
    return toml


@pytest.mark.parametrize("quote", ["'''", '"""'])
def test_toml_whose_multi_line_strings_hold_an_oom_is_refused(tmp_path: Path, quote: str) -> None:
    import tomllib

    toml = _known_failures(tmp_path, quote)
    assert tomllib.loads(toml.read_text())["failure"][0]["fix"]
    # THEN named alone it is refused
    assert detect_kind(toml).reason == "a TOML/INI file, not a log"
    with pytest.raises(NoUsableInputError, match="not an input oomlens reads"):
        analyze([toml], options=AnalysisOptions(prefer_deepspeed=False))
    # AND beside a healthy run it is not one of the run's inputs
    run = tmp_path / "run"
    shutil.copytree(HEALTHY, run)
    shutil.copy(toml, run / toml.name)
    report = analyze([run], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "no_failure"
    why = {os.path.basename(p): r for p, r in discover_run(run).skipped}
    assert why[toml.name] == "a TOML/INI file, not a log"
