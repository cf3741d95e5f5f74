"""The fragmentation fix fits the torch build that printed the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.session import analyze

# torch 1.4-2.0's template; 1.10-2.0 add their own hint after it
_RESERVED = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.29 GiB (GPU 0; 31.72 GiB total "
    "capacity; 19.22 GiB already allocated; 1.88 GiB free; 28.32 GiB reserved in total by "
    "PyTorch)"
)
_HINT = (
    " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# torch 2.2+'s template
_CAPACITY = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.29 GiB. GPU 0 has a total "
    "capacity of 31.72 GiB of which 1.88 GiB is free. Including non-PyTorch memory, this "
    "process has 29.83 GiB memory in use. Of the allocated memory 19.22 GiB is allocated by "
    "PyTorch, and 9.10 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


@pytest.mark.parametrize(
    ("message", "setting"),
    [
        (_RESERVED, None),
        (_RESERVED + _HINT, "max_split_size_mb:128"),
        (_CAPACITY, "expandable_segments:True"),
    ],
    ids=["torch-1.4-1.9", "torch-1.10-2.0", "torch-2.2+"],
)
def test_the_allocator_setting_proposed_exists_in_that_torch(
    tmp_path: Path, message: str, setting: str | None
) -> None:
    # megatronlm-60 (Python 3.6, torch 1.x) was told expandable_segments:True, which a torch
    # before 2.1 refuses at startup.
    path = tmp_path / "paste.txt"
    path.write_text(message + "\n")
    [fragmentation] = [d for d in analyze([path]).diagnoses if d.id == "fragmentation"]
    proposed = [
        f.environment["PYTORCH_CUDA_ALLOC_CONF"]
        for f in fragmentation.fixes
        if "PYTORCH_CUDA_ALLOC_CONF" in f.environment
    ]
    assert proposed == ([setting] if setting else [])
    if setting is None:
        assert "upgrade torch" in fragmentation.fixes[0].summary
