"""``non_pytorch_memory`` proposes what the run can act on."""

from __future__ import annotations

from pathlib import Path

from oomlens.session import analyze

# deepspeed-3869's message (torch 1.x on a 4 GB card under WSL2): 1.28 GiB outside the allocator
_MESSAGE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 978.00 MiB (GPU 0; "
    "4.00 GiB total capacity; 1.68 GiB already allocated; 0 bytes free; 2.72 GiB reserved in "
    "total by PyTorch)"
)


def _fix_environment(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "paste.txt"
    path.write_text(text)
    [outside] = [d for d in analyze([path]).diagnoses if d.id == "non_pytorch_memory"]
    return dict(outside.fixes[0].environment)


def test_one_process_is_not_told_to_shrink_nccl_or_jax(tmp_path: Path) -> None:
    # It was: NCCL_BUFFSIZE and XLA_PYTHON_CLIENT_PREALLOCATE, for a single process with
    # neither NCCL nor JAX in it.
    assert _fix_environment(tmp_path, _MESSAGE + "\n") == {}


def test_a_run_of_several_ranks_is(tmp_path: Path) -> None:
    text = f"[rank1]: step 3 loss 2.5\n[rank0]: {_MESSAGE}\n"
    assert "NCCL_BUFFSIZE" in _fix_environment(tmp_path, text)
