"""The terminal summary and ``oomlens check``'s text wrapped to a width: no line longer than the
width (ANSI colour not counted) for any case of the crash corpus but a path longer than a whole
line, continuation lines under their item's text, nothing cut inside a locator or a JSON
member, and width 0 (a pipe, a file) the lines as they always were."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomlens.render.registry import Format, RenderOptions, render
from oomlens.render.wrap import columns, command_spans, json_members, wrap
from oomlens.report import Report
from oomlens.session import analyze, check_config
from tests._corpus import CORPUS_DIR, case_dir, case_names, check_arguments, checkable
from tests.golden._outputs import in_root

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 100
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CASES = case_names() if CORPUS_DIR.is_dir() else []

# Paths longer than a whole line at their hanging indent: a locator is not cut, so these lines
# are the only ones over the width (the terminal wraps them), each a single word.
UNBREAKABLE = {
    "compiled_activation": {
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/_functorch/_aot_autograd/"
        "runtime_wrappers.py:2503"
    },
    "fragmentation_captured": {
        "(fixtures/crash_logs/fragmentation_captured/oomlens-capture/20261201-110830-434/"
        "rank0.snapshot.pickle",
        # the memory account's source of the model states (no parenthesis: not a citation)
        "fixtures/crash_logs/fragmentation_captured/oomlens-capture/20261201-110830-434/"
        "rank0.snapshot.pickle",
    },
    "memory_leak_captured": {
        "(fixtures/crash_logs/memory_leak_captured/oomlens-capture/20261201-110936-794/"
        "rank0.series.jsonl:5",
        "(fixtures/crash_logs/memory_leak_captured/oomlens-capture/20261201-110936-794/"
        "rank0.snapshot.pickle",
        "fixtures/crash_logs/memory_leak_captured/oomlens-capture/20261201-110936-794/"
        "rank0.snapshot.pickle",
    },
    "prefetch_overshoot_captured": {
        "fixtures/crash_logs/prefetch_overshoot_captured/oomlens-capture/20261201-111300-1267/"
        "rank0.snapshot.pickle",
    },
    "pinned_memory_exhaustion_captured": {
        "(fixtures/crash_logs/pinned_memory_exhaustion_captured/oomlens-capture/"
        "20261201-111217-1163/rank0.kernel.log:3)",
        "(fixtures/crash_logs/pinned_memory_exhaustion_captured/oomlens-capture/"
        "20261201-111217-1163/rank0.events.jsonl:8",
        # the host account's capacity: the cgroup limit the capture recorded, cited by path
        "fixtures/crash_logs/pinned_memory_exhaustion_captured/oomlens-capture/"
        "20261201-111217-1163/rank0.events.jsonl));",
    },
}

# The column each kind of summary line continues at, under its item's text (most specific first).
HANGS = (
    (re.compile(r"^         ds_config patch: "), 26),
    (re.compile(r"^         environment: "), 22),
    (re.compile(r"^         command: "), 18),
    (re.compile(r"^         arguments: "), 20),
    (re.compile(r"^         \S"), 11),  # what the fix saves and costs
    (re.compile(r"^    fix: "), 9),
    (re.compile(r"^    \.\.\. "), 8),
    (re.compile(r"^    [+-] "), 6),
    (re.compile(r"^    \S"), 4),  # the diagnosis' summary, a paragraph
    (re.compile(r"^  \S"), 4),
    (re.compile(r"^\d+\. "), 3),
)


def _visible(line: str) -> str:
    return ANSI.sub("", line)


@pytest.fixture(scope="module", autouse=True)
def _in_root() -> Iterator[None]:
    """Inputs named as a user in the checkout names them (``fixtures/crash_logs/<case>``)."""
    with in_root():
        yield


def _report(case: str) -> Report:
    return analyze([os.path.relpath(case_dir(case), ROOT)])


def _hang(line: str) -> int:
    for pattern, hang in HANGS:
        if pattern.match(line):
            return hang
    return 2


def _items(wide: str, wrapped: str) -> list[tuple[str, list[str]]]:
    """Each line of ``wide`` with the lines of ``wrapped`` made of it (as many as hold its
    words)."""
    rows = iter(wrapped.split("\n"))
    items = []
    for line in wide.split("\n"):
        pieces = [next(rows)]
        while sum(len(p.split()) for p in pieces) < len(line.split()):
            pieces.append(next(rows))
        items.append((line, pieces))
    assert next(rows, None) is None
    return items


@pytest.mark.parametrize("case", CASES)
def test_no_summary_line_is_wider_than_the_terminal_but_a_long_path(case: str) -> None:
    text = render(_report(case), Format.TEXT, RenderOptions(colour=True, width=WIDTH))
    assert "\x1b[" in text  # coloured: the codes are not counted
    over = {_visible(line).strip() for line in text.splitlines() if columns(line) > WIDTH}
    assert over == UNBREAKABLE.get(case, set())
    assert all(" " not in word for word in over)


@pytest.mark.parametrize("case", CASES)
def test_continuation_lines_hang_under_their_items_text(case: str) -> None:
    report = _report(case)
    wide = render(report, Format.TEXT, RenderOptions(width=10**6))
    wrapped = render(report, Format.TEXT, RenderOptions(width=WIDTH))
    for line, pieces in _items(wide, wrapped):
        assert pieces[0] == line or line.startswith(pieces[0] + " "), (line, pieces[0])
        for piece in pieces[1:]:
            indent = len(piece) - len(piece.lstrip(" "))
            assert indent == _hang(line), (line, piece)
        # nothing lost or added: the words of the line, in order
        assert " ".join(" ".join(pieces).split()) == " ".join(line.split())


@pytest.mark.parametrize("case", [c for c in CASES if checkable(c)])
def test_no_check_line_is_wider_than_the_terminal_but_a_long_path(case: str) -> None:
    arguments = check_arguments(case)
    path = os.path.relpath(arguments.pop("config_path"), ROOT)
    check = check_config(path, **arguments, validator="oomlens")
    wide = render(check, Format.TEXT, RenderOptions())
    text = render(check, Format.TEXT, RenderOptions(width=WIDTH))
    assert max(map(columns, wide.splitlines())) > WIDTH  # there was something to wrap
    assert max(map(columns, text.splitlines())) <= WIDTH
    assert text.split() == wide.split()  # the same words, in order


@pytest.mark.parametrize("case", ["prefetch_overshoot", "fragmentation_captured", "nccl_timeout"])
def test_width_0_is_the_report_as_it_always_was(case: str) -> None:
    report = _report(case)
    golden = ROOT / "tests" / "golden" / "analyze" / case / "all.txt"
    assert render(report, Format.TEXT, RenderOptions()) == golden.read_text()
    assert render(report, Format.TEXT, RenderOptions(width=0)) == golden.read_text()


def test_the_terminal_quotes_an_oom_message_up_to_its_request_the_full_report_whole() -> None:
    report = _report("prefetch_overshoot")
    quote = "+ torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 24.00 MiB. …\n"
    shown = render(report, Format.TEXT, RenderOptions(width=WIDTH))
    assert quote in shown
    assert "131.28 GiB is free" not in shown
    assert "131.28 GiB is free" in render(report, Format.TEXT, RenderOptions())
    assert "131.28 GiB is free" in render(report, Format.MARKDOWN, RenderOptions(width=WIDTH))


def test_a_line_is_cut_at_spaces_with_its_hanging_indent() -> None:
    line = "    + " + " ".join(["word"] * 30)
    lines = wrap(line, 40, hang=6)
    assert lines[0].startswith("    + word")
    assert all(len(x) <= 40 for x in lines)
    assert all(x.startswith("      word") for x in lines[1:])
    assert wrap(line, 0, hang=6) == [line]
    assert wrap("short", 40) == ["short"]


def test_colour_codes_take_no_columns() -> None:
    assert columns("\x1b[1m\x1b[31mabc\x1b[0m") == 3
    assert columns("表") == 2


def test_a_locator_and_a_number_with_its_unit_stay_whole() -> None:
    line = "  allocator error at some/where/train.log:263 (rank 0) asked 24.00 MiB of the device"
    for width in range(30, len(line)):
        text = "\n".join(wrap(line, width, keep=["(rank 0)"]))
        assert "train.log:263" in text
        assert "(rank 0)" in text
        assert "24.00 MiB" in text


def test_a_kept_span_longer_than_a_line_is_cut_after_all() -> None:
    locator = "(" + "d/" * 40 + "rank0.events.jsonl:8 (rank 0 on vm))"
    lines = wrap("    + a fact " + locator, 100, hang=6, keep=[locator])
    assert lines[1] == "      (" + "d/" * 40 + "rank0.events.jsonl:8"
    assert lines[2] == "      (rank 0 on vm))"


def test_a_json_patch_is_cut_between_members_not_inside_one() -> None:
    patch = (
        '{"zero_optimization": {"stage3_prefetch_bucket_size": 50000000, '
        '"stage3_max_live_parameters": 1000000000, "stage3_max_reuse_distance": 1000000000}}'
    )
    line = "         ds_config patch: " + patch
    for width in (60, 80, 100):
        lines = wrap(line, width, hang=26, keep=json_members(patch))
        assert all(len(x) <= width for x in lines)
        if width >= 80:  # room for a member at the hanging indent: none is cut
            for member in json_members(patch):
                assert any(member in x for x in lines), (width, member)
    single = '{"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": false}}'
    lines = wrap("         ds_config patch: " + single, 100, hang=26, keep=json_members(single))
    assert lines[-1].strip() == '{"stage3_gather_16bit_weights_on_model_save": false}}'


_COMMANDS = [
    "journalctl -k --since '1 hour ago' | grep -i 'out of memory'",
    "nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
    "sacct -j 1234 --format=JobID,MaxRSS,State",
    "python3 -c 'import torch; print(torch.cuda.mem_get_info())'",
]


@pytest.mark.parametrize("command", _COMMANDS)
@pytest.mark.parametrize("width", [34, 45, 60, 80])
def test_a_command_in_the_text_is_never_cut(command: str, width: int) -> None:
    line = (
        f"  - the record of the node's memory at the time (the scheduler's own), e.g. {command} "
        "run on the node where the rank was, before the logs rotate"
    )
    assert command_spans(line) == [command]
    wrapped = wrap(line, width, hang=4)
    # on a line of its own when it does not fit where it stands, whole however long it is
    assert any(piece.strip() == command or command in piece for piece in wrapped), wrapped
    assert " ".join(piece.strip() for piece in wrapped) == line.strip()
    assert all(columns(piece) <= width for piece in wrapped if command not in piece)


def test_prose_is_no_command() -> None:
    assert command_spans("the run's last step - as far as the log goes - was 12") == []
    assert command_spans("the scheduler's record and the kernel's lines") == []
