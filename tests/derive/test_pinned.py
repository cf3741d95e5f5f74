"""Where a pinned allocation failed (fuzz finding log-1016 of campaign F: an OOM message whose
own words say pinning, with no traceback frame, ended analyze in an IndexError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.derive.pinned import pinned_failure
from oomlens.session import analyze
from tests._corpus import case_dir

# The torch 1.x message of a field paste (loravit-6) joined on one line with the DataLoader's
# pin-memory thread error, as a truncated log leaves them; no traceback frames.
LINE = (
    "RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 15.78 GiB total "
    "capacity; 13.19 GiB already allocated; 1.41 GiB free; 13.22 GiB reserved in total by "
    "PyTorch) Caught RuntimeError in pin memory thread for device 0."
)


def test_a_message_that_names_pinning_without_frames_is_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(LINE + "\n")
    report = analyze([log])
    failure = pinned_failure(report.facts)
    assert failure is not None and failure.oom
    assert "pin memory thread" in failure.text
    assert not failure.text.endswith(")")  # no frame was named
    assert report.verdict.value != "no_failure"


# A pinning call's own frame: ``t.pin_memory()`` is a C method and factories take
# ``pin_memory=True``, so the innermost Python frame is the caller's, its source line the call.
_PINNING_LINES = {
    "factory": "    buf = torch.zeros((layers, numel), dtype=torch.float16, pin_memory=True)",
    "method": "    cpu_grads = [g.detach().cpu().pin_memory() for g in grads]",
    "not pinning": "    buf = torch.zeros((layers, numel), dtype=torch.float16, device='cuda')",
}


def _driver_oom_in(tmp_path: Path, current: str) -> Path:
    # driver_oom_other_process: a real torch 2.11 run whose runtime said "CUDA error: out of
    # memory"; its innermost frames replaced by one whose current line is ``current``
    real = (case_dir("driver_oom_other_process") / "train.log").read_text().splitlines()
    error = next(i for i, ln in enumerate(real) if "CUDA error: out of memory" in ln)
    frame = ['  File "/home/user/llm-train/zero_offload.py", line 77, in allocate_buffers', current]
    log = tmp_path / "train.log"
    log.write_text("\n".join([*real[:3], *frame, *real[error:]]) + "\n")
    return log


@pytest.mark.parametrize("kind", ["factory", "method"])
def test_a_runtime_oom_in_a_pinning_call_is_pinned_host_memory(tmp_path: Path, kind: str) -> None:
    report = analyze([_driver_oom_in(tmp_path, _PINNING_LINES[kind])])
    failure = pinned_failure(report.facts)
    assert failure is not None and failure.oom and "allocate_buffers" in failure.text
    assert report.verdict.value == "host_oom"
    assert report.diagnoses[0].id == "pinned_memory_exhaustion"


def test_a_runtime_oom_in_a_device_allocation_is_not_pinned(tmp_path: Path) -> None:
    report = analyze([_driver_oom_in(tmp_path, _PINNING_LINES["not pinning"])])
    assert pinned_failure(report.facts) is None
    assert report.verdict.value == "gpu_oom"


def test_a_runtime_oom_in_a_library_function_that_pins_is_pinned(tmp_path: Path) -> None:
    """The innermost frame is DeepSpeed's ``buffer_to_accumulate_to_in_cpu`` (ZeRO offload),
    whose current line pins through the accelerator (no ``.pin_memory()`` of its own): the
    library knowledge, read from DeepSpeed's source, says that function pins."""
    real = (case_dir("driver_oom_other_process") / "train.log").read_text().splitlines()
    error = next(i for i, ln in enumerate(real) if "CUDA error: out of memory" in ln)
    site = "/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/zero/stage_1_and_2.py"
    frame = [
        f'  File "{site}", line 1195, in buffer_to_accumulate_to_in_cpu',
        "    return get_accelerator().pin_memory(buffer) if self.cpu_offload_pin_memory else "
        "buffer",
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join([*real[:3], *frame, *real[error:]]) + "\n")
    report = analyze([log])
    failure = pinned_failure(report.facts)
    assert failure is not None and failure.oom
    assert "buffer_to_accumulate_to_in_cpu" in failure.text
    assert report.verdict.value == "host_oom"
