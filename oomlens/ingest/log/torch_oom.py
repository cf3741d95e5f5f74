"""Parse OOM error messages of every torch generation into ``OomMessage`` (sizes in bytes).

``parse_oom_message(text)`` is a pure function: give it the text of one message (a line, or
a line and its continuation lines joined with ``\\n``) and it returns what the message says,
or None when the text holds no OOM.  Partial text (a log cut mid-message, the 2.2/2.3 builds
that cut the message after ``GPU ``) gives the fields that were printed and
``complete=False``.  Sizes are parsed as printed: ``512 bytes``, ``2.00 MiB``, ``139.80 GiB``
(and ``MB``/``GB`` where MPS or forks print them), all binary units.

Forms understood (see the reference notes, section 1): the caching allocator's messages of
1.0-1.3 (``cached``), 1.4-2.0 (``reserved in total by PyTorch``, ``max_split_size_mb`` hint),
2.1 (``capacty``), 2.2+ (``capacity``, ``allowed;``, private pools, ``Process N has``), the
same from HIP/XPU/NPU/DPCPP; ``more than 1EB``; cudaMallocAsync's multi-line form; MPS;
driver ``CUDA error: out of memory``; THC ``cuda runtime error (2)``; the NVML internal
assert that replaces an OOM whose details were lost; cuBLAS/cuDNN/cuSOLVER status errors;
NCCL ``Cuda failure 'out of memory'`` and ``Failed to CUDA calloc``; host
``DefaultCPUAllocator: can't allocate memory``.  Triton's ``OutOfResources`` (shared memory of
a kernel config) is deliberately not an OOM.

All patterns are linear (no nested repetition) and every field is searched separately, so
time is bounded by the text's length.
"""

from __future__ import annotations

import functools

import regex

from oomlens.facts.log import OomKind, OomMessage, ProcessMemory
from oomlens.units import parse_size

MAX_MESSAGE_CHARS = 4000

ANCHORS: tuple[bytes, ...] = (
    b"out of memory",
    b"OutOfMemory",
    b"Out of memory",
    b"_STATUS_",
    b"alloc_failed",
    b"valid cuDNN algorithm",
    b"INTERNAL ASSERT FAILED",
    b"CUDA calloc",
    b"can't allocate memory",
    b"OUT_OF_MEMORY",
)
"""Literal substrings one of which every OOM message's first line contains (prefilter)."""

_QUICK = tuple(anchor.decode() for anchor in ANCHORS)
# "Tried to allocate" and "would exceed allowed memory" always share their line with
# "out of memory"; "hipErrorOutOfMemory" holds "OutOfMemory"; cuBLAS/cuDNN/HSA statuses hold
# "_STATUS_".

_SIZE = r"(\d{1,24}(?:\.\d{1,6})?)\s?(bytes|[KMGTP]i?B|B)\b"
_ANY_BACKEND = r"(?P<backend>[A-Z][A-Za-z0-9]{0,15})"

_ALLOC_START = regex.compile(_ANY_BACKEND + r" out of memory\. Tried to allocate ")
_TRIED = regex.compile(r"Tried to allocate (?:(?P<eb>more than 1EB memory)|" + _SIZE + ")")
_NEW_DEVICE = regex.compile(
    r"\b(?:GPU|XPU|NPU|device) (?P<dev>\d{1,4}|[\x00-\x1f])?[ ]?has a total capac(?P<typo>i?)ty of "
    + _SIZE
)
_TRUNCATED_AFTER_GPU = regex.compile(
    r"Tried to allocate \d[\d.]{0,30} ?[A-Za-z]{1,5}\. (?:GPU|XPU)[ \x00-\x1f]{0,4}\Z"
)
_FREE_NEW = regex.compile(r"of which " + _SIZE + r" is free")
_OTHER_PROCESS = regex.compile(r"Process (\d{1,10}) has " + _SIZE + " memory in use")
_THIS_PROCESS = regex.compile(r"this process has " + _SIZE + " memory in use")
_ALLOWED = regex.compile(_SIZE + r" allowed;")
_ALLOCATED_NEW = regex.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_PRIVATE_POOLS = regex.compile(r"with " + _SIZE + r" allocated in private pools")
_RESERVED_UNALLOCATED = regex.compile(r"and " + _SIZE + r" is reserved by PyTorch but unallocated")
_LEGACY_OPEN = regex.compile(r"\((?P<devname>GPU|NPU|XPU|MLU|GCU|MUSA) ?(?P<dev>\d{1,4});")
_LEGACY_CLAUSE = regex.compile(
    _SIZE + r" (?P<label>total capacity|already allocated|free|allowed|"
    r"reserved in total by PyTorch|cached|current active)"
)

_ASYNC_START = regex.compile(r"Allocation on device (?P<dev>\d{1,4}) would exceed allowed memory")
_ASYNC_FIELD = regex.compile(
    r"(?P<label>Currently allocated|Requested|Device limit|Free \(according to CUDA\)|"
    r"PyTorch limit \(set by user-supplied memory fraction\))\s{0,40}:\s{0,40}" + _SIZE
)
_MPS_FIELDS = regex.compile(r"(?P<label>MPS allocated|other allocations|max allowed): " + _SIZE)
_MPS_TRIED = regex.compile(r"Tried to allocate " + _SIZE + r" on (?:private|shared) pool")
_NVML_ASSERT = regex.compile(
    r"NVML_SUCCESS == [^\n]{0,300}?INTERNAL ASSERT FAILED at [^\n]{0,200}?CUDACachingAllocator"
)
_HOST = regex.compile(
    r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d{1,24}) bytes"
)
_CUBLAS = regex.compile(r"CUBLAS_STATUS_(ALLOC_FAILED|NOT_INITIALIZED)")
_CUDNN = regex.compile(
    r"CUDNN_STATUS_(ALLOC_FAILED|NOT_INITIALIZED|INTERNAL_ERROR)|Unable to find a valid cuDNN alg"
    r"orithm"
)
_CUSOLVER = regex.compile(r"(?i:cusolver_status_alloc_failed)")
_NCCL_CALLOC = regex.compile(r"Failed to CUDA calloc (?:async )?(\d{1,24}) bytes")
_NCCL_CUDA_FAILURE = regex.compile(r"Cuda failure (?:\d{1,4} )?'out of memory'")
_NCCL_ERROR = regex.compile(r"NCCL error|ncclUnhandledCudaError|NCCL WARN")
_DRIVER = regex.compile(
    r"(?P<backend>CUDA|HIP|cuda) (?:driver )?error: out of memory|hipErrorOutOfMemory|"
    r"CUDA_ERROR_OUT_OF_MEMORY|HSA_STATUS_ERROR_OUT_OF_RESOURCES"
)
_THC = regex.compile(r"cuda runtime error \(2\) : out of memory|error=2 : out of memory")
_EXCEPTION_BEFORE = regex.compile(
    r"(?P<cls>[A-Za-z_][\w.:]{0,120}?(?:Error|Exception))\s{0,4}:\s{0,4}['\"]?\s{0,2}\Z"
)


def looks_like_oom(text: str) -> bool:
    """Cheap test: does ``text`` contain the start of an OOM message?  (No false negatives
    for the forms ``parse_oom_message`` understands on their first line.)"""
    return any(quick in text for quick in _QUICK)


def _size(number: str, unit: str) -> int:
    return parse_size(f"{number} {unit}")


def _exception_class(text: str, start: int) -> str | None:
    match = _EXCEPTION_BEFORE.search(text, max(0, start - 160), start)
    return match.group("cls") if match else None


@functools.lru_cache(maxsize=64)
def parse_oom_message(text: str, *, exception_class: str | None = None) -> OomMessage | None:
    """What the OOM message in ``text`` says, or None when ``text`` holds none.

    ``exception_class`` is used when the text itself does not name the exception (e.g. the
    ``what():`` line after ``terminate called after throwing an instance of ...``).  Results
    are immutable and cached: a log that repeats one message thousands of times (a retry
    loop) parses it once.
    """
    if not looks_like_oom(text):
        return None
    for parser in (
        _parse_allocator,
        _parse_malloc_async,
        _parse_mps,
        _parse_nvml_assert,
        _parse_host,
        _parse_cublas,
        _parse_cudnn,
        _parse_cusolver,
        _parse_nccl,
        _parse_driver,
        _parse_thc,
    ):
        result = parser(text, exception_class)
        if result is not None:
            return result
    return None


def _clip(text: str, start: int) -> str:
    return text[start : start + MAX_MESSAGE_CHARS].rstrip("'\" \n")


def _parse_allocator(text: str, exception_class: str | None) -> OomMessage | None:
    start_match = _ALLOC_START.search(text)
    if start_match is None:
        return None
    start = start_match.start()
    # Hard-wrapped consoles split the single-line message anywhere: read it unwrapped.
    body = text[start:].replace("\n", "")
    backend = start_match.group("backend")
    fields: dict[str, object] = {}
    tried = _TRIED.match(body, len(start_match.group(0)) - len("Tried to allocate "))
    message_format = "capacity"
    if tried is not None:
        if tried.group("eb"):
            fields["tried_to_allocate"] = 2**60
            message_format = "exabyte"
        else:
            fields["tried_to_allocate"] = _size(tried.group(2), tried.group(3))
    complete = message_format == "exabyte"
    legacy = _LEGACY_OPEN.search(body)
    new_device = _NEW_DEVICE.search(body)
    if message_format == "exabyte":
        pass
    elif legacy is not None and (new_device is None or legacy.start() < new_device.start()):
        fields["device"] = int(legacy.group("dev"))
        labels: dict[str, int] = {}
        for clause in _LEGACY_CLAUSE.finditer(body, legacy.end()):
            labels.setdefault(clause.group("label"), _size(clause.group(1), clause.group(2)))
        fields["total_capacity"] = labels.get("total capacity")
        fields["allocated_by_pytorch"] = labels.get("already allocated")
        fields["free"] = labels.get("free")
        fields["allowed"] = labels.get("allowed")
        reserved = labels.get("reserved in total by PyTorch", labels.get("cached"))
        fields["reserved_total"] = reserved
        allocated = labels.get("already allocated")
        if reserved is not None and allocated is not None:
            fields["reserved_unallocated"] = max(reserved - allocated, 0)
        message_format = "cached" if "cached" in labels else "reserved"
        complete = reserved is not None
    elif new_device is not None:
        device_text = new_device.group("dev")
        if device_text is None or not device_text.isdigit():
            # 2.2/2.3 streamed the int8 device raw: a control character, or nothing once a
            # NUL (device 0) was removed.
            fields["device"] = ord(device_text) if device_text else 0
        else:
            fields["device"] = int(device_text)
        fields["total_capacity"] = _size(new_device.group(3), new_device.group(4))
        message_format = "capacty" if not new_device.group("typo") else "capacity"
        tail = new_device.end()
        free = _FREE_NEW.search(body, tail)
        if free:
            fields["free"] = _size(free.group(1), free.group(2))
        others = tuple(
            ProcessMemory(int(m.group(1)), _size(m.group(2), m.group(3)))
            for m in _OTHER_PROCESS.finditer(body, tail)
        )[:64]
        fields["other_processes"] = others
        this_process = _THIS_PROCESS.search(body, tail)
        if this_process:
            fields["process_in_use"] = _size(this_process.group(1), this_process.group(2))
        allowed = _ALLOWED.search(body, tail)
        if allowed:
            fields["allowed"] = _size(allowed.group(1), allowed.group(2))
        allocated = _ALLOCATED_NEW.search(body, tail)
        if allocated:
            fields["allocated_by_pytorch"] = _size(allocated.group(1), allocated.group(2))
        pools = _PRIVATE_POOLS.search(body, tail)
        if pools:
            fields["private_pools"] = _size(pools.group(1), pools.group(2))
        unallocated = _RESERVED_UNALLOCATED.search(body, tail)
        if unallocated:
            fields["reserved_unallocated"] = _size(unallocated.group(1), unallocated.group(2))
        complete = unallocated is not None
    elif _TRUNCATED_AFTER_GPU.search(body) is not None:
        message_format = "truncated"
        fields["device"] = 0  # the cut is the NUL that device 0 was printed as
    else:
        message_format = "capacity"
    return OomMessage(
        kind=OomKind.ALLOCATOR if backend != "MPS" else OomKind.MPS,
        message_format=message_format,
        certain=True,
        text=_clip(body, 0),
        complete=complete,
        exception_class=_exception_class(text, start) or exception_class,
        backend=backend,
        **fields,  # type: ignore[arg-type]
    )


def _parse_malloc_async(text: str, exception_class: str | None) -> OomMessage | None:
    start_match = _ASYNC_START.search(text)
    if start_match is None:
        return None
    values: dict[str, int] = {}
    for field in _ASYNC_FIELD.finditer(text, start_match.end()):
        values.setdefault(field.group("label"), _size(field.group(2), field.group(3)))
    limit = values.get("PyTorch limit (set by user-supplied memory fraction)")
    return OomMessage(
        kind=OomKind.ALLOCATOR_ASYNC,
        message_format="malloc_async",
        certain=True,
        text=_clip(text, start_match.start()),
        complete=limit is not None,
        exception_class=_exception_class(text, start_match.start()) or exception_class,
        backend="CUDA",
        device=int(start_match.group("dev")),
        tried_to_allocate=values.get("Requested"),
        total_capacity=values.get("Device limit"),
        free=values.get("Free (according to CUDA)"),
        allocated_by_pytorch=values.get("Currently allocated"),
        # SIZE_MAX printed as 17179869184.00 GiB means "no fraction set".
        allowed=limit if limit is not None and limit < 2**60 else None,
    )


def _parse_mps(text: str, exception_class: str | None) -> OomMessage | None:
    start = text.find("MPS backend out of memory")
    if start < 0:
        return None
    values = {
        m.group("label"): _size(m.group(2), m.group(3))
        for m in _MPS_FIELDS.finditer(text, start, start + 600)
    }
    tried = _MPS_TRIED.search(text, start, start + 800)
    return OomMessage(
        kind=OomKind.MPS,
        message_format="mps",
        certain=True,
        text=_clip(text, start),
        complete=tried is not None,
        exception_class=_exception_class(text, start) or exception_class,
        backend="MPS",
        tried_to_allocate=_size(tried.group(1), tried.group(2)) if tried else None,
        allocated_by_pytorch=values.get("MPS allocated"),
        other_allocations=values.get("other allocations"),
        allowed=values.get("max allowed"),
    )


def _simple(
    kind: OomKind,
    message_format: str,
    text: str,
    start: int,
    exception_class: str | None,
    *,
    certain: bool = True,
    backend: str | None = "CUDA",
    tried: int | None = None,
) -> OomMessage:
    return OomMessage(
        kind=kind,
        message_format=message_format,
        certain=certain,
        text=_clip(text, _line_start(text, start)),
        complete=True,
        exception_class=_exception_class(text, _line_start(text, start))
        or _exception_class(text, start)
        or exception_class,
        backend=backend,
        tried_to_allocate=tried,
    )


def _line_start(text: str, pos: int) -> int:
    """Start of the message that holds ``pos``: after ``Error: `` on its line, else the line."""
    line_start = text.rfind("\n", 0, pos) + 1
    match = _EXCEPTION_BEFORE.search(text, line_start, pos)
    return match.end() if match else line_start


def _parse_nvml_assert(text: str, exception_class: str | None) -> OomMessage | None:
    match = _NVML_ASSERT.search(text)
    if match is None:
        return None
    return _simple(
        OomKind.PROBABLE_OOM_ASSERT,
        "nvml_assert",
        text,
        match.start(),
        exception_class,
        certain=False,
    )


def _parse_host(text: str, exception_class: str | None) -> OomMessage | None:
    match = _HOST.search(text)
    if match is None:
        return None
    return _simple(
        OomKind.HOST,
        "host",
        text,
        match.start(),
        exception_class,
        backend="CPU",
        tried=int(match.group(1)),
    )


def _parse_cublas(text: str, exception_class: str | None) -> OomMessage | None:
    match = _CUBLAS.search(text)
    if match is None:
        return None
    return _simple(
        OomKind.CUBLAS,
        "cublas",
        text,
        match.start(),
        exception_class,
        certain=match.group(1) == "ALLOC_FAILED",
    )


def _parse_cudnn(text: str, exception_class: str | None) -> OomMessage | None:
    match = _CUDNN.search(text)
    if match is None:
        return None
    return _simple(
        OomKind.CUDNN,
        "cudnn",
        text,
        match.start(),
        exception_class,
        certain=match.group(1) == "ALLOC_FAILED",
    )


def _parse_cusolver(text: str, exception_class: str | None) -> OomMessage | None:
    match = _CUSOLVER.search(text)
    if match is None:
        return None
    return _simple(OomKind.CUSOLVER, "cusolver", text, match.start(), exception_class)


def _parse_nccl(text: str, exception_class: str | None) -> OomMessage | None:
    calloc = _NCCL_CALLOC.search(text)
    failure = _NCCL_CUDA_FAILURE.search(text)
    if calloc is None and failure is None:
        return None
    first = min(m.start() for m in (calloc, failure) if m is not None)
    nccl = _NCCL_ERROR.search(text)
    start = nccl.start() if nccl is not None and nccl.start() < first else first
    message_format = "nccl_warn" if "NCCL WARN" in text else "nccl"
    return _simple(
        OomKind.NCCL,
        message_format,
        text,
        start,
        exception_class,
        tried=int(calloc.group(1)) if calloc else None,
    )


def _parse_driver(text: str, exception_class: str | None) -> OomMessage | None:
    match = _DRIVER.search(text)
    if match is None:
        return None
    backend = (
        "HIP"
        if "HIP" in match.group(0) or "hip" in match.group(0) or "HSA" in match.group(0)
        else "CUDA"
    )
    return _simple(OomKind.DRIVER, "driver", text, match.start(), exception_class, backend=backend)


def _parse_thc(text: str, exception_class: str | None) -> OomMessage | None:
    match = _THC.search(text)
    if match is None:
        return None
    return _simple(OomKind.DRIVER, "thc", text, match.start(), exception_class)
