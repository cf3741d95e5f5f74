"""Hostile pickles: the loader must refuse them with one clear InputError and run nothing.

Every payload that would have a visible effect if executed (write a marker file, start a
process that writes one) checks afterwards that the effect did not happen.  The pickles are
built with ``pickle.dumps`` of objects whose ``__reduce__`` names the dangerous call (dumping
runs nothing) or written opcode by opcode.
"""

from __future__ import annotations

import builtins
import copyreg
import gzip
import os
import pickle
import pickletools
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oomlens.errors import InputError, ResourceLimitError
from oomlens.ingest.snapshot import FORBIDDEN_OPCODES, SnapshotLimits, load_snapshot
from tests.assets.snapshots import make_variants as variants


class _Reduce:
    """An object that pickles as ``func(*args)``."""

    def __init__(self, func: Callable[..., Any], *args: Any) -> None:
        self.func = func
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "EXECUTED"
    yield path
    assert not path.exists(), "the hostile pickle ran code"


def _write(tmp_path: Path, payload: bytes, name: str = "hostile.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(payload)
    return path


def _refused(path: Path, opcode: str) -> InputError:
    with pytest.raises(InputError) as caught:
        load_snapshot(path)
    error = caught.value
    text = str(error)
    assert type(error) is InputError
    assert text.startswith(f"{path}: refused to load"), text
    assert opcode in text, text
    assert "nothing in it was run" in text
    assert "\n" not in text
    return error


def _touch_command(marker: Path) -> str:
    return f"touch {marker}"


# ---- imports of callables -----------------------------------------------------------------


def test_os_system_protocol_0_text_global(tmp_path: Path, marker: Path) -> None:
    payload = f"cos\nsystem\n(V{_touch_command(marker)}\ntR.".encode()
    error = _refused(_write(tmp_path, payload), "GLOBAL")
    assert "os.system" in str(error)


@pytest.mark.parametrize("protocol", [2, 3])
def test_os_system_binary_global(protocol: int, tmp_path: Path, marker: Path) -> None:
    payload = pickle.dumps(_Reduce(os.system, _touch_command(marker)), protocol=protocol)
    error = _refused(_write(tmp_path, payload), "GLOBAL")
    assert "system" in str(error)


@pytest.mark.parametrize("protocol", [4, 5])
def test_os_system_stack_global(protocol: int, tmp_path: Path, marker: Path) -> None:
    payload = pickle.dumps(_Reduce(os.system, _touch_command(marker)), protocol=protocol)
    assert b"\x93" in payload  # STACK_GLOBAL
    _refused(_write(tmp_path, payload), "STACK_GLOBAL")


def test_subprocess_popen(tmp_path: Path, marker: Path) -> None:
    payload = pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(marker)]), protocol=5)
    error = _refused(_write(tmp_path, payload), "STACK_GLOBAL")
    assert "subprocess.Popen" in str(error)


def test_builtins_exec(tmp_path: Path, marker: Path) -> None:
    payload = pickle.dumps(
        _Reduce(builtins.exec, f"open({str(marker)!r}, 'w').write('x')"), protocol=4
    )
    error = _refused(_write(tmp_path, payload), "STACK_GLOBAL")
    assert "builtins.exec" in str(error)


def test_builtins_eval(tmp_path: Path, marker: Path) -> None:
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    payload = pickle.dumps(_Reduce(builtins.eval, code), protocol=2)
    _refused(_write(tmp_path, payload), "GLOBAL")


def test_open_write_chain(tmp_path: Path, marker: Path) -> None:
    # getattr(open(marker, 'w'), 'write')('x'): two imports and three calls.
    handle = _Reduce(builtins.open, str(marker), "w")
    write = _Reduce(builtins.getattr, handle, "write")
    payload = pickle.dumps(_Reduce(_call, write, "x"), protocol=4)
    _refused(_write(tmp_path, payload), "STACK_GLOBAL")


def _call(func: Callable[..., Any], *args: Any) -> Any:
    return func(*args)


def test_inst_opcode(tmp_path: Path, marker: Path) -> None:
    payload = f"(V{_touch_command(marker)}\nios\nsystem\n.".encode()
    error = _refused(_write(tmp_path, payload), "INST")
    assert "os.system" in str(error)


def test_obj_opcode(tmp_path: Path, marker: Path) -> None:
    command = _touch_command(marker).encode()
    payload = b"\x80\x02(cos\nsystem\nX" + struct.pack("<I", len(command)) + command + b"o."
    _refused(_write(tmp_path, payload), "GLOBAL")


def test_obj_without_import(tmp_path: Path) -> None:
    # OBJ on a plain string: nothing callable exists, the opcode itself is refused.
    payload = b"\x80\x02(X\x03\x00\x00\x00abco."
    _refused(_write(tmp_path, payload), "OBJ")


def test_reduce_without_import(tmp_path: Path) -> None:
    payload = b"\x80\x02]\x94)R."  # EMPTY_LIST EMPTY_TUPLE REDUCE
    _refused(_write(tmp_path, payload), "REDUCE")


def test_newobj(tmp_path: Path) -> None:
    payload = b"\x80\x02ccollections\nOrderedDict\n)\x81."
    _refused(_write(tmp_path, payload), "GLOBAL")


def test_newobj_without_import(tmp_path: Path) -> None:
    payload = b"\x80\x02X\x01\x00\x00\x00a)\x81."  # a str as the class
    _refused(_write(tmp_path, payload), "NEWOBJ")


def test_newobj_ex(tmp_path: Path) -> None:
    payload = b"\x80\x04\x8c\x0bcollections\x8c\x0bOrderedDict\x93)}\x92."
    _refused(_write(tmp_path, payload), "STACK_GLOBAL")


def test_newobj_ex_without_import(tmp_path: Path) -> None:
    payload = b"\x80\x04\x8c\x01a)}\x92."
    _refused(_write(tmp_path, payload), "NEWOBJ_EX")


def test_build_on_plain_data(tmp_path: Path) -> None:
    payload = b"\x80\x02}}X\x01\x00\x00\x00aK\x01sb."  # EMPTY_DICT {a: 1} BUILD
    _refused(_write(tmp_path, payload), "BUILD")


# ---- extension registry and persistent ids ------------------------------------------------


@pytest.fixture
def extension_code() -> Iterator[Callable[[int], None]]:
    registered: list[int] = []

    module = os.system.__module__  # 'posix' on Linux

    def register(code: int) -> None:
        copyreg.add_extension(module, "system", code)
        registered.append(code)

    yield register
    for code in registered:
        copyreg.remove_extension(module, "system", code)


@pytest.mark.parametrize(("code", "opcode"), [(0xF0, "EXT1"), (0x1F00, "EXT2"), (0x1F0000, "EXT4")])
def test_extension_codes(
    code: int, opcode: str, tmp_path: Path, marker: Path, extension_code: Callable[[int], None]
) -> None:
    # GIVEN os.system registered under an extension code, as an attacker would hope
    extension_code(code)
    payload = pickle.dumps(_Reduce(os.system, _touch_command(marker)), protocol=2)
    assert pickle.__dict__[opcode] in payload

    # THEN loading refuses while the code is still registered
    error = _refused(_write(tmp_path, payload), opcode)
    assert f"{os.system.__module__}.system" in str(error)


def test_extension_code_already_resolved_in_this_process(
    tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an extension code this process once resolved: the C unpickler would serve
    # os.system from copyreg._extension_cache without asking find_class.
    monkeypatch.setitem(copyreg._extension_cache, 0xF1, os.system)  # type: ignore[attr-defined]
    command = _touch_command(marker).encode()
    payload = b"\x80\x02\x82\xf1X" + struct.pack("<I", len(command)) + command + b"\x85R."

    # THEN the loader falls back to its pure-Python unpickler and refuses the opcode
    _refused(_write(tmp_path, payload), "EXT1")


class _WithPersistentId(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return "the-host-filesystem" if obj == "secret" else None


@pytest.mark.parametrize(("protocol", "opcode"), [(0, "PERSID"), (2, "BINPERSID")])
def test_persistent_ids(protocol: int, opcode: str, tmp_path: Path) -> None:
    import io

    buffer = io.BytesIO()
    _WithPersistentId(buffer, protocol=protocol).dump({"segments": ["secret"]})
    _refused(_write(tmp_path, buffer.getvalue()), opcode)


# ---- hidden inside data that looks right --------------------------------------------------


@pytest.mark.parametrize("kind", ["defaultdict", "numpy"])
def test_harmless_classes_from_other_tools_are_refused_too(kind: str, tmp_path: Path) -> None:
    # Tools that re-save snapshots may pickle a defaultdict or numpy arrays: still an import.
    import collections

    import numpy

    value: Any = collections.defaultdict(list) if kind == "defaultdict" else numpy.zeros(3)
    payload = pickle.dumps({"segments": [], "device_traces": [value]}, protocol=4)

    error = _refused(_write(tmp_path, payload), "STACK_GLOBAL")
    assert ("collections.defaultdict" if kind == "defaultdict" else "numpy") in str(error)


def test_payload_deep_inside_a_real_snapshot(tmp_path: Path, marker: Path) -> None:
    # GIVEN a real snapshot whose last trace entry's frame name is a callable
    data = variants.load_real("stacks_all")
    entry = data["device_traces"][0][-3]
    entry["frames"] = [
        *entry["frames"][:-1],
        {"name": _Reduce(os.system, _touch_command(marker)), "filename": "x.py", "line": 1},
    ]
    payload = pickle.dumps(data, protocol=4)
    position = next(pos for op, _, pos in pickletools.genops(payload) if op.name == "STACK_GLOBAL")
    assert position > len(payload) * 0.9  # far into the file

    error = _refused(_write(tmp_path, payload), "STACK_GLOBAL")
    assert f"byte {position} holds a STACK_GLOBAL opcode" in str(error)


def test_memoized_callable_reused(tmp_path: Path, marker: Path) -> None:
    # GLOBAL os.system, MEMOIZE, then BINGET it back for the call.
    command = _touch_command(marker).encode()
    payload = (
        b"\x80\x02cos\nsystem\nq\x00h\x00X" + struct.pack("<I", len(command)) + command + b"\x85R."
    )
    _refused(_write(tmp_path, payload), "GLOBAL")


def test_self_referencing_structures(tmp_path: Path) -> None:
    # Memoized objects put back inside themselves: a segment list that contains itself and a
    # frame list that contains itself.  Plain data, so it loads; it is no snapshot.
    segments: list[Any] = []
    segments.append(segments)
    path = _write(tmp_path, pickle.dumps({"segments": segments}, protocol=4))

    with pytest.raises(InputError, match=r"segments\[0\] is a list, not a dict"):
        load_snapshot(path)


def test_self_referencing_frames_are_analyzed_without_hanging(tmp_path: Path) -> None:
    from oomlens.analysis.allocator import analyze_snapshot

    data = variants.load_real("stacks_all")
    frames = data["segments"][0]["blocks"][0]["frames"]
    frames.append(frames)  # the list is shared with its alloc trace entry too
    path = _write(tmp_path, pickle.dumps(data, protocol=4))

    analysis = analyze_snapshot(load_snapshot(path))

    assert analysis.devices[0].state.allocated_bytes > 0


def test_unknown_memo_index(tmp_path: Path) -> None:
    path = _write(tmp_path, b"\x80\x02}h\x07s.")  # BINGET of a memo slot never filled

    with pytest.raises(InputError, match="corrupt pickle"):
        load_snapshot(path)


def test_gzipped_payload(tmp_path: Path, marker: Path) -> None:
    payload = gzip.compress(pickle.dumps(_Reduce(os.system, _touch_command(marker)), protocol=4))
    _refused(_write(tmp_path, payload, "hostile.pickle.gz"), "STACK_GLOBAL")


# ---- broken files -------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0005, 0.25, 0.5, 0.999])
def test_truncated_real_snapshot(fraction: float, tmp_path: Path) -> None:
    data = variants.REAL["stacks_all"].read_bytes()
    path = _write(tmp_path, data[: max(3, int(len(data) * fraction))])

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    assert str(caught.value).startswith(f"{path}: is truncated")
    assert "dump the snapshot again" in str(caught.value)


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(variants.REAL["stacks_all"].read_bytes())
    path = _write(tmp_path, data[: len(data) // 2], "cut.pickle.gz")

    with pytest.raises(InputError, match="truncated"):
        load_snapshot(path)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x04\x8d" + struct.pack("<Q", 2**60) + b"abc",  # BINUNICODE8 of 2**60 bytes
        b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"abc",  # BINBYTES8
        b"\x80\x05\x96" + struct.pack("<Q", 2**50) + b"abc",  # BYTEARRAY8
        b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"}.",  # FRAME
        b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"\x00",  # LONG4
        b"\x80\x02X" + struct.pack("<I", 2**32 - 1) + b"abc",  # BINUNICODE of 4 GiB
    ],
    ids=["binunicode8", "binbytes8", "bytearray8", "frame", "long4", "binunicode"],
)
def test_huge_declared_lengths_allocate_nothing(payload: bytes, tmp_path: Path) -> None:
    path = _write(tmp_path, payload)

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    text = str(caught.value)
    assert text.startswith(str(path))
    assert (
        "truncated" in text or "limit" in text or "more memory than this machine can give" in text
    )


def test_huge_item_inside_the_file_hits_the_item_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, pickle.dumps({"segments": ["x" * 3_000_000]}, protocol=4))

    with pytest.raises(ResourceLimitError, match="single 2.86 MiB item"):
        load_snapshot(path, limits=SnapshotLimits(max_item_bytes=1024 * 1024))


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"", "is empty"),
        (b"GARBAGE\x00\xff" * 100, "is not a pickle file"),
        (b'{"segments": []}', "is not a pickle file"),
        (b"\x80\x07}.", "pickle protocol 7"),
        (b"\x7fELF\x02\x01\x01" + b"\x00" * 64, "is not a pickle file"),
        (b"\x1f\x8b\x08\x00garbage-after-a-gzip-magic", "gzip"),
    ],
    ids=["empty", "garbage", "json", "protocol7", "elf", "bad-gzip"],
)
def test_not_a_pickle(payload: bytes, problem: str, tmp_path: Path) -> None:
    path = _write(tmp_path, payload)

    with pytest.raises(InputError) as caught:
        load_snapshot(path)

    assert str(caught.value).startswith(f"{path}: ")
    assert problem in str(caught.value)


def test_deeply_nested_data_is_no_crash(tmp_path: Path) -> None:
    depth = 200_000
    payload = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."  # lists inside lists

    with pytest.raises(InputError, match=r"segments\[0\] is a list, not a dict"):
        load_snapshot(_write(tmp_path, payload))


def test_every_forbidden_opcode_is_covered() -> None:
    # The refusal table and the tests above agree on the opcode set.
    assert set(FORBIDDEN_OPCODES) == {
        "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
        "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID",
    }  # fmt: skip
    assert sys.modules["pickle"].HIGHEST_PROTOCOL >= 5


# ---- memo indices: the C unpickler sizes its memo from them -------------------------------

# The peak is read from VmHWM: ru_maxrss keeps the parent's peak across fork and exec.
_MEMO_PROBE = """
import sys
from oomlens.errors import ResourceLimitError
from oomlens.ingest.snapshot.unpickler import restricted_load
try:
    restricted_load(sys.argv[1])
    outcome = "loaded"
except ResourceLimitError as error:
    outcome = "refused: " + str(error)
print(outcome)
with open("/proc/self/status") as status:
    peak = next(line for line in status if line.startswith("VmHWM:"))
print(int(peak.split()[1]) * 1024)
"""


def _memo_pickle(opcode: str, index: int) -> bytes:
    """A list memoized under ``index`` by ``opcode``, then a few sparse ones after it."""
    if opcode == "PUT":  # protocol 0: the index in decimal on a line
        return b"(lp" + str(index).encode() + b"\n0(lp" + str(index * 3 + 7).encode() + b"\n."
    if opcode == "LONG_BINPUT":
        return (
            b"\x80\x02]r"
            + struct.pack("<I", index)
            + b"0]r"
            + struct.pack("<I", min(index * 3 + 7, 2**32 - 1))
            + b"."
        )
    if opcode == "BINPUT":  # one byte of index: at most 255, sparse
        return b"\x80\x02]q\xff0]q\x80."
    # MEMOIZE takes no index: the memo's length, so it grows one entry per opcode byte.
    return b"\x80\x04]" + b"\x94" * 200_000 + b"."


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM")
@pytest.mark.parametrize("wrap", ["plain", "gzip"])
@pytest.mark.parametrize(
    ("opcode", "index"),
    [("PUT", 0x0900_0000), ("LONG_BINPUT", 0x0A00_0001), ("BINPUT", 255), ("MEMOIZE", 0)],
)
def test_memo_indices_are_bounded_before_the_memo_is_allocated(
    opcode: str, index: int, wrap: str, tmp_path: Path
) -> None:
    payload = _memo_pickle(opcode, index)
    path = _write(tmp_path, gzip.compress(payload) if wrap == "gzip" else payload)
    done = subprocess.run(
        [sys.executable, "-c", _MEMO_PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    outcome, peak = done.stdout.splitlines()
    # An index of 0x09000000 makes a 2.25 GiB memo; the bound keeps the process far below.
    assert int(peak) < 600 * 1024**2, (outcome, int(peak))
    if index > 0x0100_0000:
        assert outcome.startswith(f"refused: {path}: asks for more memory"), outcome
    else:
        assert outcome == "loaded", outcome
