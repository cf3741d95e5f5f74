"""OOM messages of every generation, parsed to exact bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomlens.facts.log import OomKind
from oomlens.ingest.log.torch_oom import ANCHORS, looks_like_oom, parse_oom_message

ASSETS = Path(__file__).parents[2] / "assets" / "logs"
GiB, MiB = 1024**3, 1024**2


def _lab_line(startswith: str) -> str:
    for line in (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines():
        if line.startswith(startswith):
            return line
    raise AssertionError(startswith)


REFERENCE = (ASSETS / "reference_messages.txt").read_text().splitlines()


def test_lab_fragmentation_message_every_number_in_bytes() -> None:
    line = next(
        ln
        for ln in (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines()
        if ln.startswith("torch.OutOfMemoryError") and "1.50 GiB" in ln and "allowed" not in ln
    )
    msg = parse_oom_message(line)
    assert msg is not None
    assert (msg.kind, msg.message_format, msg.exception_class, msg.device) == (
        OomKind.ALLOCATOR,
        "capacity",
        "torch.OutOfMemoryError",
        0,
    )
    assert msg.tried_to_allocate == round(1.50 * GiB)
    assert msg.total_capacity == round(139.80 * GiB)
    assert msg.free == round(1.29 * GiB)
    assert msg.process_in_use == round(138.51 * GiB)
    assert msg.allocated_by_pytorch == 70 * GiB
    assert msg.reserved_unallocated == 68 * GiB
    assert msg.allowed is None and msg.other_processes == () and msg.complete


def test_lab_fraction_private_pool_and_other_process_clauses() -> None:
    lines = (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines()
    allowed = parse_oom_message(
        next(ln for ln in lines if "allowed;" in ln and ln.startswith("torch."))
    )
    assert allowed is not None and allowed.allowed == round(13.98 * GiB)
    pools = parse_oom_message(next(ln for ln in lines if "private pools" in ln))
    assert (
        pools is not None
        and pools.private_pools == 576 * MiB
        and pools.reserved_unallocated == 2 * MiB
    )
    other = parse_oom_message(next(ln for ln in lines if "Process 2949 has" in ln))
    assert other is not None
    assert [(p.pid, p.bytes) for p in other.other_processes] == [(2949, round(135.51 * GiB))]
    assert other.other_processes_total == round(135.51 * GiB)
    assert other.process_in_use == round(1.51 * GiB)


def test_lab_exabyte_malloc_async_and_driver_forms() -> None:
    text = (ASSETS / "lab_log_torch2.11_h200.txt").read_text()
    eb = parse_oom_message(
        _lab_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more")
    )
    assert eb is not None and eb.message_format == "exabyte" and eb.tried_to_allocate == 2**60
    start = text.index("torch.OutOfMemoryError: Allocation on device 0")
    block = "\n".join(text[start:].splitlines()[:7])
    asynchronous = parse_oom_message(block)
    assert asynchronous is not None and asynchronous.kind is OomKind.ALLOCATOR_ASYNC
    assert asynchronous.tried_to_allocate == 1024 * GiB
    assert asynchronous.allocated_by_pytorch == 1024 * MiB
    assert asynchronous.total_capacity == round(139.80 * GiB)
    assert asynchronous.free == round(138.22 * GiB)
    assert asynchronous.allowed is None  # SIZE_MAX: no fraction set
    assert asynchronous.complete
    driver = parse_oom_message(_lab_line("torch.AcceleratorError: CUDA error: out of memory"))
    assert driver is not None and driver.kind is OomKind.DRIVER
    assert driver.exception_class == "torch.AcceleratorError"


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (
            0,
            {
                "kind": OomKind.ALLOCATOR,
                "message_format": "reserved",
                "exception_class": "RuntimeError",
                "device": 1,
                "tried_to_allocate": 274 * MiB,
                "total_capacity": round(23.70 * GiB),
                "allocated_by_pytorch": round(21.95 * GiB),
                "free": round(25.69 * MiB),
                "reserved_total": round(22.28 * GiB),
                "reserved_unallocated": round(22.28 * GiB) - round(21.95 * GiB),
            },
        ),
        (
            1,
            {
                "message_format": "reserved",
                "exception_class": "torch.cuda.OutOfMemoryError",
                "device": 0,
                "tried_to_allocate": 978 * MiB,
                "free": 0,
                "reserved_total": round(2.72 * GiB),
            },
        ),
        (
            2,
            {
                "message_format": "capacty",
                "device": 1,
                "tried_to_allocate": round(25.10 * GiB),
                "process_in_use": round(25.81 * GiB),
                "reserved_unallocated": round(12.97 * MiB),
            },
        ),
        (
            3,
            {
                "backend": "HIP",
                "allowed": round(1.05 * GiB),
                "private_pools": 17 * MiB,
                "allocated_by_pytorch": round(1017.01 * MiB),
                "reserved_unallocated": round(54.99 * MiB),
            },
        ),
        (
            4,
            {
                "message_format": "truncated",
                "device": 0,
                "tried_to_allocate": 312 * MiB,
                "complete": False,
            },
        ),
        (
            5,
            {
                "kind": OomKind.PROBABLE_OOM_ASSERT,
                "certain": False,
                "exception_class": "RuntimeError",
            },
        ),
        (6, {"kind": OomKind.CUBLAS, "certain": True}),
        (7, {"kind": OomKind.HOST, "tried_to_allocate": 1125899906842624}),
        (8, {"kind": OomKind.NCCL, "message_format": "nccl_warn", "tried_to_allocate": 536870912}),
        (9, {"kind": OomKind.NCCL, "tried_to_allocate": 268435456}),
    ],
)
def test_reference_messages_of_older_generations(index: int, expected: dict[str, object]) -> None:
    msg = parse_oom_message(REFERENCE[index])
    assert msg is not None
    for name, value in expected.items():
        assert getattr(msg, name) == value, name


def test_nccl_multi_line_error_is_an_nccl_oom() -> None:
    # the C10D_NCCL_CHECK template of the reference notes (section 1.9), filled by code
    text = "\n".join(
        [
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhand"
            "led cuda error "
            "(run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 'out of memory'",
        ]
    )
    msg = parse_oom_message(text)
    assert msg is not None and msg.kind is OomKind.NCCL
    assert msg.exception_class == "torch.distributed.DistBackendError"


def test_hard_wrapped_message_is_read_unwrapped() -> None:
    line = _lab_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB")
    cut = line.index("0 bytes is reserved") + 3
    msg = parse_oom_message(line[:cut] + "\n" + line[cut:])
    assert msg is not None and msg.reserved_unallocated == 0 and msg.complete


def test_triton_out_of_resources_is_not_an_oom() -> None:
    text = (
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, "
        "Required: 262144, Hardware limit: 232448"
    )
    assert parse_oom_message(text) is None


def test_every_truncation_of_a_real_message_parses_without_error() -> None:
    line = _lab_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB")
    previous_fields = 0
    for cut in range(len(line) + 1):
        msg = parse_oom_message(line[:cut])
        if msg is None:
            assert cut < line.index("Tried to allocate") + len("Tried to allocate ")
            continue
        fields = sum(
            getattr(msg, n) is not None
            for n in (
                "tried_to_allocate",
                "total_capacity",
                "free",
                "process_in_use",
                "allocated_by_pytorch",
                "reserved_unallocated",
            )
        )
        # a longer prefix never knows less (a size counts once its unit is printed)
        assert fields >= previous_fields
        previous_fields = fields
    assert previous_fields == 6


def test_anchors_cover_every_parsed_first_line() -> None:
    for line in REFERENCE:
        assert looks_like_oom(line)
        assert any(anchor.decode() in line for anchor in ANCHORS)


def _format_size(size: int) -> str:
    # c10's format_size (reference notes 1.2), ported
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


def test_xpu_npu_and_mps_messages_built_from_their_source_templates() -> None:
    a, t, f, u, r = 512 * MiB, 64 * GiB, 100 * MiB, 60 * GiB, 2 * GiB
    fs = _format_size
    xpu = " ".join(
        [
            f"torch.OutOfMemoryError: XPU out of memory. Tried to allocate {fs(a)}.",
            f"GPU 1 has a total capacity of {fs(t)} of which {fs(f)} is free.",
            f"Of the allocated memory {fs(u)} is allocated by PyTorch,",
            f"and {fs(r)} is reserved by PyTorch but unallocated.",
            "Please use `empty_cache` to release all unoccupied cached memory.",
        ]
    )
    msg = parse_oom_message(xpu)
    assert msg is not None
    assert (msg.backend, msg.device, msg.tried_to_allocate, msg.reserved_unallocated) == (
        "XPU",
        1,
        a,
        r,
    )
    npu = " ".join(
        [
            f"RuntimeError: NPU out of memory. Tried to allocate {fs(a)}",
            f"(NPU 3; {fs(t)} total capacity; {fs(u)} already allocated; {fs(u)} current active;",
            f"{fs(f)} free; {fs(u + r)} reserved in total by PyTorch)",
        ]
    )
    msg = parse_oom_message(npu)
    assert msg is not None and (msg.backend, msg.device, msg.reserved_unallocated) == ("NPU", 3, r)
    mps = " ".join(
        [
            f"RuntimeError: MPS backend out of memory (MPS allocated: {fs(u)},",
            f"other allocations: {fs(f)}, max allowed: {fs(t)}).",
            f"Tried to allocate {fs(a)} on private pool.",
            "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit",
            "for memory allocations (may cause system failure).",
        ]
    )
    msg = parse_oom_message(mps)
    assert msg is not None and msg.kind is OomKind.MPS
    assert (
        msg.allocated_by_pytorch,
        msg.other_allocations,
        msg.allowed,
        msg.tried_to_allocate,
    ) == (
        u,
        f,
        t,
        a,
    )


def _matches_searching_everywhere(squeezed: str) -> list[int]:
    """The allocator message starts in squeezed text as found before the search skipped to
    the patterns' literals: the reference the skipping must agree with."""
    from oomlens.ingest.log import torch_oom as t

    found: list[int] = []
    position = 0
    while len(found) < 1000:
        match = t._SQ_MESSAGE_START.search(squeezed, position)
        if match is None:
            break
        found.append(match.start())
        after = t._SQ_NEXT_MESSAGE.search(squeezed, match.end())
        if after is None:
            break
        position = after.start()
    return found


def _message_starts_searching_everywhere(text: str) -> list[int]:
    from oomlens.ingest.log import oom_text
    from oomlens.ingest.log import torch_oom as t

    squeezed, kept = oom_text.squeeze(text)
    found: list[int] = []
    for start in _matches_searching_everywhere(squeezed):
        cls = t._SQ_CLASS_BEFORE.search(squeezed, max(0, start - 160), start)
        begin = kept[cls.start() if cls is not None else start]
        if cls is not None and "\n" in text[begin : kept[start]]:
            begin = oom_text.wrapped_start(text, begin, kept[start])
        found.append(begin)
    found += [kept[m.start()] for m in t._SQ_ASYNC_START.finditer(squeezed)][:100]
    return sorted(found)


_PIECES = [
    *(ln[:80] for ln in REFERENCE[:12]),
    "torch.OutOfMemoryError: ",
    "CUDA out of memory. ",
    "HIP out of memory.",
    "out of memory",
    "Tried to allocate 2.00 GiB",
    "(GPU 0; 79.19 GiB total capacity; ",
    "GPU 3 has a total capacity of 139.81 GiB",
    "123456789012345678901234.123456 bytes total capacity;",
    "18.00 MiB already allocated;",
    "7 GiB reserved in total by PyTorch;",
    "Allocation on device 0 would exceed allowed memory.",
    "RuntimeError: ",
    "9" * 30,
    ".",
    " ",
    "\n",
    "memory.",
    "ROCm",
    "X",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40), st.integers(0, 60))
def test_message_starts_finds_what_a_search_from_every_character_finds(
    pieces: list[str], cut: int
) -> None:
    text = "".join(pieces)[cut:]
    from oomlens.ingest.log.oom_text import squeeze
    from oomlens.ingest.log.torch_oom import allocator_starts, message_starts

    assert message_starts(text) == _message_starts_searching_everywhere(text)
    squeezed, kept = squeeze(text)
    everywhere = [kept[start] for start in _matches_searching_everywhere(squeezed)]
    assert allocator_starts(text) == everywhere
    assert allocator_starts(text, 2) == everywhere[:2]


def test_message_starts_searches_from_the_literals_not_every_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # fuzz campaign J: a 5.8 KB bzip2 log inflating to 100 MB of digit lines spent 7 of its
    # 12-18 CPU seconds in message_starts (16 MiB of it are read as a paste): the pattern was
    # searched from every character, ~0.4 s a MiB
    from oomlens.ingest.log import oom_text, torch_oom

    searched_from: list[int] = []
    pattern = torch_oom._SQ_MESSAGE_START

    class Watched:
        def search(self, text: str, position: int = 0):  # type: ignore[no-untyped-def]
            searched_from.append(position)
            return pattern.search(text, position)

    monkeypatch.setattr(torch_oom, "_SQ_MESSAGE_START", Watched())
    flood = ("[" + "9" * 5234 + "\n") * 200
    assert torch_oom.message_starts(flood) == [] and searched_from == []
    message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert torch_oom.message_starts(flood + message) == [len(flood)]
    squeezed_flood = len(oom_text.squeezed_text(flood))
    assert searched_from and min(searched_from) >= squeezed_flood - torch_oom._START_REACH


# The engine under faster-whisper and WhisperX (CTranslate2, src/cuda/utils.h) checks every CUDA
# call with its own macro: "CUDA failed with error " + cudaGetErrorString(code).  The line as posted
# in github.com/chidiwilliams/buzz/issues/439 (loading the model) and
# github.com/SYSTRAN/faster-whisper/issues/442 (generating).
def test_a_library_cuda_check_reporting_out_of_memory_is_an_oom() -> None:
    msg = parse_oom_message("RuntimeError: CUDA failed with error out of memory")
    assert msg is not None
    assert (msg.kind, msg.message_format, msg.exception_class) == (
        OomKind.DRIVER,
        "library_cuda_check",
        "RuntimeError",
    )
    assert msg.text == "CUDA failed with error out of memory"


def test_a_library_cuda_check_reporting_another_error_is_no_oom() -> None:
    # the same macro, another runtime error (a driver older than the runtime)
    text = (
        "RuntimeError: CUDA failed with error CUDA driver version is insufficient for CUDA "
        "runtime version"
    )
    assert parse_oom_message(text) is None
