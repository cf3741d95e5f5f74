"""The bulk scan's Arrow results as numpy arrays: pyarrow imported on demand, RE2's captured
groups cast to integers, floats and timestamps, Arrow arrays built over numpy memory and back.

Every function here is exact where the per-line parsers are: decimals cast by Arrow (correctly
rounded, as ``float()``), GiB rounded as ``deepspeed._gib``, timestamps checked as valid dates.
None of them imports pandas (``arrow_indices``).  ``load`` must have returned True before any
other function here is called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

pa: Any = None
pc: Any = None
"""pyarrow and pyarrow.compute, imported by the pure path's first scan (``load``): the
extension's path never needs them (importing them cost each reading process 0.2 s and 38 MiB)."""


def load() -> bool:
    """Import pyarrow for the pure path; False where it is missing."""
    global pa, pc
    if pa is None:
        try:
            import pyarrow
            import pyarrow.compute
        except ImportError:  # pragma: no cover - exercised where the extra is missing
            return False
        pa, pc = pyarrow, pyarrow.compute
    return True


NO_TS = int(np.iinfo(np.int64).min)
"""No timestamp (``BatchScan.ts``)."""

_GIB = float(1 << 30)


def _present(column: pa.Array) -> np.ndarray:
    """Which values of a binary or string column are there and not empty (a group that did not
    take part is captured as ``""``)."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)
    lengths = np.diff(offsets[column.offset : column.offset + len(column) + 1])
    return _valid(column) & (lengths > 0)


def _valid(array: pa.Array) -> np.ndarray:
    """An Arrow array's validity as numpy booleans."""
    if not array.null_count:
        return np.ones(len(array), dtype=bool)
    return _bits(array.buffers()[0], array.offset, len(array))


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
    result: np.ndarray = bits[offset : offset + length].astype(bool)
    return result


def _numbers(
    table: pa.StructArray, name: str, to: pa.DataType, dtype: type, missing: float
) -> np.ndarray:
    """A captured group of digits (or a decimal) cast by Arrow, ``missing`` where the group did
    not take part."""
    column = table.field(name)
    present = _present(column)
    out: np.ndarray = np.full(len(column), missing, dtype=dtype)
    chosen = np.flatnonzero(present)
    if len(chosen):
        text = pc.take(column, arrow_indices(chosen)).cast(pa.string())
        values = pc.cast(text, to)  # no nulls: every value chosen is there
        out[chosen] = np.frombuffer(values.buffers()[1], dtype=dtype)[
            values.offset : values.offset + len(values)
        ]
    return out


def ints(table: pa.StructArray, name: str) -> np.ndarray:
    """A group of digits as int64, ``-1`` where absent."""
    return _numbers(table, name, pa.int64(), np.int64, -1)


def floats(table: pa.StructArray, name: str) -> np.ndarray:
    """A decimal group as float64 (Arrow's parsing rounds correctly, as ``float`` does)."""
    return _numbers(table, name, pa.float64(), np.float64, np.nan)


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's algorithm)."""
    year = year - (month <= 2)
    era = np.floor_divide(year, 400)
    yoe = year - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days: np.ndarray = era * 146097 + doe - 719468
    return days


_DAYS = np.array([0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])


def timestamps(table: pa.StructArray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds since 1970 of ``YYYY-mm-dd HH:MM:SS,mmm`` texts (``NO_TS`` where there is
    none), and which of them are valid dates (the per-line parsers read nothing from an
    invalid one)."""
    column = table.field(name)
    n = len(column)
    present = _present(column)
    micros = np.full(n, NO_TS, dtype=np.int64)
    valid = np.ones(n, dtype=bool)
    if not present.any():
        return micros, valid
    chosen = np.flatnonzero(present)
    flat = pc.take(column, arrow_indices(chosen))
    offsets = np.frombuffer(flat.buffers()[1], dtype=np.int32)[flat.offset : flat.offset + 2]
    raw = np.frombuffer(flat.buffers()[2], dtype=np.uint8)[offsets[0] :]
    digits = raw[: 23 * len(chosen)].reshape(-1, 23).astype(np.int64) - 48

    def number(a: int, b: int) -> np.ndarray:
        out = np.zeros(len(chosen), dtype=np.int64)
        for j in range(a, b):
            out = out * 10 + digits[:, j]
        return out

    year, month, day = number(0, 4), number(5, 7), number(8, 10)
    hour, minute, second, milli = number(11, 13), number(14, 16), number(17, 19), number(20, 23)
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    limit = np.where((month == 2) & ~leap, 28, _DAYS[np.clip(month, 0, 12)])
    ok = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= limit)
    ok &= (hour < 24) & (minute < 60) & (second < 60)
    days = _days_from_civil(year, month, day)
    micros[chosen] = (((days * 24 + hour) * 60 + minute) * 60 + second) * 1_000_000 + milli * 1000
    valid[chosen] = ok
    return micros, valid


def gib(values: np.ndarray) -> np.ndarray:
    """``deepspeed._gib`` on many values: GiB to bytes, rounded half to even like ``round``."""
    return np.rint(values * _GIB).astype(np.int64)


def arrow_indices(indices: np.ndarray) -> pa.Array:
    """``indices`` as an Arrow int64 array over the same memory.  Not ``pa.array``: handed a
    numpy array it imports pandas to ask whether the array is a pandas object, which cost the
    reading process 40 MiB of resident memory for nothing (peak RSS reading a 100 MiB 64-rank
    dense log in one process: 204 MiB with pandas imported, 164 MiB without)."""
    ints = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(ints), [None, pa.py_buffer(ints)])


def numpy_bools(array: pa.Array) -> np.ndarray:
    """An Arrow boolean array as numpy's (null as False), unpacked from its bitmap: its
    ``to_numpy`` imports pandas (see ``arrow_indices``)."""
    result: np.ndarray = _valid(array) & _bits(array.buffers()[1], array.offset, len(array))
    return result
