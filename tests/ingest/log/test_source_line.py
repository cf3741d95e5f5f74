"""The code that raised, as a paste shows it, places the error: the source line right above an
error that has no frame, read as code (its calls, the optimizer state it computes on), never
prose.  Real lines: the field corpus' development split and the crash corpus (GPU runs), pastes
built from them by code (said where)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.facts.log import Phase
from oomlens.ingest.log import read_log
from oomlens.ingest.log.source_line import source_line_phase

ROOT = Path(__file__).resolve().parents[3]
FIELD = ROOT / "fixtures" / "field_logs"
CRASH = ROOT / "fixtures" / "crash_logs"


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        # torch/optim/adamw.py _single_tensor_adamw (field: llamafactory-1221)
        ("denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)", Phase.OPTIMIZER_STEP),
        # torch/optim/adam.py _multi_tensor_adam (crash corpus: memory_leak)
        ("exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)", Phase.OPTIMIZER_STEP),
        # torch/optim/adam.py _init_group, the first line of a statement on two lines
        ('state["exp_avg"] = torch.zeros_like(', Phase.OPTIMIZER_STEP),
        ("loss.backward()", Phase.BACKWARD),
        ("outputs = model.generate(**inputs, max_new_tokens=512)", Phase.GENERATION),
    ],
)
def test_a_source_line_says_its_phase(line: str, phase: Phase) -> None:
    said = source_line_phase(line)
    assert said is not None and said[0] is phase
    assert line[:40] in said[1]


@pytest.mark.parametrize(
    "line",
    [
        "I got this error when training with the avg and sq settings:",
        "exp_avg_sq is the problem here, I think",  # prose naming a state: not code
        "return torch.cat((-x2, x1), dim=-1)",  # code that says no phase
        "x" * 400,
        "",
        # hostile: nesting past the parser's limit, a null byte
        "(" * 250 + "exp_avg" + ")" * 250,
        "exp_avg\x00.add_(1)",
    ],
)
def test_prose_and_code_that_says_nothing_place_nothing(line: str) -> None:
    assert source_line_phase(line) is None


def _error_after(lines: list[str], marker: str) -> tuple[str, str]:
    """The source line above the first OOM line after ``marker`` and that OOM line, without
    the launcher's ``[rankN]:`` prefix (as a user pastes them)."""
    index = next(i for i, line in enumerate(lines) if marker in line)
    oom = next(i for i in range(index, len(lines)) if "OutOfMemoryError" in lines[i])
    source = next(i for i in range(oom - 1, 0, -1) if "^" not in lines[i])
    return (
        lines[source].split(":", 1)[1].strip() if lines[source].startswith("[rank") else "",
        lines[oom].split(": ", 1)[1] if lines[oom].startswith("[rank") else lines[oom],
    )


def test_a_paste_of_the_last_source_line_and_the_error_is_placed(tmp_path: Path) -> None:
    # GIVEN the real field paste: Adam's update line, then its OOM
    events = read_log(FIELD / "llamafactory-1221" / "paste.txt").oom_events
    assert [(e.phase, e.phase_source.line if e.phase_source else None) for e in events] == [
        (Phase.OPTIMIZER_STEP, 1)
    ]
    assert "exp_avg_sq" in (events[0].phase_evidence or "")
    # AND a variant from a GPU run: the multi-tensor Adam line and its OOM of the memory_leak
    # run, pasted without the frames (built by code from the real log)
    lines = (CRASH / "memory_leak" / "train.log").read_text().splitlines()
    source, error = _error_after(lines, "_multi_tensor_adam")
    assert source.startswith("exp_avg_sq_sqrt") and error.startswith("torch.OutOfMemoryError")
    paste = tmp_path / "paste.txt"
    paste.write_text(f"{source}\n{error}\n")
    (event,) = read_log(paste).oom_events
    assert event.phase is Phase.OPTIMIZER_STEP


def test_a_line_of_prose_above_the_error_places_nothing(tmp_path: Path) -> None:
    error = (FIELD / "llamafactory-1221" / "paste.txt").read_text().splitlines()[1]
    paste = tmp_path / "paste.txt"
    paste.write_text(f"when I run the optimizer with exp_avg_sq enabled I get\n{error}\n")
    (event,) = read_log(paste).oom_events
    assert event.phase is Phase.UNKNOWN
