"""Lines that report a failure and say it was not memory (``analysis/lookalikes``): torch's
CUDA-initialization warning and DeepSpeed's cuBLAS wrappers' kernel execution errors.  Real
pastes of the development split, and their lines changed by code where a variant is needed."""

from __future__ import annotations

from pathlib import Path

from oomlens.derive.lookalikes import non_memory_failure_lines
from oomlens.ingest.log import read_log
from oomlens.session import analyze
from tests.ingest.log._field import paste, paste_path

CRASH = Path(__file__).resolve().parents[2] / "fixtures" / "crash_logs"


def test_cuda_that_could_not_initialize_is_not_memory() -> None:
    # pytorch-88639: "UserWarning: CUDA initialization: CUDA unknown error - ... Setting the
    # available devices to be zero."
    [line] = non_memory_failure_lines([read_log(paste_path("pytorch-88639"))])
    assert line.source.line == 1 and "CUDA unknown error" in line.why
    report = analyze([paste_path("pytorch-88639")])
    assert report.top is not None and report.top.id == "not_oom"
    assert report.verdict.value == "other_failure"
    assert any(e.source is not None and e.source.line == 1 for e in report.top.evidence)


def test_a_cublas_kernel_that_failed_to_execute_is_not_memory() -> None:
    # deepspeed-454: "!!!! kernel execution error. (m: 768, n: 4608, k: 3072, error: 13)" and a
    # traceback cut before its exception
    report = analyze([paste_path("deepspeed-454")])
    assert report.top is not None and report.top.id == "not_oom"
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in " ".join(e.note for e in report.top.evidence)
    assert report.verdict.value == "other_failure"
    assert report.top.confidence < 0.7  # the exception itself is cut: named, not certain


def test_an_allocation_status_is_not_called_a_lookalike(tmp_path: Path) -> None:
    # GIVEN deepspeed-454's lines with status 3 (CUBLAS_STATUS_ALLOC_FAILED), changed by code
    alloc = tmp_path / "alloc.txt"
    alloc.write_text(paste("deepspeed-454").replace("error: 13)", "error: 3)"))
    # THEN nothing says "not memory"
    assert non_memory_failure_lines([read_log(alloc)]) == []
    assert "not_oom" not in [d.id for d in analyze([alloc]).diagnoses[:1]]


def test_a_cuda_initialization_that_ran_out_of_memory_is_not_a_lookalike(tmp_path: Path) -> None:
    # GIVEN pytorch-88639's warning naming "out of memory" as the driver's error (by code)
    oom = tmp_path / "init.txt"
    oom.write_text(paste("pytorch-88639").replace("CUDA unknown error", "out of memory"))
    assert non_memory_failure_lines([read_log(oom)]) == []


def test_a_warning_beside_a_real_oom_does_not_hide_it(tmp_path: Path) -> None:
    # GIVEN the activation OOM run's log with pytorch-88639's warning added at its end (by code)
    log = next((CRASH / "activation_memory").glob("*.log"))
    both = tmp_path / "both.log"
    both.write_text(log.read_text() + paste("pytorch-88639"))
    report = analyze([both])
    assert report.verdict.value == "gpu_oom"
    assert report.top is not None and report.top.id != "not_oom"
