"""Host allocation failures raised outside torch's CPU allocator are host memory.

Python raises ``MemoryError`` (pybind11 translates C++'s ``std::bad_alloc`` into it), numpy
its ``_ArrayMemoryError`` ("Unable to allocate {size} for an array with shape {shape} and data
type {dtype}"), C++ code that lets ``std::bad_alloc`` escape dies in the runtime's terminate
handler, and a system call refused memory raises ``OSError: [Errno 12] Cannot allocate
memory`` (a DataLoader worker's fork).  Each is verdict ``host_oom`` citing the line, never
"failed with no memory error".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.diagnosis import Verdict
from oomlens.session import analyze
from tests._corpus import case_dir

_FRAMES = [
    "Traceback (most recent call last):",
    '  File "/home/user/llm-train/build_index.py", line 112, in <module>',
    "    main()",
    '  File "/home/user/llm-train/build_index.py", line 97, in main',
    "    table = build(corpus)",
]

_RAISED = {
    "numpy 2": [
        *_FRAMES,
        "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 2.91 TiB for an array "
        "with shape (400000, 1000000) and data type float64",
    ],
    "pybind11 bad_alloc": [*_FRAMES, "MemoryError: std::bad_alloc"],
    "bare MemoryError": [*_FRAMES, "MemoryError"],
    "uncaught bad_alloc": [
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "  what():  std::bad_alloc",
    ],
    "fork refused": [
        *_FRAMES,
        '  File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 66, in _launch',
        "    self.pid = os.fork()",
        "              ^^^^^^^^^",
        "BlockingIOError: [Errno 12] Cannot allocate memory",
    ],
}


def _log(tmp_path: Path, tail: list[str]) -> Path:
    # the start of a real run (DeepSpeed's launcher lines), then the failure
    head = (case_dir("memory_leak") / "train.log").read_text().splitlines()[:5]
    path = tmp_path / "train.log"
    path.write_text("\n".join([*head, *tail]) + "\n")
    return path


@pytest.mark.parametrize("name", sorted(_RAISED))
def test_a_host_allocation_failure_is_host_memory(tmp_path: Path, name: str) -> None:
    report = analyze([_log(tmp_path, _RAISED[name])])
    assert report.verdict is Verdict.HOST_OOM, report.verdict_reason
    assert report.verdict_reason.startswith("a host allocation failed (")
    top = report.diagnoses[0]
    assert top.id == "host_oom_killed"
    assert any(e.source is not None and e.source.line and e.supports for e in top.evidence)


def test_the_array_size_numpy_printed_is_the_request(tmp_path: Path) -> None:
    report = analyze([_log(tmp_path, _RAISED["numpy 2"])])
    event = report.facts.oom_events()[0]
    assert event.message.tried_to_allocate == round(2.91 * 2**40)


def test_code_that_handles_memory_errors_is_not_one(tmp_path: Path) -> None:
    # a frame's source line naming MemoryError, and a ValueError after it: not an allocation
    lines = [
        *_FRAMES,
        '  File "/home/user/llm-train/build_index.py", line 60, in build',
        "    except MemoryError: shrink()",
        "ValueError: need at least one array to concatenate",
    ]
    report = analyze([_log(tmp_path, lines)])
    assert report.verdict is not Verdict.HOST_OOM


@pytest.mark.parametrize("name", sorted(_RAISED))
def test_a_host_allocation_failure_at_the_end_of_a_long_log_is_read(
    tmp_path: Path, name: str
) -> None:
    # over 1 MiB: read in bulk with the reader's anchor table, not line by line
    real = (case_dir("memory_leak") / "train.log").read_text().splitlines()
    steps = [ln for ln in real if "step" in ln][:40]
    body = steps * (1_200_000 // len("\n".join(steps)) + 1)
    path = _log(tmp_path, [*body, *_RAISED[name]])
    assert path.stat().st_size > 1 << 20
    report = analyze([path])
    assert report.verdict is Verdict.HOST_OOM, report.verdict_reason
