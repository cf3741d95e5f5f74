"""Thin evidence still points somewhere: the failing CUDA call's name, the place of the failing
statement, the balance of one large request.  Each on a real paste of the field corpus
(development split) and on a variant built by code from it that removes the one sign, which
must then not be read."""

from __future__ import annotations

from pathlib import Path

from oomlens.report import Report
from oomlens.rules.uncertainty import SURE_ENOUGH
from oomlens.session import analyze

FIELD = Path(__file__).resolve().parents[2] / "fixtures" / "field_logs"


def _paste(case: str) -> Report:
    return analyze([FIELD / case / "paste.txt"])


def _variant(case: str, old: str, new: str, tmp_path: Path) -> Report:
    text = (FIELD / case / "paste.txt").read_text()
    assert old in text
    log = tmp_path / "paste.txt"
    log.write_text(text.replace(old, new))
    return analyze([log])


def _ids(report: Report) -> list[str]:
    return [d.id for d in report.diagnoses]


def test_a_cuda_call_that_allocates_nothing_names_memory_outside_the_allocators() -> None:
    # JAX: "cudaFuncSetAttribute(...): out of memory" (the framework's pool held the card)
    report = _paste("dallemini-185")
    top = report.top
    assert top is not None and top.id == "non_pytorch_memory"
    assert top.confidence < SURE_ENOUGH
    assert any("cudaFuncSetAttribute" in e.text for e in top.evidence)
    assert _ids(report)[-1] == "insufficient_evidence"
    assert report.missing


def test_an_allocating_call_is_not_read_as_memory_outside_the_allocators(tmp_path: Path) -> None:
    report = _variant("dallemini-185", "cudaFuncSetAttribute(", "cudaMallocAsync(", tmp_path)
    assert "non_pytorch_memory" not in _ids(report)
    assert _ids(report)[0] == "insufficient_evidence"


def test_one_operation_at_a_scripts_top_level_is_a_shape_suspect() -> None:
    # THC-era message with no size; the traceback is `a+b` at script.py line 7 and torch's
    # operator code only
    report = _paste("pytorch-2225")
    top = report.top
    assert top is not None and top.id == "oversized_allocation"
    assert top.confidence < SURE_ENOUGH
    assert any("script.py:7" in e.text for e in top.evidence)


def test_the_same_operation_inside_a_function_is_not_read_as_a_shape(tmp_path: Path) -> None:
    # the failing statement inside the user's training function: a step, not one lone op
    report = _variant(
        "pytorch-2225",
        'File "script.py", line 7, in <module>',
        'File "script.py", line 7, in train_step',
        tmp_path,
    )
    assert "oversized_allocation" not in _ids(report)


def test_a_model_frame_between_is_not_one_operation(tmp_path: Path) -> None:
    report = _variant(
        "pytorch-2225",
        "    a+b\n",
        "    a+b\n"
        '  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 224, in '
        "__call__\n    result = self.forward(*input, **kwargs)\n",
        tmp_path,
    )
    assert "oversized_allocation" not in _ids(report)


def test_one_large_request_filling_the_card_names_the_process_own_demand_low() -> None:
    # 4.44 GiB asked on a 10.58 GiB card, 5.77 GiB allocated, 178 MiB cached, the rest free
    report = _paste("dnabert2-78")
    top = report.top
    assert top is not None and top.id == "activation_memory"
    assert top.confidence < 0.3  # below a lone message of a full card
    assert any("4.44 GiB request" in e.text for e in top.evidence)
    assert _ids(report)[-1] == "insufficient_evidence"


def test_with_a_large_cache_the_large_request_is_not_read_as_own_demand(tmp_path: Path) -> None:
    # the same message with 4 GiB cached instead of 178 MiB: fragmentation's question
    report = _variant(
        "dnabert2-78",
        "this process has 6.14 GiB memory in use. Of the allocated memory 5.77 GiB is allocated "
        "by PyTorch, and 178.42 MiB is reserved",
        "this process has 6.14 GiB memory in use. Of the allocated memory 2.14 GiB is allocated "
        "by PyTorch, and 4.00 GiB is reserved",
        tmp_path,
    )
    assert "activation_memory" not in _ids(report)[:1]
