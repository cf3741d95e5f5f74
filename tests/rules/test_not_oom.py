"""``not_oom`` never contradicts a memory failure that the text states."""

from __future__ import annotations

from pathlib import Path

from oomlens.session import analyze
from tests._corpus import case_dir

_DATALOADER_SHM = (
    # the lines torch's DataLoader prints when a worker's shared memory runs out
    "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
    "shared memory (shm).\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 40, in <module>\n'
    "    for batch in loader:\n"
    '  File "/usr/lib/python3.8/site-packages/torch/utils/data/dataloader.py", line 274, '
    "in handler\n"
    "    _error_if_any_worker_fails()\n"
    "RuntimeError: DataLoader worker (pid 125) is killed by signal: Bus error. \n"
)


def test_shared_memory_that_ran_out_is_not_also_a_failure_not_of_memory(tmp_path: Path) -> None:
    # It used to say "HOST OOM: /dev/shm exhausted, 90%" and then "not for lack of memory, 85%".
    path = tmp_path / "paste.txt"
    path.write_text(_DATALOADER_SHM)
    report = analyze([path])
    assert report.verdict.value == "host_oom"
    assert [d.id for d in report.diagnoses][:1] == ["shm_exhausted"]
    assert "not_oom" not in [d.id for d in report.diagnoses]
    cited = [(e.source, e.text) for e in report.diagnoses[0].evidence]
    assert len(cited) == len(set(cited)), "the same line cited twice"


def test_a_collective_timeout_is_named_first_not_the_launchers_summary() -> None:
    # nccl_timeout (a real 2-GPU run): the headline said only "the run failed with no memory
    # error", and the first evidence was torchrun's ChildFailedError, the launcher summing up.
    report = analyze([case_dir("nccl_timeout")])
    assert report.verdict_reason.startswith("a collective timed out (")
    assert "waiting for rank(s) 1" in report.verdict_reason
    top = report.diagnoses[0]
    assert top.id == "not_oom"
    assert "Watchdog caught collective operation timeout" in top.evidence[0].text
