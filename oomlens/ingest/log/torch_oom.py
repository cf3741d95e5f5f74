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
time is bounded by the text's length.  The caching allocator's messages are parsed here; the
other libraries' and runtimes' in ``oom_libraries``; the text helpers (squeezing, clipping, the
exception class before a message) are in ``oom_text``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from itertools import islice

import regex

from oomlens.facts.log import OomKind, OomMessage, ProcessMemory
from oomlens.ingest.log import oom_libraries
from oomlens.ingest.log.oom_text import (
    MAX_MESSAGE_CHARS,
    clip,
    exception_class_before,
    squeeze,
    wrapped_start,
)
from oomlens.lazyregex import lazy_regex
from oomlens.units import parse_size

ANCHORS: tuple[bytes, ...] = (
    b"out of memory",
    b"OutOfMemory",
    b"Out of memory",
    b"_STATUS_",
    b"alloc_failed",
    b"valid cuDNN algorithm",
    b"INTERNAL ASSERT FAILED",
    b"CUDA calloc",
    b"CPUAllocator",
    b"OUT_OF_MEMORY",
    b"MemoryError",
)
"""Literal substrings one of which every OOM message's first line contains (prefilter)."""

FRAGMENT_ANCHORS: tuple[bytes, ...] = (
    b"Tried to allocate",
    b"total capacity",
    b"total capacty",
    b"already allocated",
    b"reserved in total by",
    b"is reserved by PyTorch",
    b"memory in use",
    b"is allocated by PyTorch",
    b"Allocation on device",
    b"out of mem",
    b"esource exhausted",
    b"RESOURCE_EXHAUSTED",
    b"OOM when allocating",
    b"OutOfMemoryError",
)
"""What is left of an allocator message that a paste starts mid-way or wraps: read on inputs
small enough to be read line by line (see the log reader)."""

_QUICK = (
    *(anchor.decode() for anchor in ANCHORS),
    # messages that end a traceback or an uncaught C++ exception, which reach the reader
    # through the traceback's and the terminate handler's anchors (the table is full)
    "std::bad_alloc",
    "Cannot allocate memory",
)
# "Tried to allocate" and "would exceed allowed memory" always share their line with
# "out of memory"; "hipErrorOutOfMemory" holds "OutOfMemory"; cuBLAS/cuDNN/HSA statuses hold
# "_STATUS_".
_QUICK_SQUEEZED = (
    "outofmem",
    "OutOfMemory",
    "Outofmemory",
    "Triedtoallocate",
    "totalcapac",
    "alreadyallocated",
    "reservedintotalbyPyTorch",
    "isreservedbyPyTorch",
    "wouldexceedallowedmemory",
    "esourceexhausted",
    "RESOURCE_EXHAUSTED",
    "OOMwhenallocating",
)
# The caching allocator's message is read from a squeezed copy of the text (``oom_text``).
_SIZE = r"(\d{1,24}(?:\.\d{1,6})?)\s?(bytes|[KMGTP]i?B|B)\b"

_SZ = r"(\d{1,24}(?:\.\d{1,6})?)(bytes|[KMGTPE]iB|[KMGTP]B|B)"
_BACKENDS = (
    r"(?P<backend>CUDA|HIP|XPU|NPU|MPS|MUSA|MLU|GCU|DPCPP|HPU|ROCm|"
    r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9]{1,7})"
)
_SQ_START = lazy_regex(_BACKENDS + r"outofmemory(?=\.|\Z|Tried|\(GPU)")
_SQ_TRIED = lazy_regex(r"Triedtoallocate(?:(?P<eb>morethan1EBmemory)|" + _SZ + ")")
_SQ_NEW_DEVICE = lazy_regex(
    r"(?:GPU|XPU|NPU|device)(?P<dev>\d{1,4}|[\x00-\x08\x0b\x0c\x0e-\x1f])?hasatotalcapac"
    r"(?P<typo>i?)tyof" + _SZ
)
_SQ_TRUNCATED_AFTER_GPU = lazy_regex(
    r"Triedtoallocate\d[\d.]{0,30}[A-Za-z]{1,5}\.(?:GPU|XPU)[\x00-\x1f]{0,4}\Z"
)
_SQ_FREE_NEW = lazy_regex(r"ofwhich" + _SZ + r"isfree")
_SQ_OTHER_PROCESS = lazy_regex(r"Process(\d{1,10})has" + _SZ + r"memoryinuse")
_SQ_THIS_PROCESS = lazy_regex(r"thisprocesshas" + _SZ + r"memoryinuse")
_SQ_ALLOWED = lazy_regex(_SZ + r"allowed;")
_SQ_ALLOCATED_NEW = lazy_regex(r"(?:Oftheallocatedmemory)?" + _SZ + r"isallocatedbyPyTorch")
"""Read by its own words: a paste may keep the clause and elide its lead-in."""
_SQ_PRIVATE_POOLS = lazy_regex(r"with" + _SZ + r"allocatedinprivatepools")
_SQ_RESERVED_UNALLOCATED = lazy_regex(r"and" + _SZ + r"isreservedbyPyTorchbutunallocated")
_SQ_LEGACY_OPEN = lazy_regex(r"\((?P<devname>GPU|NPU|XPU|MLU|GCU|MUSA)(?P<dev>\d{1,4});")
_SQ_LEGACY_CLAUSE = lazy_regex(
    _SZ + r"(?P<label>totalcapacity|alreadyallocated|free|allowed|reservedintotalbyPyTorch|"
    r"cached|currentactive)"
)
_SQ_MESSAGE_START = lazy_regex(
    _BACKENDS + r"outofmemory(?=\.|\Z|Tried|\(GPU)|Triedtoallocate(?!\d[\d.]{0,30}[A-Za-z]{1,5}"
    r"on(?:private|shared)pool)|\((?:GPU|NPU|XPU|MLU|GCU|MUSA)\d{1,4};\d|"
    r"(?:GPU|XPU|NPU)(?:\d{1,4})?hasatotalcapac|"
    r"(?<![\d.])\d{1,24}(?:\.\d{1,6})?(?:bytes|[KMGTPE]iB|[KMGTP]B|B)"
    r"(?:totalcapacity|alreadyallocated|reservedintotalbyPyTorch);"
)
"""Where an allocator message (or what is left of it in a paste that starts mid-way) begins."""
_SQ_LIST_GOES_ON = lazy_regex(r"\.(?:Of|Includ|\d|If|Please|See)")
SELF_TOLERANCE = 16 * 1024 * 1024
"""Sizes are printed with two decimals: a process' X and PyTorch's reserved memory compared
with this much slack."""

_SQ_ASYNC_START = lazy_regex(r"Allocationondevice(?P<dev>\d{1,4})wouldexceedallowedmemory")
_SQ_ASYNC_FIELD = lazy_regex(
    r"(?P<label>Currentlyallocated|Requested|Devicelimit|Free\(accordingtoCUDA\)|"
    r"PyTorchlimit\(setbyuser-suppliedmemoryfraction\)):" + _SZ
)
_MPS_FIELDS = lazy_regex(r"(?P<label>MPS allocated|other allocations|max allowed): " + _SIZE)
_MPS_TRIED = lazy_regex(r"Tried to allocate " + _SIZE + r" on (?:private|shared) pool")


def looks_like_oom(text: str) -> bool:
    """Cheap test: does ``text`` contain the start of an OOM message, or what is left of one
    (wrapped anywhere, cut at its start)?  (No false negatives for the forms
    ``parse_oom_message`` understands.)"""
    if any(quick in text for quick in _QUICK):
        return True
    squeezed = squeeze(text[:MAX_MESSAGE_CHARS])[0]
    return any(quick in squeezed for quick in _QUICK_SQUEEZED)


_START_FRAGMENTS = (
    "outofmem",
    "esourceexhausted",
    "RESOURCE_EXHAUSTED",
    "OOMwhenallocating",
    "OutOfMemory",
    "Triedtoallocate",
    "totalcapac",
    "alreadyallocated",
    "reservedintotal",
    "isreservedbyPyTorch",
    "Allocationondevice",
)


def starts_oom(text: str) -> bool:
    """Does the line ``text`` start an OOM message, or what is left of one: a message the
    parser reads, or one wrapped before its numbers (``torch.OutOfMemoryError: CUDA out of
    memo``), or a paste that starts mid-message (``Tried to allocate 2.00 GiB (GPU 0; ...``)?"""
    if parse_oom_message(text) is not None:
        return True
    squeezed = squeeze(text[:MAX_MESSAGE_CHARS])[0]
    return any(fragment in squeezed for fragment in _START_FRAGMENTS)


def _size(number: str, unit: str) -> int:
    return parse_size(f"{number} {unit}")


_EMPHASIS = regex.compile(r"(?:\*\*|__)(?=\s*[0-9])|(?<=[0-9]|[0-9]\s?[KMGTPE]?i?B)\s*(?:\*\*|__)")
"""Markdown bold opening before a figure or closing after one (``**10.36 GiB**``), wherever
a wrap broke the line inside it."""


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
    if "**" in text or "__" in text:
        # a ticket's Markdown: emphasis around a figure is the writer's, not torch's
        text = _EMPHASIS.sub("", text)
    for parser in (
        _parse_malloc_async,
        _parse_mps,
        _parse_allocator,
        oom_libraries.parse_nvml_assert,
        oom_libraries.parse_host,
        oom_libraries.parse_cublas,
        oom_libraries.parse_cudnn,
        oom_libraries.parse_cusolver,
        oom_libraries.parse_nccl,
        oom_libraries.parse_driver,
        oom_libraries.parse_library_cuda_check,
        oom_libraries.parse_thc,
        oom_libraries.parse_framework,
        _parse_class_only,
    ):
        result = parser(text, exception_class)
        if result is not None:
            return result
    return None


@functools.lru_cache(maxsize=64)
def parse_oom_messages(text: str, *, exception_class: str | None = None) -> tuple[OomMessage, ...]:
    """Every OOM message in ``text``: one, or several when ranks printed theirs into one line
    (``...PYTORCH_CUDA_ALLOC_CONFCUDA out of memory. Tried to allocate...``); ``()`` when
    ``text`` holds none.  Cached like ``parse_oom_message``: a repeated line is searched for
    further messages once."""
    first = parse_oom_message(text, exception_class=exception_class)
    if first is None or first.kind not in (OomKind.ALLOCATOR, OomKind.MPS):
        return (first,) if first is not None else ()
    starts = allocator_starts(text)
    if len(starts) < 2:
        return (first,)
    more = [parse_oom_message(text[s:], exception_class=first.exception_class) for s in starts[1:]]
    return (first, *(m for m in more[:63] if m is not None))


def _sq_size(match: regex.Match[str], first: int = 1) -> int:
    return _size(match.group(first), match.group(first + 1))


def allocator_starts(text: str, limit: int | None = None) -> list[int]:
    """Where each caching-allocator message in ``text`` begins (indices into ``text``): a
    message cut at its start (a paste that begins at ``Tried to allocate``, at ``(GPU 0;`` or
    at ``GPU 0 has a total capacity``) begins at what is left of it.  Two messages printed
    into one line (every rank writing to one terminal) give two starts.  With ``limit``, only
    the first ``limit`` starts."""
    squeezed, kept = squeeze(text)
    return [kept[match.start()] for match in islice(_message_matches(squeezed), limit)]


ANCHOR_CONTEXT = 120
"""Squeezed characters before a new line that a message start ending in it can reach back
over (the longest start, ``<24 digits>.<6 digits>GiBreservedintotalbyPyTorch;``, is ~70)."""


def has_allocator_start(squeezed: str) -> bool:
    """Whether squeezed text holds the start of a caching-allocator message (as
    ``allocator_starts`` finds them)."""
    return _SQ_MESSAGE_START.search(squeezed) is not None


_SQ_NEXT_MESSAGE = lazy_regex(
    _BACKENDS + r"outofmemory(?=\.|\Z|Tried)|(?<!memory\.)Triedtoallocate"
)
_SQ_CLASS_BEFORE = lazy_regex(r"[A-Za-z_][\w.]{0,120}?(?:Error|Exception):['\"]?\Z")


_START_LITERALS = (
    "outofmemory",
    "Triedtoallocate",
    "(GPU",
    "(NPU",
    "(XPU",
    "(MLU",
    "(GCU",
    "(MUSA",
    "hasatotalcapac",
    "totalcapacity",
    "alreadyallocated",
    "reservedintotalbyPyTorch",
)
"""Every match of ``_SQ_MESSAGE_START`` holds one of these, at most ``_START_REACH`` characters
from its start (a backend name of up to 8; ``GPU<4 digits>``; ``<24 digits>.<6>bytes``)."""
_START_REACH = 40
_NEXT_LITERALS = ("outofmemory", "Triedtoallocate")
"""The same for ``_SQ_NEXT_MESSAGE`` (reach: the backend name)."""
_NEXT_REACH = 8


class _Skipper:
    """Where a pattern's next match can begin at the earliest, from where its literals next
    occur in ``text``: the pattern is searched from there, not from every character of a
    paste without a message (its search is ~0.4 s a MiB in the ``regex`` module; ``str.find``
    of a literal is far faster)."""

    __slots__ = ("_next", "reach", "text")

    def __init__(self, text: str, literals: tuple[str, ...], reach: int) -> None:
        self.text, self.reach = text, reach
        self._next = dict.fromkeys(literals, -2)

    def start(self, position: int) -> int | None:
        """The earliest index at or after ``position`` where a match can begin; None when none
        can.  (A match at or after ``position`` holds a literal at or after it.)  The positions
        asked must not decrease."""
        best = -1
        for literal, at in self._next.items():
            if at == -1:
                continue
            if at < position:
                at = self._next[literal] = self.text.find(literal, position)
                if at == -1:
                    continue
            if best < 0 or at < best:
                best = at
        return None if best < 0 else max(position, best - self.reach)


def _message_matches(squeezed: str) -> Iterator[regex.Match[str]]:
    """The match of ``_SQ_MESSAGE_START`` of each allocator message in squeezed text, in order.
    A message's own clauses follow its start, so the next message is searched for from the
    next ``out of memory`` or ``Tried to allocate`` after it, never at its own ``(GPU 0;``;
    both patterns are searched from where their literals next occur (``_Skipper``)."""
    starts = _Skipper(squeezed, _START_LITERALS, _START_REACH)
    nexts = _Skipper(squeezed, _NEXT_LITERALS, _NEXT_REACH)
    position = starts.start(0)
    while position is not None:
        match = _SQ_MESSAGE_START.search(squeezed, position)
        if match is None:
            return
        yield match
        after_from = nexts.start(match.end())
        after = None if after_from is None else _SQ_NEXT_MESSAGE.search(squeezed, after_from)
        if after is None:
            return
        position = starts.start(after.start())


def message_starts(text: str) -> list[int]:
    """Where the OOM messages of ``text`` (a whole paste) begin, their exception class
    included, wherever the lines were wrapped: indices into ``text``.  What a paste's lines
    cannot show, the squeezed text does (an anchor cut in two by a wrap)."""
    squeezed, kept = squeeze(text)
    found: list[int] = []
    # the last thousand: a run's crash ends its text, whatever it printed before
    for match in deque(_message_matches(squeezed), 1000):
        start = match.start()
        cls = _SQ_CLASS_BEFORE.search(squeezed, max(0, start - 160), start)
        if cls is None:
            found.append(kept[start])
            continue
        begin, at = kept[cls.start()], kept[start]
        if "\n" in text[begin:at]:  # a class a wrap cut, or a line that is no class's
            begin = wrapped_start(text, begin, at)
        found.append(begin)
    if "Allocationondevice" in squeezed:
        found += [kept[m.start()] for m in deque(_SQ_ASYNC_START.finditer(squeezed), 100)]
    return sorted(found)


def _parse_allocator(text: str, exception_class: str | None) -> OomMessage | None:
    starts = allocator_starts(text, 2)
    if not starts:
        return None
    start = starts[0]
    # One message at a time: the next message printed into the same text is not this one's.
    stop = starts[1] if len(starts) > 1 else len(text)
    body = text[start:stop].replace("\n", "")
    squeezed, _ = squeeze(text[start:stop])
    backend_match = _SQ_START.match(squeezed)
    backend = backend_match.group("backend") if backend_match is not None else None
    fields: dict[str, object] = {}
    tried = _SQ_TRIED.search(squeezed, 0, 200)
    message_format = "capacity"
    if tried is not None:
        if tried.group("eb"):
            fields["tried_to_allocate"] = 2**60
            message_format = "exabyte"
        else:
            fields["tried_to_allocate"] = _sq_size(tried, 2)
    complete = message_format == "exabyte"
    legacy = _SQ_LEGACY_OPEN.search(squeezed)
    new_device = _SQ_NEW_DEVICE.search(squeezed)
    legacy_clauses = list(_SQ_LEGACY_CLAUSE.finditer(squeezed, legacy.end() if legacy else 0))
    if message_format == "exabyte":
        pass
    elif (legacy is not None and (new_device is None or legacy.start() < new_device.start())) or (
        legacy is None and new_device is None and len(legacy_clauses) >= 2
    ):
        if legacy is not None:
            fields["device"] = int(legacy.group("dev"))
        labels: dict[str, int] = {}
        for clause in legacy_clauses:
            labels.setdefault(clause.group("label"), _sq_size(clause))
        fields["total_capacity"] = labels.get("totalcapacity")
        fields["allocated_by_pytorch"] = labels.get("alreadyallocated")
        fields["free"] = labels.get("free")
        fields["allowed"] = labels.get("allowed")
        reserved = labels.get("reservedintotalbyPyTorch", labels.get("cached"))
        fields["reserved_total"] = reserved
        allocated = labels.get("alreadyallocated")
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
        fields["total_capacity"] = _sq_size(new_device, 3)
        message_format = "capacty" if not new_device.group("typo") else "capacity"
        complete = _new_clauses(squeezed, new_device.end(), fields)
    elif _SQ_TRUNCATED_AFTER_GPU.search(squeezed) is not None:
        message_format = "truncated"
        fields["device"] = 0  # the cut is the NUL that device 0 was printed as
    elif backend is None and tried is None:
        return None
    return OomMessage(
        kind=OomKind.ALLOCATOR if backend != "MPS" else OomKind.MPS,
        message_format=message_format,
        certain=True,
        text=clip(body, 0),
        complete=complete,
        exception_class=exception_class_before(text, start) or exception_class,
        backend=backend,
        **fields,  # type: ignore[arg-type]
    )


def _new_clauses(squeezed: str, tail: int, fields: dict[str, object]) -> bool:
    """Fill ``fields`` from the clauses of the 2.1+ message after its capacity; True when the
    message is complete (its last clause is there)."""
    free = _SQ_FREE_NEW.search(squeezed, tail)
    if free:
        fields["free"] = _sq_size(free)
    listed = list(_SQ_OTHER_PROCESS.finditer(squeezed, tail))[:64]
    others = tuple(ProcessMemory(int(m.group(1)), _sq_size(m, 2)) for m in listed)
    this_process = _SQ_THIS_PROCESS.search(squeezed, tail)
    if this_process:
        fields["process_in_use"] = _sq_size(this_process)
    allowed = _SQ_ALLOWED.search(squeezed, tail)
    if allowed:
        fields["allowed"] = _sq_size(allowed)
    allocated = _SQ_ALLOCATED_NEW.search(squeezed, tail)
    if allocated:
        fields["allocated_by_pytorch"] = _sq_size(allocated)
    pools = _SQ_PRIVATE_POOLS.search(squeezed, tail)
    if pools:
        fields["private_pools"] = _sq_size(pools)
    unallocated = _SQ_RESERVED_UNALLOCATED.search(squeezed, tail)
    if unallocated:
        fields["reserved_unallocated"] = _sq_size(unallocated)
    listed_self = None
    if this_process is None and len(others) == 1 and listed:
        listed_self = _listed_self(others[0], squeezed, listed[-1].end(), fields)
    if listed_self is not None:
        fields["process_in_use"] = listed_self.bytes
        fields["listed_self"] = listed_self
        others = ()
    fields["other_processes"] = others
    return unallocated is not None


def _listed_self(
    process: ProcessMemory, squeezed: str, list_end: int, fields: dict[str, object]
) -> ProcessMemory | None:
    """The one listed process when it is this process under another pid (see
    ``OomMessage.listed_self``), else None."""
    if _SQ_LIST_GOES_ON.match(squeezed, list_end) is None:
        return None  # cut right after the list: a "this process has" clause may have followed
    allocated = fields.get("allocated_by_pytorch")
    unallocated = fields.get("reserved_unallocated")
    if isinstance(allocated, int) and isinstance(unallocated, int):
        if allocated + unallocated > process.bytes + SELF_TOLERANCE:
            return None  # PyTorch alone holds more than that process: it is another one
    elif isinstance(allocated, int) and allocated > process.bytes + SELF_TOLERANCE:
        return None
    return process


def _parse_malloc_async(text: str, exception_class: str | None) -> OomMessage | None:
    if "Allocation" not in text:
        return None
    squeezed, kept = squeeze(text)
    start_match = _SQ_ASYNC_START.search(squeezed)
    if start_match is None:
        return None
    values: dict[str, int] = {}
    for field in _SQ_ASYNC_FIELD.finditer(squeezed, start_match.end()):
        values.setdefault(field.group("label"), _sq_size(field, 2))
    limit = values.get("PyTorchlimit(setbyuser-suppliedmemoryfraction)")
    start = kept[start_match.start()]
    return OomMessage(
        kind=OomKind.ALLOCATOR_ASYNC,
        message_format="malloc_async",
        certain=True,
        text=clip(text, start),
        complete=limit is not None,
        exception_class=exception_class_before(text, start) or exception_class,
        backend="CUDA",
        device=int(start_match.group("dev")),
        tried_to_allocate=values.get("Requested"),
        total_capacity=values.get("Devicelimit"),
        free=values.get("Free(accordingtoCUDA)"),
        allocated_by_pytorch=values.get("Currentlyallocated"),
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
        text=clip(text, start),
        complete=tried is not None,
        exception_class=exception_class_before(text, start) or exception_class,
        backend="MPS",
        tried_to_allocate=_size(tried.group(1), tried.group(2)) if tried else None,
        allocated_by_pytorch=values.get("MPS allocated"),
        other_allocations=values.get("other allocations"),
        allowed=values.get("max allowed"),
    )


_CUT_FORMS = tuple(f"{backend}outofmemory" for backend in ("CUDA", "HIP", "XPU", "NPU", "MPS"))
_CLASS_ONLY = lazy_regex(r"\s{0,8}(?P<cls>(?:torch\.)?(?:cuda\.)?OutOfMemoryError)\s{0,4}(?::|\Z)")


def _parse_class_only(text: str, exception_class: str | None) -> OomMessage | None:
    """torch's OOM exception named with its message lost: a traceback cut after IPython's
    header (``OutOfMemoryError   Traceback (most recent call last)``), or a message cut before
    any of its numbers (``torch.OutOfMemoryError: CUDA out of mem``)."""
    match = _CLASS_ONLY.match(text)
    if match is None:
        return None
    rest = squeeze(text[match.end() : match.end() + 200])[0].rstrip(".'\"")
    if rest and not any(form.startswith(rest) for form in _CUT_FORMS):
        return None  # the class named for another reason (a script printing it)
    return OomMessage(
        kind=OomKind.ALLOCATOR,
        message_format="class_only",
        certain=True,
        text=clip(text, 0).replace("\n", ""),
        complete=False,
        exception_class=match.group("cls"),
    )


def preamble(text: str, message: str, exception_class: str | None) -> str | None:
    """The words before ``message`` on the first line of ``text``, unless only its exception
    class (a warning or a log record that wraps the message; ``OomEvent.preamble``)."""
    first = text.split("\n", 1)[0]
    at = first.find(message[:24]) if message else -1
    if at <= 0:
        return None
    before = first[:at].strip()
    if exception_class and before.rstrip(": ") in (exception_class, ""):
        return None
    return before[-300:] or None


def wrapped_complete(text: str) -> bool:
    """True when ``text`` (the lines of an OOM message collected so far, wrapped by a terminal
    or a paste) holds a complete allocator message."""
    message = parse_oom_message(text)
    return message is not None and message.complete and message.kind is OomKind.ALLOCATOR


def complete_on_its_line(text: str) -> bool:
    """True for an allocator message that ended on this line (its last clause is there)."""
    if "Tried to allocate" not in text:
        return False
    if "more than 1EB memory" in text or "reserved in total by PyTorch" in text:
        return True
    return "is reserved by PyTorch but unallocated" in text
