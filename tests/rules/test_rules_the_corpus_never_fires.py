"""The rules no crash-corpus case fires (``non_pytorch_memory``, ``shm_exhausted``,
``config_invalid``), each on inputs made by code from real ones: a real OOM message with one of
its printed numbers changed, a real failing log with the line torch's DataLoader prints on a bus
error (read from the installed torch), a real ds_config with one setting DeepSpeed refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oomlens.report import Report
from oomlens.session import AnalysisOptions, analyze
from tests._corpus import case_dir

OOM_LINE = 31
"""fragmentation/train.log's torch.OutOfMemoryError line."""


def _ids(report: Report) -> dict[str, float]:
    return {d.id: d.confidence for d in report.diagnoses}


def _with_in_use(tmp_path: Path, in_use: str) -> Path:
    lines = (case_dir("fragmentation") / "train.log").read_text().splitlines(keepends=True)
    line = lines[OOM_LINE - 1]
    assert "this process has 7.16 GiB memory in use" in line
    lines[OOM_LINE - 1] = line.replace("this process has 7.16 GiB", f"this process has {in_use}")
    log = tmp_path / "train.log"
    log.write_text("".join(lines))
    return log


def test_memory_outside_pytorch_is_found_from_the_oom_message(tmp_path: Path) -> None:
    # GIVEN the real OOM message (3.45 GiB allocated + 3.02 GiB reserved-unallocated = 6.47 GiB
    # reserved by PyTorch) where this process is said to hold 11.16 GiB instead of 7.16 GiB
    report = analyze([_with_in_use(tmp_path, "11.16 GiB")])
    # THEN 4.69 GiB outside PyTorch's allocator is a finding, with the subtraction as evidence
    diagnosis = next(d for d in report.diagnoses if d.id == "non_pytorch_memory")
    assert diagnosis.figures["non_pytorch_bytes"].value == pytest.approx(4.69 * 2**30, rel=0.01)
    assert "11.16 GiB in use by this process - 6.47 GiB reserved by PyTorch" in (
        diagnosis.evidence[0].note
    )
    # one process (the lab run is): room for the CUDA context, not NCCL's buffers
    assert "NCCL_BUFFSIZE" not in diagnosis.fixes[0].environment
    assert "CUDA context" in diagnosis.fixes[0].summary
    # and the real message itself (0.69 GiB outside: a CUDA context) is no finding
    assert "non_pytorch_memory" not in _ids(analyze([case_dir("fragmentation") / "train.log"]))


def _torch_bus_error_line() -> str:
    torch = pytest.importorskip("torch", reason="torch (the test extra) prints the line")
    library = Path(torch.__file__).parent / "lib" / "libtorch_python.so"
    if not library.is_file():
        pytest.skip(f"{library} is not there")
    found = re.search(
        rb"ERROR: Unexpected bus error encountered in worker\.[ -~]*", library.read_bytes()
    )
    assert found is not None, "torch's DataLoader no longer prints its bus-error line"
    return found.group(0).decode()


def test_shared_memory_exhaustion_is_found_from_the_dataloaders_bus_error(tmp_path: Path) -> None:
    # GIVEN a real failed run's log with the line torch's DataLoader worker prints on SIGBUS
    line = _torch_bus_error_line()
    assert "insufficient shared memory" in line
    lines = (case_dir("nccl_timeout") / "train.log").read_text().splitlines(keepends=True)
    log = tmp_path / "train.log"
    log.write_text("".join(lines[:20]) + f"[rank1]: {line}\n" + "".join(lines[20:]))
    # THEN shm_exhausted names it, citing the line, with the container fix
    report = analyze([log])
    diagnosis = next(d for d in report.diagnoses if d.id == "shm_exhausted")
    assert diagnosis.confidence == pytest.approx(0.8)
    assert diagnosis.evidence[0].source is not None and diagnosis.evidence[0].source.line == 21
    assert "--shm-size" in (diagnosis.fixes[0].command or "")
    assert "shm_exhausted" not in _ids(analyze([case_dir("nccl_timeout") / "train.log"]))


def _broken_config(tmp_path: Path) -> Path:
    data = json.loads((case_dir("memory_leak") / "ds_config.json").read_text())
    data["zero_optimization"]["offload_optimizer"] = {"device": "gpu"}  # DeepSpeed: cpu, nvme, none
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(data, indent=2) + "\n")
    return config


@pytest.mark.parametrize("prefer_deepspeed", [True, False], ids=["deepspeed", "oomlens"])
def test_a_config_deepspeed_refuses_is_named_with_its_key(
    tmp_path: Path, prefer_deepspeed: bool
) -> None:
    options = AnalysisOptions(prefer_deepspeed=prefer_deepspeed)
    config = _broken_config(tmp_path)
    # GIVEN the config alone: a lead, not a cause (nothing failed)
    alone = analyze([config], options=options)
    diagnosis = next(d for d in alone.diagnoses if d.id == "config_invalid")
    assert diagnosis.confidence == pytest.approx(0.4)
    assert "zero_optimization.offload_optimizer.device" in diagnosis.summary
    assert diagnosis.fixes[0].command == "oomlens check ds_config.json"
    # WHEN it comes with the log of a run that failed THEN it is a likely cause
    with_log = analyze([config, case_dir("memory_leak") / "train.log"], options=options)
    assert _ids(with_log)["config_invalid"] == pytest.approx(0.85)
    # and the real config is not invalid
    real = analyze([case_dir("memory_leak") / "ds_config.json"], options=options)
    assert "config_invalid" not in _ids(real)
