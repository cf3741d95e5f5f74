"""Where a pinned allocation failed (fuzz finding log-1016 of campaign F: an OOM message whose
own words say pinning, with no traceback frame, ended analyze in an IndexError)."""

from __future__ import annotations

from pathlib import Path

from oomlens.derive.pinned import pinned_failure
from oomlens.session import analyze

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
