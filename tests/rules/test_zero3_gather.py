"""A ZeRO-3 parameter gather that runs out of memory is not blamed on activations.

When the traceback shows the failing allocation is DeepSpeed gathering a layer's parameters
(``fetch_sub_module`` -> ``all_gather_coalesced``), the activation cause's own evidence says
"gathered parameters, not activations, were being allocated": that cause may not lead the
answer on the message's figures alone, whatever the message says of the card.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.session import analyze
from tests._corpus import case_dir

_FULL_CARD = (
    # a full card as torch 2.2+ prints it, without a per-process cap
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 320.00 MiB. GPU 0 has a "
    "total capacity of 47.53 GiB of which 156.69 MiB is free. Including non-PyTorch memory, "
    "this process has 47.35 GiB memory in use. Of the allocated memory 46.74 GiB is allocated "
    "by PyTorch, and 307.15 MiB is reserved by PyTorch but unallocated."
)


def _gather_paste(tmp_path: Path, message: str | None) -> Path:
    # prefetch_overshoot: a real ZeRO-3 run; rank 0's traceback as a user pastes it
    prefix = "[rank0]: "
    lines = [
        ln[len(prefix) :]
        for ln in (case_dir("prefetch_overshoot") / "train.log").read_text().splitlines()
        if ln.startswith(prefix)
    ]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    end = next(i for i, ln in enumerate(lines) if i > start and "OutOfMemoryError" in ln)
    kept = lines[start:end] + [message or lines[end]]
    assert any("fetch_sub_module" in ln for ln in kept)
    path = tmp_path / "paste.txt"
    path.write_text("\n".join(kept) + "\n")
    return path


@pytest.mark.parametrize("message", [None, _FULL_CARD], ids=["capped", "full card"])
def test_a_gather_oom_names_no_cause_its_own_evidence_contradicts(
    tmp_path: Path, message: str | None
) -> None:
    report = analyze([_gather_paste(tmp_path, message)])
    assert report.verdict.value == "gpu_oom"
    top = report.diagnoses[0]
    assert top.id != "activation_memory"
    assert all(e.supports for e in top.evidence), top
