"""The fuzzer in the test suite: a short seeded campaign over every input kind must end with no
finding, and each oracle must see the defect it is there for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fuzz import shapes
from tests.fuzz.__main__ import campaign, summary
from tests.fuzz.cases import KINDS, NEW_KINDS, Case, make_case, plan
from tests.fuzz.oracles import direction, findings
from tests.fuzz.runner import run_case

SHORT_COUNT = 35
"""Five cases per kind: a few seconds each, the long campaign runs on demand."""
OLD_KINDS = tuple(k for k in KINDS if k not in NEW_KINDS)
SHORT_NEW_COUNT = 9
"""Issue 33's shapes: five transport cases, two document, two hostile2."""


def test_a_short_seeded_campaign_over_every_kind_finds_nothing(tmp_path: Path) -> None:
    # judged on CPU time: the suite runs on machines shared with other work
    results = campaign(SHORT_COUNT, seed=2026, jobs=2, results=tmp_path / "r.jsonl", keep=None,
                       kinds=OLD_KINDS, clock="cpu", kill_after=120.0)  # fmt: skip
    assert {r["kind"] for r in results} == set(OLD_KINDS), summary(results)
    assert len(results) == SHORT_COUNT
    assert [r for r in results if r["findings"]] == [], summary(results)
    # the cases were analyzed, not all refused
    assert sum(r["exit_code"] == 0 for r in results) > SHORT_COUNT // 2, summary(results)


def test_a_short_campaign_of_logs_as_users_get_them_documents_and_hostile_shapes(
    tmp_path: Path,
) -> None:
    # the direction oracle: no failure read as no_failure, no document read as an OOM
    results = campaign(SHORT_NEW_COUNT, seed=2033, jobs=2, results=tmp_path / "r.jsonl",
                       keep=None, kinds=NEW_KINDS, clock="cpu", kill_after=120.0)  # fmt: skip
    assert {r["kind"] for r in results} == set(NEW_KINDS), summary(results)
    assert len(results) == SHORT_NEW_COUNT
    assert [r for r in results if r["findings"]] == [], summary(results)


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
        (_result(stdout="path \u200fevil"), {}, "injection"),
        (_result(stdout="path \u061cevil"), {}, "injection"),
        (_result(stdout_utf8=False), {}, "encoding"),
        (_result(stdout_bytes=40 * 2**20), {}, "output_size"),
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


def _json_result(verdict: str, confidence: float) -> dict[str, object]:
    doc = {"verdict": verdict, "diagnoses": [{"id": "x", "confidence": confidence}]}
    return _result(stdout=json.dumps(doc))


@pytest.mark.parametrize(
    ("expect", "before", "after", "found"),
    [
        ("direction", ("gpu_oom", 0.7), _json_result("no_failure", 0.0), "read as no_failure"),
        ("direction", ("other_failure", 0.8), _json_result("no_failure", 0.0), "no_failure"),
        ("direction", ("host_oom", 0.9), _result(exit_code=3, stderr="x: binary\n"), "refused"),
        ("direction", ("gpu_oom", 0.7), _json_result("other_failure", 0.85), "gpu_oom read as"),
        ("direction", ("gpu_oom", 0.7), _json_result("unknown", 0.9), ""),
        ("direction", ("gpu_oom", 0.7), _json_result("other_failure", 0.4), ""),
        ("direction", ("no_failure", 0.0), _json_result("no_failure", 0.0), ""),
        ("direction", None, _json_result("no_failure", 0.0), ""),
        ("no_oom", None, _json_result("gpu_oom", 0.6), "document read as gpu_oom"),
        ("no_oom", None, _json_result("gpu_oom", 0.3), ""),
        ("no_oom", None, _result(exit_code=3, stderr="not a log\n"), ""),
        ("no_oom", ("no_failure", 0.0), _json_result("host_oom", 0.8), "healthy run with a"),
        ("no_oom", ("gpu_oom", 0.7), _json_result("gpu_oom", 0.8), ""),
    ],
)
def test_the_direction_oracle_judges_a_verdict_against_the_untransformed_ones(
    expect: str, before: tuple[str, float] | None, after: dict[str, object], found: str
) -> None:
    details = [f.detail for f in direction(expect, before, after)]
    if found:
        assert len(details) == 1 and found in details[0], details
    else:
        assert details == []


def test_a_report_that_is_not_utf8_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "report.md").write_bytes(b"# run \xff\n")
    found = findings(["analyze", "in"], "none", ("report.md",), tmp_path, _result(), "PWNED")
    assert {f.kind for f in found} == {"encoding"}


@pytest.mark.parametrize("number", range(12))
def test_a_cut_compressed_log_still_holds_every_line(number: int) -> None:
    # cut after the crash lines, never before: the shape must not change what the log says
    import lzma
    import random
    import subprocess
    import zlib

    data = b"".join(b"step %d loss 1.0\n" % n for n in range(2000)) + b"torch.OutOfMemoryError\n"
    packed, suffix = shapes.compressed(data, random.Random(number), b"")
    if suffix == ".gz":
        out = zlib.decompressobj(wbits=31).decompress(packed)
    elif suffix == ".xz":
        out = lzma.LZMADecompressor().decompress(packed)
    else:
        out = subprocess.run(["zstd", "-dc"], input=packed, capture_output=True).stdout
    assert out == data
