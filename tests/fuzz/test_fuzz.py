"""The fuzzer in the test suite: a short seeded campaign over every input kind must end with no
finding, and each oracle must see the defect it is there for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.__main__ import campaign, summary
from tests.fuzz.cases import KINDS, Case, make_case, plan
from tests.fuzz.oracles import findings
from tests.fuzz.runner import run_case

SHORT_COUNT = 35
"""Five cases per kind: a few seconds each, the long campaign runs on demand."""


def test_a_short_seeded_campaign_over_every_kind_finds_nothing(tmp_path: Path) -> None:
    # judged on CPU time: the suite runs on machines shared with other work
    results = campaign(SHORT_COUNT, seed=2026, jobs=2, results=tmp_path / "r.jsonl", keep=None,
                       clock="cpu", kill_after=120.0)  # fmt: skip
    assert {r["kind"] for r in results} == set(KINDS), summary(results)
    assert len(results) == SHORT_COUNT
    assert [r for r in results if r["findings"]] == [], summary(results)
    # the cases were analyzed, not all refused
    assert sum(r["exit_code"] == 0 for r in results) > SHORT_COUNT // 2, summary(results)


def test_cases_are_reproducible_from_kind_number_and_seed() -> None:
    for kind in KINDS:
        first, again = make_case(kind, 3, 7), make_case(kind, 3, 7)
        assert first.files == again.files and first.argv == again.argv, kind
    assert make_case("log", 3, 7).files != make_case("log", 3, 8).files
    assert plan(70, 1) == plan(70, 1) and len(plan(70, 1)) == 70


def _result(**changes: object) -> dict[str, object]:
    result: dict[str, object] = {
        "exit_code": 0,
        "stdout": "oomlens: GPU OOM\n",
        "stderr": "",
        "seconds": 0.5,
        "cpu_seconds": 0.4,
        "timed_out": False,
        "memory": 10 * 2**20,
    }
    result.update(changes)
    return result


def _kinds(result: dict[str, object], tmp_path: Path, **files: str) -> set[str]:
    for name, text in files.items():
        (tmp_path / name.replace("_", ".", 1)).write_text(text)
    outputs = tuple(name.replace("_", ".", 1) for name in files)
    found = findings(["analyze", "in"], "text", outputs, tmp_path, result, "PWNED")
    return {f.kind for f in found}


@pytest.mark.parametrize(
    ("result", "files", "kind"),
    [
        (
            _result(exit_code=1, stderr="oomlens: internal error: KeyError: 3\n"),
            {},
            "internal_error",
        ),
        (_result(stderr="Traceback (most recent call last):\n"), {}, "internal_error"),
        (
            _result(stdout="in/x.log: internal error while reading it: ValueError"),
            {},
            "internal_error",
        ),
        (_result(timed_out=True, seconds=30.0), {}, "hang"),
        (_result(clock="cpu", seconds=60.0, cpu_seconds=21.0), {}, "hang"),
        (_result(clock="cpu", timed_out=True, seconds=120.0, cpu_seconds=0.1), {}, "hang"),
        (_result(memory=2 * 2**30), {}, "memory"),
        (_result(stdout="rank 0 \x1b[31mred"), {}, "injection"),
        (_result(stdout="path \u202eevil"), {}, "injection"),
        (_result(), {"report_html": '<p><img src=x onerror="alert(2)"></p>'}, "injection"),
        (_result(), {"report_html": "<script>a</script><script>b</script>"}, "injection"),
        (_result(), {"runs_csv": 'run,path\n"=HYPERLINK(""x"")",/a\n'}, "injection"),
        (_result(), {"runs_csv": "run,path\n@SUM(1+1),/a\n"}, "injection"),
        (_result(), {"runs_jsonl": '{"summary": "a\\u001b[2J"}\n'}, "injection"),
        (_result(), {"runs_jsonl": '{"run": "a\x9b2J"}\n'}, "injection"),
        (_result(), {"PWNED": ""}, "code_execution"),
    ],
)
def test_each_oracle_sees_its_defect(
    tmp_path: Path, result: dict[str, object], files: dict[str, str], kind: str
) -> None:
    assert kind in _kinds(result, tmp_path, **files)


def test_a_clean_result_has_no_finding(tmp_path: Path) -> None:
    assert (
        _kinds(_result(), tmp_path, runs_csv="run,n\n'=a,-1\n", report_html="<p>&lt;b&gt;</p>")
        == set()
    )


def test_a_triage_row_may_name_a_directory_with_control_characters(tmp_path: Path) -> None:
    # run, path and report are kept exactly (JSON escapes the characters in the file)
    row = '{"run": "a\\u001b[2J", "path": "/x/a\\tb", "report": null}\n'
    assert _kinds(_result(), tmp_path, runs_jsonl=row) == set()


def test_on_the_cpu_clock_a_case_slowed_by_other_work_is_no_hang(tmp_path: Path) -> None:
    assert _kinds(_result(clock="cpu", seconds=45.0, cpu_seconds=3.0), tmp_path) == set()
    assert _kinds(_result(seconds=45.0, cpu_seconds=3.0), tmp_path) == {"hang"}


def test_the_runner_reports_an_undocumented_exit(tmp_path: Path) -> None:
    case = Case("log", 0, 0, "a bad command line", argv=["analyze", "in", "--no-such-option"])
    result = run_case(case)
    assert result["exit_code"] == 2
    assert [kind for kind, _ in result["findings"]] == ["internal_error"]
