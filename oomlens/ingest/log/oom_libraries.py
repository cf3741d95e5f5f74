"""OOM messages of the libraries and runtimes around the caching allocator, parsed into
``OomMessage``: the NVML internal assert that replaces a lost OOM, the host allocator,
cuBLAS/cuDNN/cuSOLVER status errors, NCCL, the CUDA/HIP driver and runtime, THC's
``cuda runtime error (2)``, a library's own CUDA check (CTranslate2), and other frameworks'
GPU allocators in the same job (XLA/JAX, TensorFlow, MXNet).

Each ``parse_*`` takes the text of one message and the exception class named elsewhere (or
None) and returns the message or None; ``torch_oom.parse_oom_message`` tries them in its
order.  All patterns are linear, as in ``torch_oom``.
"""

from __future__ import annotations

from oomlens.facts.log import OomKind, OomMessage
from oomlens.ingest.log.oom_text import (
    MAX_MESSAGE_CHARS,
    clip,
    exception_class_before,
    message_line_start,
    squeeze,
)
from oomlens.lazyregex import lazy_regex
from oomlens.units import parse_size

_NVML_ASSERT = lazy_regex(
    r"NVML_SUCCESS == [^\n]{0,300}?INTERNAL ASSERT FAILED at [^\n]{0,200}?CUDACachingAllocator"
)
_HOST = lazy_regex(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
    r"(\d{1,24}) bytes"
)
# What a host allocation failure raises outside torch's allocator, as the exception line
# prints it: Python's MemoryError (also pybind11's translation of std::bad_alloc), numpy's
# _ArrayMemoryError ("Unable to allocate {size} for an array with shape {shape} and data type
# {dtype}", numpy/core/_exceptions.py), C++'s uncaught std::bad_alloc (what the runtime's
# terminate handler prints), and ENOMEM from a system call (fork, mmap: errno 12).
_HOST_RAISED = lazy_regex(
    r"(?m:^[ \t]{0,16}(?:[\w.]{0,120}\.)?(?:_ArrayMemoryError|MemoryError)"
    r"(?::[ \t]?(?P<said>[^\n]{1,400}))?[ \t]*$"
    r"|instance of 'std::bad_alloc'|^[ \t]{0,16}what\(\):[ \t]{1,4}std::bad_alloc"
    r"|^[ \t]{0,16}(?:[\w.]{0,120}\.)?(?:OSError|RuntimeError|BlockingIOError):[ \t]"
    r"(?P<errno>\[Errno 12\] Cannot allocate memory))"
)
_ARRAY_SIZE = lazy_regex(
    r"Unable to allocate (\d{1,24}(?:\.\d{0,6})?) ?([KMGTPE]iB|bytes) for an array"
)
_CUBLAS = lazy_regex(r"CUBLAS_STATUS_(ALLOC_FAILED|NOT_INITIALIZED)")
_CUDNN = lazy_regex(
    r"CUDNN_STATUS_(ALLOC_FAILED|NOT_INITIALIZED|INTERNAL_ERROR)|Unable to find a valid cuDNN alg"
    r"orithm"
)
_CUSOLVER = lazy_regex(r"(?i:cusolver_status_alloc_failed)")
_NCCL_CALLOC = lazy_regex(r"Failed to CUDA calloc (?:async )?(\d{1,24}) bytes")
_NCCL_CUDA_FAILURE = lazy_regex(r"Cuda failure (?:\d{1,4} )?'out of memory'")
_NCCL_ERROR = lazy_regex(r"NCCL error|ncclUnhandledCudaError|NCCL WARN")
_DRIVER = lazy_regex(
    r"(?P<backend>CUDA|HIP|cuda) (?:driver )?error: out of memory|hipErrorOutOfMemory|"
    r"CUDA_ERROR_OUT_OF_MEMORY|HSA_STATUS_ERROR_OUT_OF_RESOURCES|"
    # a runtime call's own report: ":0: cudaFuncSetAttribute(kernel_entry, ...): out of memory"
    r"\bcuda[A-Z][A-Za-z]{2,40}\([^\n]{0,600}\): out of memory"
)
_LIBRARY_CUDA_CHECK = lazy_regex(r"\bCUDA failed with error out of memory")
"""A library's own CUDA_CHECK macro around the runtime's ``cudaGetErrorString``, which is "out of
memory" for ``cudaErrorMemoryAllocation``: CTranslate2 (``src/cuda/utils.h``: "CUDA failed with
error " + the string), the engine under faster-whisper and WhisperX.  The library allocates
through the runtime (``cudaMalloc``, cub's caching allocator), so this is its allocation failing,
not a context or a kernel's module as torch's ``CUDA error: out of memory`` most often is."""
_THC = lazy_regex(r"cuda runtime err(?:or)? ?\(2\) ?: ?out of memory|error=2 : out of memory")
_SQ_XLA = lazy_regex(
    r"(?i:resource_?exhausted):?Outofmemorywhiletryingtoallocate(?P<n>\d{1,24})bytes"
)
_SQ_TF = lazy_regex(r"OOMwhenallocatingtensor(?:withshape\[[^\]]{0,400}\])?")
_SQ_MXNET = lazy_regex(r"cudaMalloc(?:retry)?failed:outofmem")


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
        text=clip(text, message_line_start(text, start)),
        complete=True,
        exception_class=exception_class_before(text, message_line_start(text, start))
        or exception_class_before(text, start)
        or exception_class,
        backend=backend,
        tried_to_allocate=tried,
    )


def parse_nvml_assert(text: str, exception_class: str | None) -> OomMessage | None:
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


def parse_host(text: str, exception_class: str | None) -> OomMessage | None:
    match = _HOST.search(text)
    if match is not None:
        return _simple(
            OomKind.HOST,
            "host",
            text,
            match.start(),
            exception_class,
            backend="CPU",
            tried=int(match.group(1)),
        )
    raised = _HOST_RAISED.search(text)
    if raised is None:
        return None
    size = _ARRAY_SIZE.search(text, raised.start())
    tried = None
    if size is not None:
        number = size.group(1).rstrip(".") or "0"
        tried = parse_size(f"{number} {size.group(2)}")
    said = raised.start("said") if raised.group("said") else raised.start("errno")
    return _simple(
        OomKind.HOST,
        "host_raised",
        text,
        said if said >= 0 else raised.start(),
        exception_class,
        backend="CPU",
        tried=tried,
    )


def parse_cublas(text: str, exception_class: str | None) -> OomMessage | None:
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


def parse_cudnn(text: str, exception_class: str | None) -> OomMessage | None:
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


def parse_cusolver(text: str, exception_class: str | None) -> OomMessage | None:
    match = _CUSOLVER.search(text)
    if match is None:
        return None
    return _simple(OomKind.CUSOLVER, "cusolver", text, match.start(), exception_class)


def parse_nccl(text: str, exception_class: str | None) -> OomMessage | None:
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


def parse_driver(text: str, exception_class: str | None) -> OomMessage | None:
    match = _DRIVER.search(text)
    if match is None:
        return None
    backend = (
        "HIP"
        if "HIP" in match.group(0) or "hip" in match.group(0) or "HSA" in match.group(0)
        else "CUDA"
    )
    return _simple(OomKind.DRIVER, "driver", text, match.start(), exception_class, backend=backend)


def parse_library_cuda_check(text: str, exception_class: str | None) -> OomMessage | None:
    match = _LIBRARY_CUDA_CHECK.search(text)
    if match is None:
        return None
    return _simple(OomKind.DRIVER, "library_cuda_check", text, match.start(), exception_class)


def parse_thc(text: str, exception_class: str | None) -> OomMessage | None:
    match = _THC.search(text)
    if match is None:
        return None
    return _simple(OomKind.DRIVER, "thc", text, match.start(), exception_class)


def parse_framework(text: str, exception_class: str | None) -> OomMessage | None:
    """Another framework's GPU allocator in the same job: XLA/JAX, TensorFlow, MXNet."""
    squeezed, kept = squeeze(text[: MAX_MESSAGE_CHARS * 2])
    for message_format, pattern in (("xla", _SQ_XLA), ("tensorflow", _SQ_TF), ("mxnet", _SQ_MXNET)):
        match = pattern.search(squeezed)
        if match is None:
            continue
        tried = match.groupdict().get("n")
        start = message_line_start(text, kept[match.start()])
        return OomMessage(
            kind=OomKind.FRAMEWORK,
            message_format=message_format,
            certain=True,
            text=clip(text, start).replace("\n", ""),
            complete=message_format != "mxnet"
            or "memory" in squeezed[match.end() : match.end() + 8],
            exception_class=exception_class_before(text, start) or exception_class,
            backend=message_format.upper() if message_format == "xla" else None,
            tried_to_allocate=int(tried) if tried else None,
        )
    return None
