"""Lines of what people paste and of the frameworks around training: decorations to remove,
exception lines without their traceback, signals a launcher or a shell names, the end of a
run, the platform, ``memory_summary()``'s table.

Pure functions of one line (launcher prefixes already stripped); the log reader calls them.
Every pattern is anchored or bounded: time is linear in the line's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlens.ingest.log.torchrun import signal_name
from oomlens.lazyregex import lazy_regex
from oomlens.units import parse_size

_QUOTE = lazy_regex(r"(?:> ?){1,8}(?!>)")
_FENCE = lazy_regex(r"\s{0,3}(?:`{3,}|~{3,})[\w+.-]{0,40}\s{0,8}\Z")
_HTML_WRAPPER = lazy_regex(
    r"\s{0,8}</?(?:details|summary)\b[^>]{0,200}>(?:[^<]{0,200}</summary>)?\s{0,8}\Z"
)


def unquote(text: str) -> str:
    """A pasted line without Markdown's decorations: ``> `` quote markers (not a REPL's
    ``>>>``), and code fences and ``<details>``/``<summary>`` wrappers (a blank line)."""
    if text[:1] == ">":
        match = _QUOTE.match(text)
        if match is not None and not text.startswith(">>>"):
            text = text[match.end() :]
    if ("`" in text or "~" in text) and _FENCE.match(text):
        return ""
    if "<" in text and _HTML_WRAPPER.match(text):
        return ""
    return text


_LOGGER_PREFIXES = (
    # docker compose: "vllm-1  | "
    lazy_regex(r"[\w.-]{1,60} {1,20}\| "),
    # vLLM's logger: "ERROR 11-18 18:07:28 engine.py:366] "
    lazy_regex(
        r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
        r"[\w./-]{1,100}:\d{1,6}\] ?"
    ),
    # journald / syslog: "Jun 10 16:45:05 host bash[107468]: " (also a CJK month, "6月 10")
    lazy_regex(
        r"(?:[A-Z][a-z]{2}|\d{1,2}月) {1,2}\d{1,2} \d\d:\d\d:\d\d [\w.-]{1,64} "
        r"[\w./@-]{1,64}(?:\[\d{1,10}\])?: "
    ),
)


def strip_logger(text: str) -> str:
    """A line without another framework's or a service manager's prefix (docker compose's
    service column, vLLM's logger, journald), which they put before every line of a traceback
    they relay."""
    for _ in range(3):
        for pattern in _LOGGER_PREFIXES:
            match = pattern.match(text)
            if match is not None:
                text = text[match.end() :]
                break
        else:
            return text
    return text


_STANDALONE = lazy_regex(
    r"(?P<cls>(?:[A-Za-z_][\w]{0,100}\.){0,8}[A-Za-z_]\w{0,100}?"
    r"(?:Error|Exception|Interrupt|Failure|Fault|Exit))(?::(?: (?P<msg>.{0,8000}))?)?\s{0,8}\Z"
)
_NOT_CLASSES = frozenset({"Error", "Exception", "Failure", "Fault", "Exit", "ERROR"})


_FAILED_LINE = lazy_regex(r"(?P<cls>Failed|FAILED|Fatal error|FATAL): \S")


def standalone_exception_class(text: str) -> str | None:
    """The exception class of a line that is an exception line on its own
    (``RuntimeError: ...``, ``pydantic_core._pydantic_core.ValidationError: 1 validation
    error ...``, at most two spaces in: a paste that lost its margin): a paste of only the end
    of a traceback.  A native library's ``Failed: <what>`` line counts, named as printed.
    Warnings are not exceptions."""
    if text[:2] == "  " and text[2:3] != " ":
        text = text[2:]
    elif text[:1] == " " and text[1:2] != " ":
        text = text[1:]
    failed = _FAILED_LINE.match(text)
    if failed is not None:
        return str(failed.group("cls"))
    first = text[:1]
    if not (first.isalpha() or first == "_"):
        return None
    match = _STANDALONE.match(text)
    if match is None:
        return None
    cls: str = match.group("cls")
    if cls in _NOT_CLASSES or cls.rsplit(".", 1)[-1] in _NOT_CLASSES:
        return None
    if match.group("msg") is None and ":" not in text:
        return None  # a bare name on a line is not enough
    return cls


_COMPLETION = (
    ("launcher_success", lazy_regex(r"Process \d{1,10} exits successfully")),
    ("agent_finished", lazy_regex(r"[Ww]orker group finished")),
    ("hf_train_runtime", lazy_regex(r"['\"]train_runtime['\"]: ?\d")),
    (
        "lightning_fit_stopped",
        lazy_regex(r"`Trainer\.fit` stopped: `(?:max_steps|max_epochs|max_time)"),
    ),
    (
        "script",
        lazy_regex(
            r"(?i:^\W{0,4}(?:training|train) (?:finished|completed?|done)\b|"
            r"\bfinished training\b|\btraining (?:is )?(?:finished|completed)\b)"
        ),
    ),
)


def parse_completion(text: str) -> str | None:
    """The kind of ``CompletionLine`` ``text`` is, or None."""
    for kind, pattern in _COMPLETION:
        if pattern.search(text[:2000]) is not None:
            return kind
    return None


_WSL = lazy_regex(r"microsoft-standard-WSL|\bWSL2?\b|/mnt/[c-h]/|/usr/lib/wsl/|\bwsl\b")
_CONTAINER = lazy_regex(
    r"\broot@[0-9a-f]{12}\b|^/workspace/|[\s\"'(]/workspace/|\bdocker\b|\bDocker\b|\bkubernetes\b"
)
_NOTEBOOK = lazy_regex(r"(?:^|[\s\"'(])/(?:content|kaggle)/|\bColab\b|/kaggle/")
_WINDOWS = lazy_regex(r"\b[A-Z]:\\\\?(?:Users|Program|Python|ProgramData|anaconda|Anaconda)")


def parse_platform(text: str) -> str | None:
    """The kind of ``PlatformHint`` ``text`` shows, or None."""
    head = text[:2000]
    if _WSL.search(head):
        return "wsl"
    if _NOTEBOOK.search(head):
        return "notebook"
    if _CONTAINER.search(head):
        return "container"
    if _WINDOWS.search(head):
        return "windows"
    return None


@dataclass(frozen=True, slots=True)
class SignalLine:
    exitcode: int | None
    signal: str | None
    pid: int | None = None


_SIGNALS = lazy_regex(r"<Signals\.(?P<name>SIG[A-Z0-9]{1,10}): (?P<num>\d{1,3})>")
_EXIT_STATUS = lazy_regex(
    r"(?:non-zero exit status|exit code|exitcode|exit status)\s{0,4}:?\s{0,4}(?P<code>-?\d{1,4})"
    r"(?:\s{0,4}\(pid: (?P<pid>\d{1,10})\))?"
)
_RECEIVED = lazy_regex(r"Signal (?P<num>\d{1,3}) \((?P<name>SIG[A-Z0-9]{1,10})\) received by PID")
_BY_SIGNAL = lazy_regex(
    r"(?:killed|terminated) by signal (?:(?P<name>SIG[A-Z0-9]{1,10})|(?P<num>\d{1,3}))"
)
_FATAL = lazy_regex(
    r"Fatal Python error: (?P<what>Bus error|Segmentation fault|Aborted)|"
    r"\[\d{1,4}\] {1,8}(?:\+ )?\d{1,10} (?P<job>killed|bus error|segmentation fault|abort) "
)
_JOB_SIGNAL = {
    "killed": "SIGKILL",
    "bus error": "SIGBUS",
    "segmentation fault": "SIGSEGV",
    "abort": "SIGABRT",
}
_FATAL_SIGNAL = {"Bus error": "SIGBUS", "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT"}
_SIGNAL_NUMBERS = {"SIGKILL": 9, "SIGBUS": 7, "SIGSEGV": 11, "SIGABRT": 6, "SIGTERM": 15}


def parse_signal_line(text: str) -> SignalLine | None:
    """A process' death by a signal (or a failed exit) as a launcher, a subprocess or a shell
    names it: ``died with <Signals.SIGKILL: 9>``, ``returned non-zero exit status -9``,
    ``exitcode  : -7 (pid: 123)``, ``Signal 9 (SIGKILL) received by PID 123``,
    ``Process finished with exit code 137 (interrupted by signal 9: SIGKILL)``,
    ``Fatal Python error: Bus error``.  None for a line that names none (or exit 0)."""
    head = text[:4000]
    match = _SIGNALS.search(head)
    if match is not None:
        return SignalLine(-int(match.group("num")), match.group("name"))
    match = _RECEIVED.search(head)
    if match is not None:
        return SignalLine(-int(match.group("num")), match.group("name"))
    match = _BY_SIGNAL.search(head)
    if match is not None:
        name = match.group("name") or signal_name(-int(match.group("num")))
        number = _SIGNAL_NUMBERS.get(name or "")
        return SignalLine(-number if number else None, name)
    match = _FATAL.search(head)
    if match is not None:
        # a shell's job notice (zsh: "[1]    26478 killed     python test.py") or Python's
        # fault handler
        name = (
            _JOB_SIGNAL[match.group("job")]
            if match.group("job")
            else _FATAL_SIGNAL[match.group("what")]
        )
        return SignalLine(-_SIGNAL_NUMBERS[name], name)
    match = _EXIT_STATUS.search(head)
    if match is not None:
        code = int(match.group("code"))
        if code == 0:
            return None
        pid = int(match.group("pid")) if match.group("pid") else None
        return SignalLine(code, signal_name(code), pid)
    return None


_SUMMARY_DEVICE = lazy_regex(r"memory summary, device ID (?P<dev>\d{1,4})")
_SUMMARY_OOMS = lazy_regex(
    r"(?:CUDA|XPU|HIP)? ?OOMs: ?(?P<ooms>\d{1,12})\s{0,40}\|?\s{0,40}"
    r"(?:cudaMalloc retries: ?(?P<retries>\d{1,12}))?"
)
_SUMMARY_ROW = lazy_regex(
    r"\|\s{0,8}(?P<name>Allocated memory|GPU reserved memory)\s{0,40}\|\s{0,20}"
    r"(?P<cur>\d{1,15}(?:\.\d{1,6})?\s?[KMGT]?i?B)\s{0,20}\|\s{0,20}"
    r"(?P<peak>\d{1,15}(?:\.\d{1,6})?\s?[KMGT]?i?B)"
)


def summary_device(text: str) -> int | None:
    match = _SUMMARY_DEVICE.search(text[:400])
    return int(match.group("dev")) if match is not None else None


def summary_ooms(text: str) -> tuple[int, int | None] | None:
    """``(CUDA OOMs, cudaMalloc retries)`` of ``memory_summary()``'s counter row."""
    if "OOMs" not in text:
        return None
    match = _SUMMARY_OOMS.search(text[:400])
    if match is None:
        return None
    retries = match.group("retries")
    return int(match.group("ooms")), int(retries) if retries else None


def summary_row(text: str) -> tuple[str, int, int] | None:
    """``(row, current bytes, peak bytes)`` of an ``Allocated memory`` or ``GPU reserved
    memory`` row (``memory_summary()`` prints MiB as ``MB`` in older builds: binary units)."""
    match = _SUMMARY_ROW.match(text[:400])
    if match is None:
        return None
    try:
        return match.group("name"), parse_size(match.group("cur")), parse_size(match.group("peak"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class GpuRow:
    device: int | None
    used: int
    total: int


@dataclass(frozen=True, slots=True)
class GpuProcessRow:
    device: int
    pid: int
    kind: str
    name: str
    used: int | None


_SMI_NAME_ROW = lazy_regex(r"\|\s{1,8}(?P<gpu>\d{1,3})\s{1,8}[A-Za-z][^|]{0,60}\|")
_SMI_GPU_ROW = lazy_regex(
    r"\|?\s{0,8}(?:N/A|\d{1,3}%)\s{1,8}-?\d{1,3}C\s{1,8}\S{1,8}\s{1,12}(?:\d{1,5}W|N/A)\s{0,4}/"
    r"\s{0,4}(?:\d{1,5}W|N/A)\s{1,8}\|\s{0,12}(?P<used>\d{1,9})MiB\s{0,4}/\s{0,4}"
    r"(?P<total>\d{1,9})MiB\s{0,4}\|"
)
_SMI_PROCESS_ROW = lazy_regex(
    r"\|\s{1,8}(?P<gpu>\d{1,3})\s{1,12}(?:(?:N/A|\d{1,6})\s{1,12}(?:N/A|\d{1,6})\s{1,12})?"
    r"(?P<pid>\d{1,10})\s{1,12}(?P<kind>C\+G|C|G)\s{1,12}(?P<name>\S[^|]{0,200}?)\s{1,40}"
    r"(?P<mem>\d{1,9}MiB|N/A)\s{0,4}\|"
)
_FREE_OF = lazy_regex(
    r"(?P<free>\d{1,9}(?:\.\d{1,4})?) ?(?P<fu>MiB|GiB|MB|GB) free of (?P<total>\d{1,9}"
    r"(?:\.\d{1,4})?) ?(?P<tu>MiB|GiB|MB|GB)"
)


def smi_device(text: str) -> int | None:
    """The GPU index of an ``nvidia-smi`` name row (``|   0  NVIDIA H200   On  | ...``)."""
    match = _SMI_NAME_ROW.match(text[:300])
    return int(match.group("gpu")) if match is not None else None


def parse_gpu_row(text: str, device: int | None) -> GpuRow | None:
    """An ``nvidia-smi`` usage row (``| N/A 34C P0 60W / 300W | 78000MiB / 81920MiB |``) or a
    script's ``1998 MiB free of 143156 MiB``: what the whole card had in use, by everyone."""
    head = text[:400]
    match = _SMI_GPU_ROW.match(head)
    if match is not None:
        mib = 2**20
        return GpuRow(device, int(match.group("used")) * mib, int(match.group("total")) * mib)
    match = _FREE_OF.search(head)
    if match is not None:
        free = parse_size(f"{match.group('free')} {match.group('fu')}")
        total = parse_size(f"{match.group('total')} {match.group('tu')}")
        if 0 <= free <= total:
            return GpuRow(device, total - free, total)
    return None


def parse_gpu_process(text: str) -> GpuProcessRow | None:
    """A row of ``nvidia-smi``'s process table
    (``|  0  N/A  N/A  12345  C  python  78000MiB |``)."""
    match = _SMI_PROCESS_ROW.match(text[:400])
    if match is None:
        return None
    memory = match.group("mem")
    return GpuProcessRow(
        int(match.group("gpu")),
        int(match.group("pid")),
        match.group("kind"),
        match.group("name").strip()[:200],
        int(memory[:-3]) * 2**20 if memory != "N/A" else None,
    )
