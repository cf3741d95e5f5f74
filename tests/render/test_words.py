"""What a person reads: the facts in words, never an internal name, and never a claim the
facts do not make (a rank for a log that names none, an order for ranks that failed at the same
moment, a "?" among the ranks)."""

from __future__ import annotations

import re

import pytest

from oomlens.render.registry import Format, RenderOptions, render
from oomlens.report import Report
from oomlens.session import analyze
from tests._corpus import case_dir

CASES = (
    "fragmentation",
    "prefetch_overshoot",
    "nccl_timeout",
    "device_side_assert",
    "model_states_too_large",
    "pinned_memory_exhaustion",
)
HUMAN = (Format.TEXT, Format.MARKDOWN, Format.HTML)

INTERNAL_NAMES = (
    "only_one",
    "only one)",
    "root_cause",
    "line_order",
    "by timestamp",
    "decided by",
    "(world_info",  # as a name in parentheses: log lines quoted may hold the launcher's flag
    "(torchrun_summary",
    "history history",
    "alloc_history",
    "python_and_native",
    "needed (unknown)",
    "rank ?",
)


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {name: analyze([case_dir(name)]) for name in CASES}


def _shown(report: Report) -> dict[Format, str]:
    return {fmt: render(report, fmt, RenderOptions()) for fmt in HUMAN}


@pytest.mark.parametrize("case", CASES)
def test_no_internal_name_reaches_the_reader(reports: dict[str, Report], case: str) -> None:
    for fmt, shown in _shown(reports[case]).items():
        plain = shown.replace("\\_", "_")
        for name in INTERNAL_NAMES:
            assert name not in plain, (case, fmt, name)


@pytest.mark.parametrize("case", CASES)
def test_each_assumption_is_said_once(reports: dict[str, Report], case: str) -> None:
    html = render(reports[case], Format.HTML, RenderOptions())
    assumed = re.findall(r"Assumed: ([^<]*)<", html)
    assert len(assumed) == len(set(assumed)), case


def test_a_log_that_names_no_rank_is_not_said_to_be_rank_0(reports: dict[str, Report]) -> None:
    # fragmentation is one plain `python3 sample_cached.py` process: its log names no rank
    report = reports["fragmentation"]
    assert report.facts.ranks.unranked_run
    for fmt, shown in _shown(report).items():
        assert not re.search(r"[Ff]irst failure:\W*rank", shown), fmt
        assert "the only process" in shown, fmt
        assert "**Rank:**" not in shown and "<dt>Rank</dt>" not in shown, fmt
    markdown = render(report, Format.MARKDOWN, RenderOptions())
    # the OOM table's rows (the memory account's table lists the same request, by term)
    table = markdown.split("Out-of-memory errors", 1)[1].split("\n\n")[1]
    oom_rows = [line for line in table.splitlines() if "| 42.00 MiB |" in line]
    assert oom_rows and all(row.startswith("| the only process |") for row in oom_rows)


def test_ranks_failing_at_the_same_moment_are_said_to(reports: dict[str, Report]) -> None:
    for fmt, shown in _shown(reports["prefetch_overshoot"]).items():
        assert "ranks 0 and 1 failed at the same moment" in shown, fmt
        assert "failed earliest" not in shown, fmt


def test_a_unique_earliest_failure_is_said_to_be_so(reports: dict[str, Report]) -> None:
    text = render(reports["model_states_too_large"], Format.TEXT, RenderOptions())
    assert "first failure: rank 1 (out of memory; it failed earliest)" in text


@pytest.mark.parametrize("case", ["nccl_timeout", "device_side_assert"])
def test_peer_victims_are_ranks_only(reports: dict[str, Report], case: str) -> None:
    report = reports[case]
    for fmt, shown in _shown(report).items():
        assert not re.search(r"rank\(s\) [0-9, ]*\?", shown), (case, fmt)
        assert "| ? |" not in shown and "<td>?" not in shown, (case, fmt)
    stragglers = set(report.facts.ranks.suspected_stragglers)
    assert not stragglers & set(report.facts.ranks.peer_victims)


def test_world_size_says_where_it_was_read(reports: dict[str, Report]) -> None:
    markdown = render(reports["prefetch_overshoot"], Format.MARKDOWN, RenderOptions())
    said = r"World size: 2 \(the launcher's WORLD INFO DICT, [^)]*train\.log:\d+\)"
    assert re.search(said, markdown)


def test_one_memory_sample_is_no_chart(reports: dict[str, Report]) -> None:
    # prefetch_overshoot's log holds a single see_memory_usage sample
    report = reports["prefetch_overshoot"]
    assert max(len(s.samples) for s in report.facts.memory_series()) == 1
    for fmt, shown in _shown(report).items():
        assert "Memory over time" not in shown, fmt


def _budget_lines(report: Report) -> list[str]:
    markdown = render(report, Format.MARKDOWN, RenderOptions())
    return [line for line in markdown.splitlines() if line.startswith("- ")]


def test_the_memory_model_of_a_run_that_died_does_not_say_it_fits(
    reports: dict[str, Report],
) -> None:
    # prefetch_overshoot ran out at 6.75 GiB; the model's peak is 6.54 GiB: the model must say
    # what it did not count, not that the config fits
    report = reports["prefetch_overshoot"]
    gpu = report.facts.memory_model.verdict("gpu")  # type: ignore[union-attr]
    assert gpu is not None and gpu.fits
    line = next(x for x in _budget_lines(report) if x.startswith("- gpu capacity"))
    assert "fits" not in line
    assert "ran out" in line and "does not count" in line and "activations" in line
    assert "161.40 MiB" in line  # what the allocator held unused at the OOM


def test_the_memory_model_of_a_healthy_run_still_says_it_fits() -> None:
    from oomlens.session import AnalysisOptions

    report = analyze([case_dir("prefetch_fits")], options=AnalysisOptions(gpu_memory=80 * 2**30))
    assert report.verdict.value == "no_failure"
    line = next(x for x in _budget_lines(report) if x.startswith("- gpu capacity"))
    assert ": fits: peak" in line


def test_the_patch_list_leads_with_the_diagnosis_own_fix(reports: dict[str, Report]) -> None:
    report = reports["prefetch_overshoot"]
    assert report.top is not None and report.top.id == "prefetch_overshoot"
    patches = [x for x in _budget_lines(report) if x.startswith("- patch:")]
    assert patches and patches[0].startswith("- patch: gather fewer parameters ahead of use")


def test_the_severity_is_labelled_not_read_as_the_confidence(reports: dict[str, Report]) -> None:
    # audit: "confidence 25%, high" read as "high confidence"; the word is the severity
    for fmt, shown in _shown(reports["prefetch_overshoot"]).items():
        plain = re.sub(r"<[^>]+>", " ", shown)
        assert not re.search(r"confidence \d+%, (critical|high|medium|low|info)\b", plain), fmt
        assert re.search(r"\bseverity (critical|high|medium|low|info)\b", plain), fmt


@pytest.mark.parametrize("case", ["nccl_timeout", "device_side_assert"])
def test_an_exception_is_quoted_with_its_class_once(reports: dict[str, Report], case: str) -> None:
    # audit: "RuntimeError: RuntimeError: CUDA error...", "ChildFailedError: ...ChildFailedError:"
    report = reports[case]
    for fmt, shown in _shown(report).items():
        assert not re.search(r"\b([\w.]+Error): \1\b", shown.replace("\\_", "_")), (case, fmt)


def test_one_block_is_not_blocks(reports: dict[str, Report]) -> None:
    # audit: the Markdown's call-site and category charts said "1 blocks"
    for fmt, shown in _shown(reports["prefetch_overshoot"]).items():
        assert not re.search(r"(?<![\d.,])1 (blocks|segments)\b", shown), fmt
    assert "; 1 block;" in render(reports["prefetch_overshoot"], Format.MARKDOWN, RenderOptions())
