"""Read a capture directory (``python -m oomlens.capture``) into ``RankCapture`` facts.

A capture file is recognised by its first line, ``{"oomlens_capture": 1, "file": "events" |
"series", ...}`` (``is_capture_head``); the files of one process share a name prefix
(``rank<R>[-restart<N>][-pid<P>]``, ``oomlens.ingest.layout.capture_process``).
``read_capture_file(path)`` reads one (the ``capture`` input kind's reader) and
``read_captures(files)`` reads several and joins each ``events`` file with its ``series`` file
(``oomlens.facts.capture.join_captures``), streaming and bounded: lines longer than
``MAX_LINE_BYTES`` and records beyond ``MAX_EVENTS`` are skipped and counted, series keep a
thinned set of samples with running statistics over all of them.  Hostile content never
raises: a value of the wrong type is ignored, a file that cannot be read becomes an
``InputError``.  The snapshot and the kernel log a capture writes are ordinary inputs
(``snapshot_pickle``, ``kernel_log``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oomlens.errors import InputError
from oomlens.facts import SourceRef
from oomlens.facts.capture import (
    CapturedOom,
    CaptureEnd,
    CaptureSeries,
    HostSample,
    HostSeries,
    NvmlProcess,
    PolicyChange,
    RankCapture,
    RankGone,
    join_captures,
)
from oomlens.facts.config import DumpedConfig
from oomlens.facts.log import (
    ExceptionEvent,
    Frame,
    LabelStats,
    MemorySample,
    MemorySeries,
    OomEvent,
    Traceback,
)
from oomlens.ingest._jsonpos import loads_bounded
from oomlens.ingest.ds_config import parse_config_dump
from oomlens.ingest.kinds.capture import HEADER_KEY
from oomlens.ingest.layout import capture_process
from oomlens.ingest.log import torchrun
from oomlens.ingest.log.series import RunningStats, Thinned
from oomlens.ingest.log.torch_oom import parse_oom_message
from oomlens.ingest.log.traceback import classify_phase

SUPPORTED_VERSIONS = frozenset({1})
MAX_LINE_BYTES = 1024 * 1024
MAX_FILE_BYTES = 256 * 1024 * 1024
"""Read no further into one capture file (the capture writes a few MB per rank by default)."""
MAX_EVENTS = 10_000
MAX_SERIES_LINES = 5_000_000
MAX_LABELS = 8
MAX_PROBLEMS = 20
MAX_TEXT = 8000


@dataclass(frozen=True, slots=True)
class CaptureFile:
    path: str
    kind: str
    """``events`` or ``series``."""
    header: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CaptureRead:
    ranks: tuple[RankCapture, ...]
    files: tuple[tuple[str, str, int | None], ...]
    """``(path, detail, rank)`` of every capture file read."""
    problems: tuple[InputError, ...]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None


def _str(value: Any, limit: int = 500) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _time(value: Any) -> datetime | None:
    number = _num(value)
    if number is None or not 0 < number < 2**33:
        return None
    try:
        return datetime.fromtimestamp(number)
    except (OverflowError, OSError, ValueError):
        return None


def _lines(
    path: str, limit: int, max_bytes: int = MAX_FILE_BYTES
) -> Iterator[tuple[int, dict[str, Any] | None, bool]]:
    """``(line number, record or None, cut)`` for each line; ``cut`` marks a last line without
    its newline (a writer killed mid-line).  Stops after ``limit`` lines or ``max_bytes``."""
    read = 0
    with open(path, "rb") as handle:
        for number in range(1, limit + 1):
            if read > max_bytes:
                return
            raw = handle.readline(MAX_LINE_BYTES + 1)
            read += len(raw)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                while raw and not raw.endswith(b"\n") and read <= max_bytes:
                    raw = handle.readline(MAX_LINE_BYTES + 1)
                    read += len(raw)
                yield number, None, False
                continue
            cut = not raw.endswith(b"\n")
            try:
                # Bounded: json.loads raises RecursionError past ~1,000 levels, which would end
                # the whole file's reading; a line nested that deep is one bad line.
                record = loads_bounded(raw.decode("utf-8"))
            except ValueError:
                yield number, None, cut
                continue
            yield number, record if isinstance(record, dict) else None, cut


def read_header(path: str, *, strict: bool = False) -> dict[str, Any] | None:
    """The header record of a capture file, None when it has none (or, unless ``strict``,
    cannot be read; ``strict`` lets the ``OSError`` through)."""
    try:
        for _, record, _ in _lines(path, 1):
            if record is not None and _int(record.get(HEADER_KEY)) in SUPPORTED_VERSIONS:
                return record
    except OSError:
        if strict:
            raise
        return None
    return None


def read_capture_file(path: str, display: str | None = None) -> RankCapture | CaptureSeries:
    """Read one capture file: an events file gives its process' ``RankCapture`` (without the
    series), a series file its ``CaptureSeries`` (``join_captures`` puts them together).
    Raises ``InputError`` for a file that cannot be read or is of an unknown version or kind."""
    shown = display or path
    try:
        header = read_header(path, strict=True)
    except OSError as exc:
        raise InputError(shown, f"cannot be read ({exc.strerror or exc})") from None
    if header is None:
        raise InputError(
            shown,
            "is a capture file of an unknown format version",
            "read it with the oomlens version that wrote it",
        )
    kind = header.get("file")
    process = capture_process(path) or path
    try:
        if kind == "events":
            return _read_rank(CaptureFile(path, "events", header), None, process)
        if kind == "series":
            alone = _read_rank(None, CaptureFile(path, "series", header), process)
            return CaptureSeries(
                path=path,
                process=process,
                memory=alone.memory,
                host_memory=alone.host_memory,
                last_record=alone.last_record,
                problems=alone.problems,
                alone=alone,
            )
    except OSError as exc:
        raise InputError(shown, f"cannot be read ({exc.strerror or exc})") from None
    raise InputError(shown, f"is a capture file of unknown kind {str(kind)[:40]!r}")


def describe(part: RankCapture | CaptureSeries) -> tuple[str, int | None]:
    """How a capture file read is listed among the inputs: its detail and rank."""
    if isinstance(part, CaptureSeries):
        samples = part.memory.total_samples if part.memory else 0
        hosts = part.host_memory.total_samples if part.host_memory else 0
        return f"capture series: {samples} GPU, {hosts} host samples", part.alone.rank
    who = f"rank {part.rank}" if part.rank is not None else "a process"
    return f"capture of {who}, ended: {part.end.value}", part.rank


def read_captures(files: Iterable[tuple[str, str | None]]) -> CaptureRead:
    """Read capture files given as ``(path, shown path)`` and join each process' files; see
    the module docstring."""
    parts: list[RankCapture | CaptureSeries] = []
    read: list[tuple[str, str, int | None]] = []
    problems: list[InputError] = []
    for path, shown in files:
        try:
            part = read_capture_file(path, shown)
        except InputError as exc:
            problems.append(exc)
            continue
        parts.append(part)
        detail, rank = describe(part)
        read.append((path, detail, rank))
    return CaptureRead(join_captures(parts), tuple(read), tuple(problems))


# -- events ---------------------------------------------------------------------------------


class _Events:
    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self.rank = _int(header.get("rank"))
        self.host = _str(header.get("host"), 255)
        self.problems: list[str] = []
        self.cut = False
        self.unreadable = 0

    def ref(self, line: int) -> SourceRef:
        return SourceRef(self.path, line, self.rank, self.host)

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        out: list[tuple[int, dict[str, Any]]] = []
        for number, record, cut in _lines(self.path, MAX_EVENTS + 1):
            if number == 1:
                continue
            if record is None:
                if cut:
                    self.cut = True
                else:
                    self.unreadable += 1
                continue
            out.append((number, record))
        return out


def _read_rank(
    event_file: CaptureFile | None, series_file: CaptureFile | None, process: str
) -> RankCapture:
    base = event_file or series_file
    assert base is not None
    ev = _Events(base.path, base.header)
    records = ev.records() if event_file is not None else []
    for _, record in records:
        if record.get("kind") == "distributed" and _int(record.get("rank")) is not None:
            ev.rank = _int(record.get("rank"))
    world = _int(base.header.get("world_size"))
    world_origin = "the launcher's WORLD_SIZE" if world is not None else None
    versions: dict[str, str] = {}
    environment: list[tuple[str, str]] = []
    notes: list[str] = []
    policies: list[PolicyChange] = []
    ooms: list[CapturedOom] = []
    oom_events: list[OomEvent] = []
    exceptions: list[ExceptionEvent] = []
    started = ended = last = None
    exit_code: int | None = None
    exited = excepted = False
    gone: RankGone | None = None
    ds_config: DumpedConfig | None = None
    params: int | None = None
    params_origin: str | None = None
    cgroup_limit = node_memory = None
    gpu_total = gpu_allowed = None
    last_step: int | None = None
    oom_count = 0
    for number, record in records:
        kind = record.get("kind")
        when = _time(record.get("t"))
        last = when or last
        ref = ev.ref(number)
        step = _int(record.get("step"))
        if step is not None:
            last_step = max(last_step or 0, step)
        if kind == "start":
            started = when
            for key in ("python", "platform"):
                if _str(record.get(key)):
                    versions[key] = _str(record.get(key)) or ""
            env = record.get("environment")
            if isinstance(env, dict):
                environment = [
                    (str(k)[:100], v[:500])
                    for k, v in list(env.items())[:100]
                    if isinstance(v, str)
                ]
            cgroup = record.get("cgroup")
            if isinstance(cgroup, dict):
                cgroup_limit = _int(cgroup.get("max"))
            node = record.get("node")
            if isinstance(node, dict):
                node_memory = _int(node.get("mem_total"))
        elif kind == "torch":
            for key, name in (("version", "torch"), ("cuda", "cuda")):
                if _str(record.get(key)) and record.get(key) != "None":
                    versions[name] = _str(record.get(key)) or ""
        elif kind == "distributed":
            if _int(record.get("world_size")) is not None:
                world = _int(record.get("world_size"))
                world_origin = "torch.distributed"
        elif kind == "policy":
            policies.append(
                PolicyChange(
                    ref,
                    when,
                    record.get("stacks") is not None,
                    _str(record.get("reason")) or "",
                    step,
                )
            )
        elif kind == "note":
            text = _str(record.get("text"), 300)
            if text:
                notes.append(text)
        elif kind == "model":
            if _int(record.get("params")):
                params = _int(record.get("params"))
                params_origin = _str(record.get("origin"), 200)
        elif kind == "deepspeed_config":
            parsed, dumped_world = _ds_config(ev, number, record)
            if parsed is not None:
                ds_config = parsed
            if world is None and dumped_world is not None:
                world = dumped_world
                world_origin = "DeepSpeed's resolved config"
            if _str(record.get("deepspeed")):
                versions["deepspeed"] = _str(record.get("deepspeed")) or ""
        elif kind == "oom":
            oom_count += 1
            oom = _oom(ref, when, record)
            ooms.append(oom)
            gpu_total = oom.total or gpu_total
            gpu_allowed = oom.allowed or gpu_allowed
        elif kind == "exception":
            found = len(oom_events) + len(exceptions)
            _exception(ev, ref, when, record, oom_events, exceptions)
            if len(oom_events) + len(exceptions) > found:
                excepted = True
                ended = when
        elif kind == "exit":
            exited = True
            ended = ended or when
            exit_code = _int(record.get("code"))
        elif kind == "gone":
            before = record.get("memory_events_before")
            after = record.get("memory_events_after")
            gone = RankGone(
                ref,
                when,
                _int(before.get("oom_kill")) if isinstance(before, dict) else None,
                _int(after.get("oom_kill")) if isinstance(after, dict) else None,
                _int(record.get("kernel_lines")),
            )
    if ev.cut:
        ev.problems.append("its last line was cut: the process was killed while writing it")
    if ev.unreadable:
        ev.problems.append(f"{ev.unreadable} unreadable line(s) skipped")
    if excepted:
        end = CaptureEnd.EXCEPTION
    elif exited:
        end = CaptureEnd.EXITED
    elif gone is not None:
        end = CaptureEnd.KILLED
    else:
        end = CaptureEnd.VANISHED
    memory, host, series_problems, series_last = (
        _read_series(series_file, ev.rank, ev.host)
        if series_file is not None
        else (None, None, [], None)
    )
    return RankCapture(
        path=ev.path,
        process=process,
        series_path=series_file.path if series_file is not None else None,
        run=_str(base.header.get("run"), 200),
        rank=ev.rank,
        local_rank=_int(base.header.get("local_rank")),
        world_size=world,
        world_size_origin=world_origin,
        host=ev.host,
        pid=_int(base.header.get("pid")),
        started=started,
        versions=tuple(sorted(versions.items())),
        environment=tuple(environment),
        cgroup_limit=cgroup_limit,
        node_memory=node_memory,
        policies=tuple(policies),
        notes=tuple(notes[:MAX_PROBLEMS]),
        memory=memory,
        host_memory=host,
        ooms=tuple(ooms[:MAX_PROBLEMS]),
        oom_count=oom_count,
        oom_events=tuple(oom_events),
        exceptions=tuple(exceptions),
        end=end,
        exit_code=exit_code,
        ended=ended or (gone.timestamp if gone is not None else None),
        last_record=max((t for t in (last, series_last) if t is not None), default=None),
        last_step=last_step,
        gone=gone,
        ds_config=ds_config,
        params=params,
        params_origin=params_origin,
        gpu_total=gpu_total,
        gpu_allowed=gpu_allowed,
        problems=tuple((ev.problems + series_problems)[:MAX_PROBLEMS]),
    )


def _ds_config(
    ev: _Events, number: int, record: dict[str, Any]
) -> tuple[DumpedConfig | None, int | None]:
    """The dump DeepSpeed's ``DeepSpeedConfig.print`` would log, and its ``world_size``."""
    lines = record.get("lines")
    if not isinstance(lines, list) or not lines:
        return None, None
    texts = [line[:MAX_TEXT] for line in lines[:5000] if isinstance(line, str)]
    ref = ev.ref(number)
    try:
        dump = parse_config_dump([(ref, text) for text in texts])
    except ValueError:
        return None, None
    world = dump.value_of("world_size")
    return DumpedConfig(
        source=dump.header,
        effective=dump.effective(),
        user_config=dict(dump.user_config.data) if dump.user_config is not None else {},
        complete=dump.complete,
        problems=dump.problems,
    ), world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None


def _oom(ref: SourceRef, when: datetime | None, record: dict[str, Any]) -> CapturedOom:
    counters = record.get("counters") if isinstance(record.get("counters"), dict) else {}
    assert isinstance(counters, dict)
    nvml = record.get("nvml") if isinstance(record.get("nvml"), dict) else {}
    assert isinstance(nvml, dict)
    self_pid = _int(nvml.get("self_pid"))
    processes = []
    listed = nvml.get("processes")
    if isinstance(listed, list):
        for item in listed[:64]:
            if isinstance(item, dict) and _int(item.get("pid")) is not None:
                pid = _int(item.get("pid")) or 0
                processes.append(NvmlProcess(pid, _int(item.get("bytes")), pid == self_pid))
    return CapturedOom(
        source=ref,
        timestamp=when,
        device=_int(record.get("device")),
        requested=_int(record.get("requested")),
        limit=_int(record.get("limit")),
        device_free=_int(record.get("device_free")),
        total=_int(record.get("total")),
        allowed=_int(record.get("allowed")),
        allocated=_int(counters.get("alloc")),
        reserved=_int(counters.get("reserved")),
        step=_int(record.get("step")),
        snapshot=_str(record.get("snapshot"), 255),
        snapshot_bytes=_int(record.get("snapshot_bytes")),
        dump_seconds=_num(record.get("dump_seconds")),
        snapshot_error=_str(record.get("snapshot_error"), 300),
        stacks=record.get("stacks") is True,
        processes=tuple(processes),
        nvml_used=_int(nvml.get("used")),
        nvml_total=_int(nvml.get("total")),
        trace_kept=_kept(record.get("snapshot_trace_kept")),
    )


def _kept(raw: Any) -> tuple[int, ...] | None:
    """The capture's ``snapshot_trace_kept``: a list of per-device counts, else None."""
    if not isinstance(raw, list) or len(raw) > 64:
        return None
    counts = tuple(_int(n) for n in raw)
    return tuple(n for n in counts if n is not None) or None


def _frames(raw: Any) -> list[Frame]:
    if not isinstance(raw, list):
        return []
    return [
        Frame(frame[0][:500], frame[1], frame[2][:200])
        for frame in raw[:100]
        if isinstance(frame, list)
        and len(frame) == 3
        and isinstance(frame[0], str)
        and _int(frame[1]) is not None
        and isinstance(frame[2], str)
    ]


def _exception(
    ev: _Events,
    ref: SourceRef,
    when: datetime | None,
    record: dict[str, Any],
    oom_events: list[OomEvent],
    exceptions: list[ExceptionEvent],
) -> None:
    chain = record.get("chain")
    if not isinstance(chain, list):
        return
    parsed: list[tuple[str, str, Traceback]] = []
    for index, item in enumerate(chain[:4]):
        if not isinstance(item, dict):
            continue
        cls = _str(item.get("class"), 200)
        if not cls:
            continue
        message = _str(item.get("message"), MAX_TEXT) or ""
        frames = _frames(item.get("frames"))
        traceback = Traceback(
            source=ref,
            frames=tuple(frames),
            frames_omitted=_int(item.get("frames_omitted")) or 0,
            exception_class=cls,
            exception_text=message,
            cut=False,
            chained=index > 0,
        )
        parsed.append((cls, message, traceback))
    for cls, message, traceback in parsed:
        oom = parse_oom_message(message, exception_class=cls)
        if oom is not None:
            phase, evidence = classify_phase(traceback.frames)
            oom_events.append(
                OomEvent(
                    source=ref,
                    message=oom,
                    phase=phase,
                    phase_evidence=evidence,
                    traceback=traceback,
                    origin="capture",
                    timestamp=when,
                    timestamp_exact=when is not None,
                )
            )
            return
    if not parsed:
        return
    cls, message, traceback = parsed[0]
    phase, evidence = classify_phase(traceback.frames)
    exceptions.append(
        ExceptionEvent(
            source=ref,
            exception_class=cls,
            text=message[:2000],
            traceback=traceback,
            phase=phase,
            phase_evidence=evidence,
            peer_failure=torchrun.parse_peer_failure(message) is not None
            or "DistBackendError" in cls,
            timestamp=when,
            timestamp_exact=when is not None,
        )
    )


# -- series ---------------------------------------------------------------------------------


def _read_series(
    file: CaptureFile, rank: int | None, host: str | None
) -> tuple[MemorySeries | None, HostSeries | None, list[str], datetime | None]:
    gpu_samples: Thinned[MemorySample] = Thinned()
    host_samples: Thinned[HostSample] = Thinned()
    allocated, reserved, max_allocated = RunningStats(), RunningStats(), RunningStats()
    labels: dict[str, tuple[RunningStats, RunningStats]] = {}
    rss, shmem, cgroup = RunningStats(), RunningStats(), RunningStats()
    cgroup_max: int | None = None
    last_host: HostSample | None = None
    last_time: datetime | None = None
    problems: list[str] = []
    unreadable = 0
    cut = False
    for number, record, was_cut in _lines(file.path, MAX_SERIES_LINES):
        if number == 1:
            continue
        if record is None:
            cut = cut or was_cut
            unreadable += 0 if was_cut else 1
            continue
        ref = SourceRef(file.path, number, rank, host)
        when = _time(record.get("t"))
        last_time = when or last_time
        alloc = _int(record.get("alloc"))
        res = _int(record.get("reserved"))
        if alloc is not None and res is not None:
            label = _str(record.get("label"), 60) or _str(record.get("src"), 60) or "sample"
            sample = MemorySample(
                source=ref,
                label=label,
                allocated=alloc,
                max_allocated=_int(record.get("alloc_peak")) or alloc,
                reserved=res,
                max_reserved=_int(record.get("reserved_peak")) or res,
                cpu_used=None,
                cpu_percent=None,
                step=_int(record.get("step")),
                timestamp=when,
            )
            gpu_samples.add(sample)
            allocated.add(alloc)
            reserved.add(res)
            max_allocated.add(sample.max_allocated)
            if label in labels or len(labels) < MAX_LABELS:
                stats = labels.setdefault(label, (RunningStats(), RunningStats()))
                stats[0].add(alloc)
                stats[1].add(res)
        if "rss" in record or "cg_current" in record:
            events = record.get("cg_events")
            sample_host = HostSample(
                source=ref,
                timestamp=when,
                rss=_int(record.get("rss")),
                rss_anon=_int(record.get("rss_anon")),
                rss_shmem=_int(record.get("rss_shmem")),
                pinned=_int(record.get("pinned")),
                cgroup_current=_int(record.get("cg_current")),
                cgroup_max=_int(record.get("cg_max")),
                oom_kill=_int(events.get("oom_kill")) if isinstance(events, dict) else None,
                mem_available=_int(record.get("mem_available")),
            )
            host_samples.add(sample_host)
            last_host = sample_host
            for running, value in (
                (rss, sample_host.rss),
                (shmem, sample_host.rss_shmem),
                (cgroup, sample_host.cgroup_current),
            ):
                if value is not None:
                    running.add(value)
            if sample_host.cgroup_max is not None:
                cgroup_max = sample_host.cgroup_max
    if cut:
        problems.append("the series' last line was cut: the process was killed while writing it")
    if unreadable:
        problems.append(f"{unreadable} unreadable series line(s) skipped")
    memory = None
    if gpu_samples.count:
        memory = MemorySeries(
            rank=rank,
            host=host,
            samples=gpu_samples.items(),
            total_samples=gpu_samples.count,
            allocated=allocated.freeze(),
            reserved=reserved.freeze(),
            max_allocated=max_allocated.freeze(),
            cpu_used=None,
            by_label=tuple(
                LabelStats(label, a.freeze(), r.freeze()) for label, (a, r) in labels.items()
            ),
            origin="capture",
        )
    host_series = None
    if host_samples.count:
        host_series = HostSeries(
            rank=rank,
            samples=host_samples.items(),
            total_samples=host_samples.count,
            rss=rss.freeze() if rss.count else None,
            rss_shmem=shmem.freeze() if shmem.count else None,
            cgroup_current=cgroup.freeze() if cgroup.count else None,
            cgroup_max=cgroup_max,
            last=last_host,
        )
    return memory, host_series, problems, last_time
