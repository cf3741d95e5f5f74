"""torchelastic error files, both message shapes."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from oomlens.errors import InputError
from oomlens.facts.log import OomKind
from oomlens.ingest.elastic import read_error_file

ASSETS = Path(__file__).parents[1] / "assets" / "logs"
ERROR_FILE = ASSETS / "torchelastic_error_file_example.json"


def test_nested_shape_gives_failure_oom_and_traceback() -> None:
    facts = read_error_file(ERROR_FILE, local_rank=1)
    assert facts.failure.origin == "error_file" and facts.failure.local_rank == 1
    assert facts.failure.timestamp == datetime.fromtimestamp(1796014820)
    assert facts.oom_event is not None and facts.oom_event.message.kind is OomKind.ALLOCATOR
    assert facts.oom_event.message.tried_to_allocate == 1024**4
    assert facts.oom_event.message.exception_class == "OutOfMemoryError"
    assert facts.traceback is not None and facts.traceback.frames[-1].function == "main"


def test_flat_shape(tmp_path: Path) -> None:
    nested = json.loads(ERROR_FILE.read_text())
    flat = {"message": nested["message"]["message"], "timestamp": 1796014820}
    target = tmp_path / "error.json"
    target.write_text(json.dumps(flat))
    facts = read_error_file(target, rank=3)
    assert facts.failure.rank == 3 and facts.oom_event is not None and facts.traceback is None


@pytest.mark.parametrize("content", [b"{not json", b'{"other": 1}', b'{"message": 5}'])
def test_bad_error_files_raise_input_error(tmp_path: Path, content: bytes) -> None:
    target = tmp_path / "error.json"
    target.write_bytes(content)
    with pytest.raises(InputError):
        read_error_file(target)


@pytest.mark.parametrize(
    "content",
    [
        b'{"message": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"message": {"message": "x", "extraInfo": {"py_callstack": ' + b"[" * 50_000 + b"}}}",
        # past the 64 KiB that detection parses: only the reader sees the nesting
        b'{"message": "' + b"x" * 70_000 + b'", "extra": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    ],
)
def test_deeply_nested_error_file_is_an_input_error(tmp_path: Path, content: bytes) -> None:
    target = tmp_path / "error.json"
    target.write_bytes(content)
    with pytest.raises(InputError, match="nested"):
        read_error_file(target)
