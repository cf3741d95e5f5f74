"""The report as the HTML and Markdown templates show it: a view model built from a ``Report``.

``build_view(report)`` turns the report's facts and diagnoses into small, bounded, display-ready
pieces: the verdict banner, the ranked diagnoses with their evidence and fixes, the per-rank
table, chart geometry (numbers only: every label stays a plain string that the templates
autoescape), the config summary and memory budgets, the inputs, what was missing, what the
allocator cannot see, and the list of everything that was cut to keep the report small.

Contracts:

* every string that came from an input is cleaned of control and bidi characters and capped
  (``MAX_TEXT``); nothing here is markup, so the templates escape all of it;
* every list is capped (``Capped.more`` says how many items were left out, and ``View.cuts``
  says it in words), and every chart has at most ``MAX_POINTS`` points per line, so the report's
  size does not grow with the inputs';
* building a view never raises on odd facts (a missing number just leaves its cell empty).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from oomlens.facts import SourceRef
from oomlens.facts.config import ConfigValue, show_value
from oomlens.facts.log import MemorySeries, OomEvent, OomKind, StepSample
from oomlens.facts.memory_model import Device
from oomlens.facts.snapshot import DeviceAnalysis, SnapshotAnalysis
from oomlens.render.templates import rule_partials
from oomlens.render.text import clean
from oomlens.report import (
    SCHEMA_VERSION,
    Diagnosis,
    Evidence,
    Figure,
    Fix,
    Report,
    RuleDoc,
    Unit,
    Verdict,
)
from oomlens.units import format_size

T = TypeVar("T")
S = TypeVar("S")

MAX_TEXT = 2000
"""Characters of one untrusted string (a log line, a config value, a frame)."""
MAX_SHORT_TEXT = 300
MAX_EVIDENCE = 12
MAX_FIXES = 6
MAX_MISSING = 12
MAX_RANK_ROWS = 64
MAX_OOM_ROWS = 16
MAX_INPUT_ROWS = 100
MAX_INPUT_NOTES = 5
MAX_CONFIG_ROWS = 60
MAX_CONFIG_PROBLEMS = 30
MAX_RAW_CONFIG_CHARS = 20_000
MAX_FRAMES = 40
MAX_TAIL_LINES = 20
MAX_TAIL_LOGS = 3
MAX_SERIES = 8
"""Ranks drawn in one memory chart (two lines each)."""
MAX_POINTS = 300
"""Points of one chart line; longer series are downsampled keeping each stretch's maximum."""
MAX_TIMELINES = 4
MAX_SEGMENT_ROWS = 20
MAX_BARS = 10
MAX_OTHER_PROCESSES = 16
MAX_BUDGET_ROWS = 30

# -------------------------------------------------------------------------------- basics


@dataclass(frozen=True, slots=True)
class Capped(Generic[T]):
    """At most a bound of items, and how many there were."""

    items: tuple[T, ...]
    total: int

    @property
    def more(self) -> int:
        return self.total - len(self.items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


def cap(source: Sequence[S], limit: int, make: Callable[[S], T]) -> Capped[T]:
    """The first ``limit`` items of ``source`` made into views (only those are built)."""
    return Capped(tuple(make(item) for item in source[:limit]), len(source))


def text(value: object, limit: int = MAX_TEXT) -> str:
    """Untrusted text for display: control and bidi characters removed, capped, one line
    breaks kept (templates show multi-line text in ``<pre>``)."""
    raw = clean(str(value)).replace("\r", "")
    if len(raw) <= limit:
        return raw
    return f"{raw[:limit]}… ({len(raw) - limit:,} more characters not shown)"


def size(value: int | float | None) -> str:
    return "" if value is None else format_size(value)


def _where(ref: SourceRef | None) -> str:
    return text(ref.describe(), MAX_SHORT_TEXT) if ref is not None else ""


def _pct(value: float) -> str:
    return f"{value:.0%}"


# -------------------------------------------------------------------------------- banner


@dataclass(frozen=True, slots=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True, slots=True)
class Banner:
    verdict: str
    verdict_title: str
    tone: str
    """``bad`` (an OOM), ``warn`` (another failure, a rejected config), ``ok``, ``unknown``."""
    reason: str
    headline: str
    """The most likely cause in words, or what the verdict means when there is none."""
    top_id: str | None
    top_confidence: str | None
    facts: tuple[Fact, ...]
    """What died, where, when, at which step, in which phase, who failed first."""


_TONES = {
    Verdict.GPU_OOM: "bad",
    Verdict.HOST_OOM: "bad",
    Verdict.CONFIG_ERROR: "warn",
    Verdict.OTHER_FAILURE: "warn",
    Verdict.NO_FAILURE: "ok",
    Verdict.UNKNOWN: "unknown",
}
_VERDICT_WORDS = {
    Verdict.GPU_OOM: "The GPU ran out of memory",
    Verdict.HOST_OOM: "The host ran out of memory",
    Verdict.CONFIG_ERROR: "The job was rejected by its configuration",
    Verdict.OTHER_FAILURE: "The run failed, not for lack of memory",
    Verdict.NO_FAILURE: "The inputs show no failure",
    Verdict.UNKNOWN: "The inputs cannot tell what happened",
}


def _first_sentence(message: str, limit: int = 240) -> str:
    cut = message.find(". ")
    head = message if cut < 0 else message[: cut + 1]
    return text(head, limit)


def _step(sample: StepSample | None) -> str | None:
    """The last training step printed before the failure, and where."""
    if sample is None or sample.step is None:
        return None
    total = f" of {sample.total}" if sample.total else ""
    return f"step {sample.step}{total} (last progress line, {_where(sample.source)})"


def _oom_what(event: OomEvent) -> str:
    """``torch.OutOfMemoryError: CUDA out of memory: tried to allocate 42.00 MiB with ...``."""
    m = event.message
    head = f"{m.exception_class or m.kind.value + ' error'}: {_first_sentence(m.text, 120)}"
    details = []
    if m.tried_to_allocate is not None:
        details.append(f"tried to allocate {format_size(m.tried_to_allocate)}")
    if m.allocated_by_pytorch is not None:
        details.append(f"{format_size(m.allocated_by_pytorch)} allocated by PyTorch")
    if m.reserved_unallocated is not None:
        details.append(f"{format_size(m.reserved_unallocated)} reserved but unallocated")
    if m.allowed is not None:
        details.append(f"{format_size(m.allowed)} allowed")
    elif m.total_capacity is not None:
        details.append(f"{format_size(m.total_capacity)} capacity")
    if m.other_processes_total:
        details.append(f"{format_size(m.other_processes_total)} held by other processes")
    if details:
        head = head.rstrip(".") + " (" + ", ".join(details) + ")"
    return text(head, 600)


def _banner(report: Report) -> Banner:
    picture = report.facts.ranks
    rows: list[Fact] = []
    phase: str | None = None
    failure = report.failure
    if failure is not None and failure.event is not None:
        first = failure.event
        m = first.message
        rows.append(Fact("What died", _oom_what(first)))
        phase = first.phase.value.replace("_", " ")
        if m.device is not None:
            rows.append(Fact("Device", f"{m.backend or 'GPU'} {m.device}"))
    elif failure is not None and failure.kill is not None:
        kill = failure.kill
        scope = "memory cgroup limit" if kill.cgroup else "machine's memory"
        rows.append(
            Fact(
                "What died",
                text(f"{kill.process_name} (pid {kill.pid}), killed by the kernel for the {scope}"),
            )
        )
    elif failure is not None and failure.status is not None:
        status = failure.status
        detail = status.outcome.replace("_", " ")
        if status.exceptions:
            exc = status.exceptions[0]
            detail = _first_sentence(exc.text) or exc.exception_class
            phase = exc.phase.value.replace("_", " ")
        elif status.signal:
            detail = f"{detail} ({status.signal})"
        rows.append(Fact("What died", text(detail, 400)))
    if failure is not None and failure.source is not None:
        rows.append(Fact("Where", _where(failure.source)))
    if failure is not None and failure.rank is not None:
        rows.append(Fact("Rank", str(failure.rank)))
    if failure is not None and failure.time is not None:
        when = failure.time.isoformat(sep=" ")
        rows.append(Fact("When", when + ("" if failure.time_exact else " (or just after)")))
    step = _step(failure.step) if failure is not None else None
    if step is not None:
        rows.append(Fact("Step", step))
    if phase and phase != "unknown":
        rows.append(Fact("Phase", phase))
    if picture.first_failed is not None and picture.first_failed.rank is not None:
        basis = f", decided by {picture.basis.replace('_', ' ')}" if picture.basis else ""
        rows.append(
            Fact(
                "First failure",
                f"rank {picture.first_failed.rank} "
                f"({picture.first_failed.outcome.replace('_', ' ')}{basis})",
            )
        )
    if picture.suspected_stragglers and (picture.first_failed is None):
        rows.append(
            Fact(
                "Waited for",
                "rank "
                + ", ".join(str(r) for r in picture.suspected_stragglers)
                + " (the ranks that did not time out: a hang or a slow rank)",
            )
        )
    victims = [str(r) for r in picture.peer_victims if r is not None]
    if victims:
        rows.append(Fact("Died because a peer did", "rank " + ", ".join(victims)))
    top = report.top
    headline = text(top.title, 200) if top is not None else _VERDICT_WORDS[report.verdict]
    return Banner(
        verdict=report.verdict.value,
        verdict_title=report.verdict.value.replace("_", " ").upper(),
        tone=_TONES[report.verdict],
        reason=text(report.verdict_reason, 600),
        headline=headline,
        top_id=top.id if top is not None else None,
        top_confidence=_pct(top.confidence) if top is not None else None,
        facts=tuple(rows),
    )


# -------------------------------------------------------------------------------- diagnoses


@dataclass(frozen=True, slots=True)
class EvidenceView:
    kind: str
    text: str
    where: str
    line: int | None
    rank: int | None
    note: str
    supports: bool
    quoted: bool
    """True for text quoted from an input (a log line, an error file): shown as an excerpt."""


@dataclass(frozen=True, slots=True)
class FixView:
    index: int
    summary: str
    patch: str | None
    """The ds_config merge patch as indented JSON."""
    environment: str | None
    """``export VAR=value`` lines, shell-quoted."""
    command: str | None
    saving: str | None
    saving_bytes: int | None
    cost: str | None


@dataclass(frozen=True, slots=True)
class DiagnosisView:
    index: int
    anchor: str
    id: str
    title: str
    severity: str
    confidence: str
    confidence_value: float
    summary: str
    rank: int | None
    evidence: Capped[EvidenceView]
    fixes: Capped[FixView]
    missing: Capped[str]
    figures: tuple[Fact, ...]
    explanation: str
    """What the diagnosis means and why it happens (declared with its rule)."""
    reading: str
    """How to read the evidence ('' when it needs no saying)."""
    verify: str
    """How to tell the fix worked."""
    partial: str
    """The template that renders it: ``rules/<id>.html`` (``rules/_rule.html`` when missing)."""


def _evidence(item: Evidence) -> EvidenceView:
    quoted = item.kind.value in ("log", "error_file", "kernel")
    return EvidenceView(
        kind=item.kind.value,
        text=text(item.text),
        where=_where(item.source),
        line=item.source.line if item.source is not None else None,
        rank=item.source.rank if item.source is not None else None,
        note=text(item.note, 600),
        supports=item.supports,
        quoted=quoted,
    )


def _env_lines(environment: dict[str, str]) -> str | None:
    if not environment:
        return None
    return "\n".join(
        f"export {text(name, 200)}={shlex.quote(text(value, 600))}"
        for name, value in environment.items()
    )


def _fix(index: int, item: Fix) -> FixView:
    patch = None
    if item.config_patch is not None:
        patch = text(json.dumps(_plain(item.config_patch), indent=2, default=str), 8000)
    return FixView(
        index=index,
        summary=text(item.summary, 1000),
        patch=patch,
        environment=_env_lines(dict(item.environment)),
        command=text(item.command, 1000) if item.command else None,
        saving=size(item.predicted_saving_bytes) if item.predicted_saving_bytes else None,
        saving_bytes=item.predicted_saving_bytes,
        cost=text(item.cost, 400) if item.cost else None,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _figure_value(figure: Figure) -> str:
    value = figure.value
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if figure.unit is Unit.BYTES and isinstance(value, int | float):
        return f"{format_size(value)} ({int(value):,} B)"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return text(value, MAX_SHORT_TEXT)


def partial_for(rule_id: str) -> str:
    """``rules/<id>.html`` when that partial exists, else the generic ``rules/_rule.html``."""
    if rule_id in rule_partials():
        return f"rules/{rule_id}.html"
    return "rules/_rule.html"


def _diagnosis(index: int, d: Diagnosis, doc: RuleDoc | None, cuts: list[str]) -> DiagnosisView:
    evidence = cap(d.evidence, MAX_EVIDENCE, _evidence)
    if evidence.more:
        cuts.append(f"{d.id}: {evidence.more} more evidence items not shown (all are in the JSON)")
    fixes = cap(list(enumerate(d.fixes, 1)), MAX_FIXES, lambda pair: _fix(*pair))
    return DiagnosisView(
        index=index,
        anchor=f"d{index}-{d.id}" if d.id.replace("_", "").isalnum() else f"d{index}",
        id=text(d.id, 80),
        title=text(d.title, 200),
        severity=d.severity.label,
        confidence=_pct(d.confidence),
        confidence_value=d.confidence,
        summary=text(d.summary, 1500),
        rank=d.rank,
        evidence=evidence,
        fixes=fixes,
        missing=cap(d.missing, MAX_MISSING, lambda m: text(m, 1000)),
        figures=tuple(
            Fact(text(k, 80).replace("_", " "), _figure_value(v)) for k, v in d.figures.items()
        )[:24],
        explanation=doc.explanation if doc is not None else "",
        reading=doc.reading if doc is not None else "",
        verify=doc.verify if doc is not None else "",
        partial=partial_for(d.id),
    )


# -------------------------------------------------------------------------------- ranks, OOMs


@dataclass(frozen=True, slots=True)
class RankRow:
    rank: str
    outcome: str
    own_failure: bool
    died_because_of_peer: bool
    peer_evidence: str
    exitcode: str
    signal: str
    when: str
    where: str
    is_first: bool


@dataclass(frozen=True, slots=True)
class RankTable:
    rows: Capped[RankRow]
    first_failed: str | None
    basis: str | None
    victims: str
    timed_out: str
    stragglers: str
    launcher_exits: Capped[str]


def _ranks(report: Report) -> RankTable:
    picture = report.facts.ranks
    first = picture.first_failed
    rows = cap(
        picture.ranks,
        MAX_RANK_ROWS,
        lambda s: RankRow(
            rank="?" if s.rank is None else str(s.rank),
            outcome=s.outcome.replace("_", " "),
            own_failure=s.own_failure,
            died_because_of_peer=s.died_because_of_peer,
            peer_evidence=text(s.peer_evidence or "", 400),
            exitcode="" if s.exitcode is None else str(s.exitcode),
            signal=text(s.signal or "", 40),
            when=s.first_time.isoformat(sep=" ") if s.first_time else "",
            where=_where(s.first_source),
            is_first=first is not None and s is first,
        ),
    )
    return RankTable(
        rows=rows,
        first_failed=None if first is None else ("?" if first.rank is None else str(first.rank)),
        basis=picture.basis.replace("_", " ") if picture.basis else None,
        victims=", ".join(str(r) for r in picture.peer_victims if r is not None),
        timed_out=", ".join(str(r) for r in picture.timed_out_ranks),
        stragglers=", ".join(str(r) for r in picture.suspected_stragglers),
        launcher_exits=cap(
            picture.launcher_exits,
            8,
            lambda e: f"exit code {e.return_code} ({_where(e.source)})",
        ),
    )


@dataclass(frozen=True, slots=True)
class OomRow:
    rank: str
    host: str
    device: str
    kind: str
    phase: str
    requested: str
    allocated: str
    reserved_unallocated: str
    free: str
    limit: str
    when: str
    where: str


def _oom_rows(events: Sequence[OomEvent]) -> Capped[OomRow]:
    return cap(
        events,
        MAX_OOM_ROWS,
        lambda e: OomRow(
            rank="?" if e.rank is None else str(e.rank),
            host=text(e.source.host or "", 100),
            device="" if e.message.device is None else str(e.message.device),
            kind=e.message.kind.value,
            phase=e.phase.value.replace("_", " "),
            requested=size(e.message.tried_to_allocate),
            allocated=size(e.message.allocated_by_pytorch),
            reserved_unallocated=size(e.message.reserved_unallocated),
            free=size(e.message.free),
            limit=size(e.message.allowed or e.message.total_capacity),
            when=e.timestamp.isoformat(sep=" ") if e.timestamp else "",
            where=_where(e.source),
        ),
    )


# -------------------------------------------------------------------------------- excerpts


@dataclass(frozen=True, slots=True)
class Line:
    number: str
    text: str


@dataclass(frozen=True, slots=True)
class Excerpt:
    title: str
    where: str
    lines: tuple[Line, ...]
    note: str


def _traceback_excerpt(report: Report) -> Excerpt | None:
    """The failing rank's traceback, frames and exception, as printed."""
    tb = None
    title = "The failure as printed"
    first = report.facts.first_gpu_oom()
    if first is not None and first.traceback is not None:
        tb = first.traceback
    elif report.facts.ranks.first_failed is not None:
        status = report.facts.ranks.first_failed
        for exc in status.exceptions:
            if exc.traceback is not None:
                tb = exc.traceback
                break
    if tb is None:
        # the launcher's own ChildFailedError traceback says nothing about the rank's failure
        candidates = [
            exc
            for exc in report.facts.exceptions()
            if exc.traceback is not None and not exc.exception_class.endswith("ChildFailedError")
        ]
        candidates.sort(key=lambda exc: exc.peer_failure)
        if candidates:
            tb = candidates[0].traceback
    if tb is None:
        return None
    lines: list[Line] = [Line(str(tb.source.line or ""), "Traceback (most recent call last):")]
    frames = tb.frames
    shown = frames if len(frames) <= MAX_FRAMES else frames[:8] + frames[-(MAX_FRAMES - 8) :]
    for index, frame in enumerate(shown):
        if len(frames) > MAX_FRAMES and index == 8:
            lines.append(Line("", f"… {len(frames) - MAX_FRAMES:,} frames not shown …"))
        lines.append(
            Line(
                "",
                f'  File "{text(frame.filename, 500)}", line {frame.line}, '
                f"in {text(frame.function, 300)}",
            )
        )
    if tb.frames_omitted:
        lines.append(Line("", f"… {tb.frames_omitted:,} more frames were not kept by the reader …"))
    if tb.exception_text:
        lines.append(Line("", text(tb.exception_text, 3000)))
    elif tb.cut:
        lines.append(Line("", "(the log ends here: the traceback was cut before its exception)"))
    note = "the first failing rank's traceback" if tb.chained is False else "a chained traceback"
    return Excerpt(title=title, where=_where(tb.source), lines=tuple(lines), note=note)


def _tails(report: Report, cuts: list[str]) -> tuple[Excerpt, ...]:
    found = []
    logs = [log for log in report.facts.logs if log.tail]
    for log in logs[:MAX_TAIL_LOGS]:
        tail = log.tail[-MAX_TAIL_LINES:]
        found.append(
            Excerpt(
                title="Last lines of the log",
                where=text(log.path, MAX_SHORT_TEXT),
                lines=tuple(Line(str(number), text(line, 500)) for number, line in tail),
                note=f"{log.lines:,} lines read",
            )
        )
    if len(logs) > MAX_TAIL_LOGS:
        cuts.append(f"the last lines of {len(logs) - MAX_TAIL_LOGS} more logs are not shown")
    return tuple(found)


# -------------------------------------------------------------------------------- charts


@dataclass(frozen=True, slots=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True, slots=True)
class Polyline:
    label: str
    points: str
    """``x,y x,y ...`` in chart coordinates: numbers only."""
    style: int
    """Palette index (0..7), one per rank or device."""
    dashed: bool


@dataclass(frozen=True, slots=True)
class Marker:
    x: float
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class HLine:
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class SeriesSummary:
    label: str
    samples: str
    first: str
    last: str
    maximum: str
    growth: str


@dataclass(frozen=True, slots=True)
class LineChart:
    anchor: str
    title: str
    caption: str
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    lines: tuple[Polyline, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    x_label: str
    hlines: tuple[HLine, ...]
    markers: tuple[Marker, ...]
    summaries: tuple[SeriesSummary, ...]
    note: str


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    detail: str
    value: str
    width: float
    """Bar length in chart units (0..``BarChart.bar_width``)."""
    style: str
    y: float


@dataclass(frozen=True, slots=True)
class BarChart:
    anchor: str
    title: str
    caption: str
    width: int
    height: int
    label_width: int
    bar_width: int
    bars: tuple[Bar, ...]
    note: str


@dataclass(frozen=True, slots=True)
class Part:
    label: str
    value: str
    x: float
    width: float
    style: str


@dataclass(frozen=True, slots=True)
class SegmentRow:
    label: str
    y: float
    total_width: float
    live_width: float
    free_width: float
    detail: str


@dataclass(frozen=True, slots=True)
class SegmentMap:
    anchor: str
    title: str
    caption: str
    width: int
    height: int
    summary: tuple[Part, ...]
    legend: tuple[Fact, ...]
    rows: tuple[SegmentRow, ...]
    row_top: float
    note: str
    request: str
    """The failed request against the largest free block, in words (when known)."""


CHART_WIDTH = 760
CHART_HEIGHT = 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 16, 14, 34


def downsample(
    values: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most ``limit`` points: the first, the last, and each stretch's maximum between."""
    if len(values) <= limit:
        return list(values)
    inner = limit - 2
    stretch = (len(values) - 2) / inner
    out = [values[0]]
    for index in range(inner):
        start = 1 + int(index * stretch)
        end = max(start + 1, 1 + int((index + 1) * stretch))
        out.append(max(values[start:end], key=lambda point: point[1]))
    out.append(values[-1])
    return out


def nice_step(span: float, ticks: int = 5) -> float:
    """A round step (1, 2, 2.5, 5 x 10^k; for bytes, powers of two of GiB/MiB) for an axis."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    if raw < 1:
        power = 1.0
        while power > raw:
            power /= 10
        magnitude = power
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def _byte_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    step = 1.0
    while step < raw:
        step *= 2
    return step


class _Scale:
    def __init__(self, low: float, high: float, out_low: float, out_high: float) -> None:
        if high <= low:
            high = low + 1
        self.low, self.high, self.out_low, self.out_high = low, high, out_low, out_high

    def __call__(self, value: float) -> float:
        ratio = (value - self.low) / (self.high - self.low)
        return round(self.out_low + ratio * (self.out_high - self.out_low), 1)


def _line_chart(
    anchor: str,
    title: str,
    caption: str,
    series: Sequence[tuple[str, int, bool, Sequence[tuple[float, float]]]],
    x_label: str,
    x_format: Any,
    limit: tuple[int, str] | None,
    markers: Sequence[tuple[float, float, str]],
    summaries: Sequence[SeriesSummary],
    note: str,
) -> LineChart | None:
    drawn = [
        (label, style, dashed, downsample(points))
        for label, style, dashed, points in series
        if points
    ]
    if not drawn:
        return None
    xs = [x for _, _, _, pts in drawn for x, _ in pts] + [m[0] for m in markers]
    ys = [y for _, _, _, pts in drawn for _, y in pts] + [m[1] for m in markers]
    if limit is not None:
        ys.append(limit[0])
    x_low, x_high = min(xs), max(xs)
    y_high = max(ys) * 1.05 or 1.0
    step = _byte_step(y_high)
    y_high = step * (int(y_high / step) + (0 if y_high % step == 0 else 1))
    width, height = CHART_WIDTH, CHART_HEIGHT
    sx = _Scale(x_low, x_high, _LEFT, width - _RIGHT)
    sy = _Scale(0, y_high, height - _BOTTOM, _TOP)
    lines = tuple(
        Polyline(
            label=label,
            points=" ".join(f"{sx(x)},{sy(y)}" for x, y in pts),
            style=style % 8,
            dashed=dashed,
        )
        for label, style, dashed, pts in drawn
    )
    y_ticks = []
    value = 0.0
    while value <= y_high + 1e-9:
        y_ticks.append(Tick(sy(value), format_size(value)))
        value += step
    x_step = nice_step(x_high - x_low)
    first_tick = x_low if x_step == 0 else (x_low // x_step) * x_step
    x_ticks: list[Tick] = []
    tick = first_tick
    while tick <= x_high + 1e-9 and len(x_ticks) < 12:
        if tick >= x_low - 1e-9:
            x_ticks.append(Tick(sx(tick), x_format(tick)))
        tick += x_step
    hlines: tuple[HLine, ...] = ()
    if limit is not None:
        hlines = (HLine(sy(limit[0]), f"{limit[1]} {format_size(limit[0])}"),)
    return LineChart(
        anchor=anchor,
        title=title,
        caption=caption,
        width=width,
        height=height,
        left=_LEFT,
        top=_TOP,
        right=width - _RIGHT,
        bottom=height - _BOTTOM,
        lines=lines,
        x_ticks=tuple(x_ticks),
        y_ticks=tuple(y_ticks),
        x_label=x_label,
        hlines=hlines,
        markers=tuple(Marker(sx(x), sy(y), label) for x, y, label in markers),
        summaries=tuple(summaries),
        note=note,
    )


def _oom_limit(report: Report, rank: int | None = None) -> tuple[int, str] | None:
    events = report.facts.gpu_oom_events()
    for event in events:
        if rank is not None and event.rank not in (None, rank):
            continue
        m = event.message
        if m.allowed is not None:
            return m.allowed, "allowed"
        if m.total_capacity is not None:
            return m.total_capacity, "capacity"
    return None


def _series_chart(report: Report, cuts: list[str]) -> LineChart | None:
    series = [s for s in report.facts.memory_series() if s.samples]
    if not series:
        return None
    shown = series[:MAX_SERIES]
    if len(series) > MAX_SERIES:
        cuts.append(f"memory chart: {len(series) - MAX_SERIES} more ranks' series not drawn")
    samples = [sample for s in shown for sample in s.samples]
    if all(sample.timestamp is not None for sample in samples):
        origin = min(sample.timestamp for sample in samples)  # type: ignore[type-var]

        def x_of(sample: Any) -> float:
            return float((sample.timestamp - origin).total_seconds())

        x_label = f"seconds since {origin.isoformat(sep=' ', timespec='seconds')}"  # type: ignore[union-attr]

        def x_format(v: float) -> str:
            return f"{v:g}s"
    elif all(sample.step is not None for sample in samples):

        def x_of(sample: Any) -> float:
            return float(sample.step)

        x_label = "training step"

        def x_format(v: float) -> str:
            return f"{v:g}"
    else:

        def x_of(sample: Any) -> float:
            return float(sample.source.line or 0)

        x_label = "log line"

        def x_format(v: float) -> str:
            return f"{v:,.0f}"

    lines = []
    summaries = []
    notes = []
    for index, s in enumerate(shown):
        name = _series_name(s)
        allocated = [(x_of(p), float(p.allocated)) for p in s.samples]
        reserved = [(x_of(p), float(p.reserved)) for p in s.samples]
        lines.append((f"{name} allocated (MA)", index, False, allocated))
        lines.append((f"{name} reserved (CA)", index, True, reserved))
        summaries.append(_summary(name, s))
        if s.total_samples > len(s.samples):
            notes.append(
                f"{name}: {len(s.samples):,} of {s.total_samples:,} samples kept by the reader"
            )
        if len(s.samples) > MAX_POINTS:
            notes.append(f"{name}: drawn with {MAX_POINTS} points")
    if notes:
        cuts.extend(f"memory chart: {n}" for n in notes)
    rank = shown[0].rank if len(shown) == 1 else None
    return _line_chart(
        "chart-memory",
        "Memory over time (DeepSpeed see_memory_usage)",
        "Allocated (MA, solid) and reserved (CA, dashed) GPU memory per rank, as DeepSpeed "
        "printed it; the red line is the limit the OOM message reported.",
        lines,
        x_label,
        x_format,
        _oom_limit(report, rank),
        (),
        summaries,
        "; ".join(notes),
    )


def _series_name(s: MemorySeries) -> str:
    name = "rank ?" if s.rank is None else f"rank {s.rank}"
    if s.host:
        name += f" on {text(s.host, 60)}"
    return name


def _summary(name: str, s: MemorySeries) -> SeriesSummary:
    growth = ""
    if s.allocated.slope is not None and s.total_samples > 1:
        growth = f"{format_size(s.allocated.slope)} per sample"
    return SeriesSummary(
        label=name,
        samples=f"{s.total_samples:,}",
        first=size(s.allocated.first),
        last=size(s.allocated.last),
        maximum=size(s.max_allocated.maximum),
        growth=growth,
    )


def _device_name(snapshot: SnapshotAnalysis, device: DeviceAnalysis) -> str:
    rank = f"rank {snapshot.source.rank}, " if snapshot.source.rank is not None else ""
    base = snapshot.source.path.replace("\\", "/").rsplit("/", 1)[-1]
    return text(f"{base} ({rank}device {device.device})", 200)


def _timeline_chart(
    report: Report, index: int, snapshot: SnapshotAnalysis, device: DeviceAnalysis
) -> LineChart | None:
    timeline = device.timeline
    if timeline is None or not timeline.samples:
        return None
    timed = all(p.time_us is not None for p in timeline.samples)
    if timed:
        origin = timeline.samples[0].time_us or 0

        def x_of(point: Any) -> float:
            return float(point.time_us - origin) / 1000.0

        x_label = "milliseconds since the first recorded event"

        def x_format(v: float) -> str:
            return f"{v:g}"
    else:

        def x_of(point: Any) -> float:
            return float(point.index)

        x_label = "allocator event"

        def x_format(v: float) -> str:
            return f"{v:,.0f}"

    active = [(x_of(p), float(p.active_bytes)) for p in timeline.samples]
    reserved = [(x_of(p), float(p.reserved_bytes)) for p in timeline.samples]
    markers = []
    if device.oom is not None:
        markers.append((x_of(timeline.end), float(timeline.end.active_bytes), "OOM"))
    name = _device_name(snapshot, device)
    return _line_chart(
        f"chart-timeline-{index}",
        f"Allocator timeline: {name}",
        "Live (allocated and pending-free, solid) and reserved (dashed) bytes replayed from the "
        "snapshot's recorded history; the red line is the limit the OOM message reported.",
        [("live", index, False, active), ("reserved", index, True, reserved)],
        x_label,
        x_format,
        _oom_limit(report, snapshot.source.rank),
        markers,
        (),
        f"{timeline.entries:,} recorded events ({timeline.allocs:,} allocations, "
        f"{timeline.frees:,} frees); drawn with {len(timeline.samples)} points, each its "
        "stretch's maximum"
        + (
            f"; {timeline.unmatched_frees:,} frees of blocks allocated before recording began"
            if timeline.unmatched_frees
            else ""
        ),
    )


_SEGMENT_WIDTH = 760
_SEGMENT_LABEL = 250


def _segment_map(
    index: int, snapshot: SnapshotAnalysis, device: DeviceAnalysis
) -> SegmentMap | None:
    state = device.state
    if state.reserved_bytes <= 0:
        return None
    parts_spec = [
        ("allocated", state.allocated_bytes, "live"),
        ("pending free", state.pending_free_bytes, "pending"),
        ("free, cannot be released", state.unreleasable_free_bytes, "stuck"),
        ("free, releasable", state.releasable_free_bytes, "releasable"),
        ("free, expandable", state.expandable_free_bytes, "expandable"),
    ]
    total = float(state.reserved_bytes)
    x = 0.0
    parts = []
    for label, value, style in parts_spec:
        if value <= 0:
            continue
        width = round(_SEGMENT_WIDTH * value / total, 1)
        parts.append(Part(label, format_size(value), round(x, 1), width, style))
        x += width
    segments = device.pinned_segments[:MAX_SEGMENT_ROWS]
    biggest = max((s.total_size for s in segments), default=1) or 1
    scale = (_SEGMENT_WIDTH - _SEGMENT_LABEL - 10) / biggest
    row_top = 70.0
    rows = []
    for row_index, segment in enumerate(segments):
        rows.append(
            SegmentRow(
                label=(
                    f"{format_size(segment.free_bytes)} free of {format_size(segment.total_size)}"
                ),
                y=row_top + row_index * 18,
                total_width=round(segment.total_size * scale, 1),
                live_width=round(segment.allocated_bytes * scale, 1),
                free_width=round(segment.free_bytes * scale, 1),
                detail=(
                    f"{format_size(segment.allocated_bytes)} live in {segment.live_blocks} of "
                    f"{segment.blocks} blocks, {format_size(segment.free_bytes)} free (largest "
                    f"free block {format_size(segment.largest_free_block)}), {segment.pool.value} "
                    f"pool, stream {segment.stream}"
                ),
            )
        )
    height = int(row_top + len(rows) * 18 + 10)
    request = ""
    oom = device.oom
    if oom is not None and oom.snapshot_at_oom:
        verdict = "would have fit" if oom.fits_largest_free_block else "did not fit"
        request = (
            f"The failed request needed a {format_size(oom.alloc_size_bytes)} block; the largest "
            f"free block of its pool and stream was {format_size(oom.largest_free_block)} "
            f"({verdict}), with {format_size(oom.free_bytes)} free in total."
        )
    note = ""
    if state.unreleasable_segments > len(segments):
        note = (
            f"{state.unreleasable_segments:,} segments hold free space that cannot be released; "
            f"the {len(segments)} with the most of it are drawn"
        )
    return SegmentMap(
        anchor=f"segments-{index}",
        title=f"Segment map: {_device_name(snapshot, device)}",
        caption=(
            f"Reserved {format_size(state.reserved_bytes)} in {state.segments:,} segments "
            f"({state.blocks:,} blocks, {state.live_blocks:,} live). Free space inside a segment "
            "that still holds a live block cannot be returned to the driver, nor used for a "
            "request larger than its largest free block."
        ),
        width=_SEGMENT_WIDTH,
        height=height,
        summary=tuple(parts),
        legend=tuple(Fact(p.label, p.value) for p in parts),
        rows=tuple(rows),
        row_top=row_top,
        note=note,
        request=request,
    )


_CATEGORY_WORDS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "zero3_gathered_params": "ZeRO-3 gathered parameters",
    "zero_buckets": "ZeRO buckets",
    "temporaries": "temporaries",
    "workspace": "library workspace",
    "unknown": "unrecognised stack",
}
_BAR_LABEL, _BAR_WIDTH = 300, 330


def _bar_chart(
    anchor: str, title: str, caption: str, rows: Sequence[tuple[str, str, int, str]], note: str
) -> BarChart | None:
    if not rows:
        return None
    biggest = max(value for _, _, value, _ in rows) or 1
    bars = tuple(
        Bar(
            label=label,
            detail=detail,
            value=format_size(value),
            width=round(_BAR_WIDTH * value / biggest, 1),
            style=style,
            y=float(8 + index * 26),
        )
        for index, (label, detail, value, style) in enumerate(rows)
    )
    return BarChart(
        anchor=anchor,
        title=title,
        caption=caption,
        width=_BAR_LABEL + _BAR_WIDTH + 110,
        height=int(16 + len(bars) * 26),
        label_width=_BAR_LABEL,
        bar_width=_BAR_WIDTH,
        bars=bars,
        note=note,
    )


def _site_bars(index: int, snapshot: SnapshotAnalysis, device: DeviceAnalysis) -> BarChart | None:
    sites = device.live_by_site[:MAX_BARS]
    rows = []
    for site in sites:
        label = "no recorded stack" if site.site is None else text(site.site.describe(), 400)
        detail = (
            f"{site.blocks:,} blocks; {site.common_size_blocks:,} of "
            f"{format_size(site.common_size)}; "
            f"{_CATEGORY_WORDS.get(site.category.value, site.category.value)}"
        )
        if site.site is not None:
            detail = (
                f"{text(site.site.filename, 500)}:{site.site.line} in {text(site.site.name, 300)}; "
                + detail
            )
        rows.append((label, detail, site.bytes, site.category.value))
    more = len(device.live_by_site) - len(sites)
    return _bar_chart(
        f"sites-{index}",
        f"Live memory by call site: {_device_name(snapshot, device)}",
        "Bytes still allocated when the snapshot was taken, grouped by the first frame of user "
        "code in each allocation's stack.",
        rows,
        f"{more} more call sites not shown" if more > 0 else "",
    )


def _category_bars(
    index: int, snapshot: SnapshotAnalysis, device: DeviceAnalysis
) -> BarChart | None:
    rows = [
        (
            _CATEGORY_WORDS.get(c.category.value, c.category.value),
            f"{c.blocks:,} blocks; {c.confidence.value} confidence: {text(c.evidence, 400)}",
            c.bytes,
            c.category.value,
        )
        for c in device.live_by_category[:MAX_BARS]
    ]
    return _bar_chart(
        f"categories-{index}",
        f"Live memory by category: {_device_name(snapshot, device)}",
        "What the live bytes probably are, inferred from the frames of their allocation stacks.",
        rows,
        "",
    )


@dataclass(frozen=True, slots=True)
class SnapshotView:
    name: str
    where: str
    history: str
    stacks: str
    settings: str
    figures: tuple[Fact, ...]
    timeline: LineChart | None
    segments: SegmentMap | None
    sites: BarChart | None
    categories: BarChart | None
    notes: tuple[str, ...]


def _snapshots(report: Report, cuts: list[str]) -> tuple[SnapshotView, ...]:
    pairs = list(report.facts.snapshot_devices())
    if len(pairs) > MAX_TIMELINES:
        cuts.append(f"{len(pairs) - MAX_TIMELINES} more snapshot devices not drawn")
    views = []
    for index, (snapshot, device) in enumerate(pairs[:MAX_TIMELINES]):
        state = device.state
        figures = [
            Fact("reserved", size(state.reserved_bytes)),
            Fact("allocated", size(state.allocated_bytes)),
            Fact("free inside segments with live blocks", size(state.unreleasable_free_bytes)),
            Fact("segments holding such free space", f"{state.unreleasable_segments:,}"),
            Fact("largest free block", size(state.largest_free_block)),
            Fact("rounding waste in allocated blocks", size(state.internal_waste_bytes)),
        ]
        if device.oom is not None:
            figures.append(
                Fact(
                    "failed request",
                    f"{format_size(device.oom.alloc_size_bytes)} ({device.oom.pool.value} pool)",
                )
            )
        if device.leak is not None:
            figures.append(
                Fact(
                    "growth per iteration",
                    f"{format_size(device.leak.bytes_per_iteration)} over "
                    f"{device.leak.iterations} iterations",
                )
            )
        settings = snapshot.allocator_settings
        views.append(
            SnapshotView(
                name=_device_name(snapshot, device),
                where=_where(snapshot.source),
                history=snapshot.history.value.replace("_", " "),
                stacks=snapshot.stacks.value.replace("_", " "),
                settings=text(settings.raw_config or "(defaults)", 400)
                if settings
                else "not recorded",
                figures=tuple(figures),
                timeline=_timeline_chart(report, index, snapshot, device),
                segments=_segment_map(index, snapshot, device),
                sites=_site_bars(index, snapshot, device),
                categories=_category_bars(index, snapshot, device),
                notes=tuple(text(n, 200).replace("_", " ") for n in device.notes[:8]),
            )
        )
    return tuple(views)


# -------------------------------------------------------------------------------- config, budget


@dataclass(frozen=True, slots=True)
class ConfigRow:
    key: str
    value: str
    origin: str
    where: str
    note: str


@dataclass(frozen=True, slots=True)
class ProblemRow:
    severity: str
    key: str
    message: str
    where: str


@dataclass(frozen=True, slots=True)
class ConfigView:
    origin: str
    where: str
    rows: Capped[ConfigRow]
    auto_keys: str
    problems: Capped[ProblemRow]
    hazards: Capped[ProblemRow]
    notes: Capped[str]
    raw_json: str | None
    raw_cut: str


def _config_row(value: ConfigValue[Any]) -> ConfigRow:
    return ConfigRow(
        key=text(value.key_path, 200),
        value=text(show_value(value.value), MAX_SHORT_TEXT),
        origin=value.origin.value.replace("_", " "),
        where=_where(value.source),
        note=text(value.note, 300),
    )


def _config(report: Report) -> ConfigView | None:
    source = report.facts.config
    if source is None:
        return None
    reading = source.reading
    effective = reading.effective
    values = effective.all_values()
    ordered = [v for v in values if v.is_explicit] + [v for v in values if not v.is_explicit]
    raw = None
    raw_cut = ""
    if reading.raw:
        dumped = json.dumps(_plain(reading.raw), indent=2, default=str, ensure_ascii=False)
        if len(dumped) > MAX_RAW_CONFIG_CHARS:
            raw_cut = f"{len(dumped) - MAX_RAW_CONFIG_CHARS:,} more characters not shown"
            dumped = dumped[:MAX_RAW_CONFIG_CHARS]
        raw = text(dumped, MAX_RAW_CONFIG_CHARS)
    return ConfigView(
        origin=source.origin.replace("_", " ").replace("+", " + "),
        where=_where(effective.source),
        rows=cap(ordered, MAX_CONFIG_ROWS, _config_row),
        auto_keys=", ".join(text(k, 200) for k in effective.auto_keys[:30]),
        problems=cap(
            reading.problems,
            MAX_CONFIG_PROBLEMS,
            lambda p: ProblemRow(
                p.severity.value, text(p.key_path, 200), text(p.message, 600), _where(p.source)
            ),
        ),
        hazards=cap(
            reading.hazards,
            MAX_CONFIG_PROBLEMS,
            lambda h: ProblemRow(
                h.severity.value,
                text(", ".join(h.key_paths), 300),
                text(h.message, 600)
                + (f" ({format_size(h.bytes_at_stake)} at stake)" if h.bytes_at_stake else ""),
                ", ".join(_where(s) for s in h.sources[:3]),
            ),
        ),
        notes=cap(reading.notes, MAX_CONFIG_PROBLEMS, lambda n: text(n, 600)),
        raw_json=raw,
        raw_cut=raw_cut,
    )


@dataclass(frozen=True, slots=True)
class BudgetRow:
    name: str
    where: str
    phase: str
    bytes: str
    formula: str


@dataclass(frozen=True, slots=True)
class OomBudget:
    """The memory picture the OOM message itself gives: what filled the limit."""

    where: str
    limit: str
    limit_name: str
    parts: tuple[Part, ...]
    rows: tuple[Fact, ...]
    width: int
    request_x: float | None
    request_width: float | None
    request: str
    limit_x: float


@dataclass(frozen=True, slots=True)
class ZeroBudget:
    summary: str
    rows: Capped[BudgetRow]
    gpu_peak: str
    host_peak: str
    assumptions: tuple[str, ...]
    verdicts: tuple[Fact, ...]
    """Each device's peak against its capacity."""
    patches: tuple[Fact, ...]
    """The config patches the model predicts would help, most memory saved first."""


@dataclass(frozen=True, slots=True)
class BudgetView:
    at_oom: OomBudget | None
    zero: ZeroBudget | None
    zero_missing: str
    """Why there is no ZeRO model budget, when there is none."""


_BUDGET_WIDTH = 760


def _oom_budget(report: Report) -> OomBudget | None:
    event = report.facts.first_gpu_oom()
    if event is None:
        return None
    m = event.message
    limit = m.allowed if m.allowed is not None else m.total_capacity
    if limit is None or m.allocated_by_pytorch is None:
        return None
    limit_name = "allowed (memory fraction)" if m.allowed is not None else "total capacity"
    spec: list[tuple[str, int, str]] = [("allocated by PyTorch", m.allocated_by_pytorch, "live")]
    if m.reserved_unallocated:
        spec.append(("reserved by PyTorch, unallocated", m.reserved_unallocated, "stuck"))
    reserved = m.allocated_by_pytorch + (m.reserved_unallocated or 0)
    if m.process_in_use is not None and m.process_in_use > reserved and m.allowed is None:
        spec.append(
            (
                "this process outside PyTorch (context, NCCL...)",
                m.process_in_use - reserved,
                "context",
            )
        )
    if m.other_processes_total and m.allowed is None:
        spec.append(("other processes", m.other_processes_total, "other"))
    scale = max(limit, sum(v for _, v, _ in spec) + (m.tried_to_allocate or 0))
    x = 0.0
    parts = []
    for label, value, style in spec:
        width = round(_BUDGET_WIDTH * value / scale, 1)
        parts.append(Part(label, format_size(value), round(x, 1), width, style))
        x += width
    rows = [Fact(p.label, p.value) for p in parts]
    request = ""
    request_x = request_width = None
    if m.tried_to_allocate is not None:
        request_x = round(x, 1)
        request_width = max(2.0, round(_BUDGET_WIDTH * m.tried_to_allocate / scale, 1))
        request = f"the failed request: {format_size(m.tried_to_allocate)}"
        rows.append(Fact("tried to allocate", format_size(m.tried_to_allocate)))
    rows.append(Fact(limit_name, format_size(limit)))
    if m.free is not None:
        rows.append(Fact("free on the device (all processes)", format_size(m.free)))
    return OomBudget(
        where=_where(event.source),
        limit=format_size(limit),
        limit_name=limit_name,
        parts=tuple(parts),
        rows=tuple(rows),
        width=_BUDGET_WIDTH,
        request_x=request_x,
        request_width=request_width,
        request=request,
        limit_x=round(_BUDGET_WIDTH * limit / scale, 1),
    )


def _zero_budget(report: Report) -> tuple[ZeroBudget | None, str]:
    """The ZeRO memory model the analysis built (``RunFacts.memory_model``), for display."""
    facts = report.facts
    if facts.config is None:
        return None, ""
    model = facts.memory_model
    if model is None:
        if facts.params is None:
            return None, (
                "the parameter count is unknown: pass --params (e.g. --params 1.3B) to get the "
                "ZeRO memory model's per-GPU and per-host budget"
            )
        return None, "the memory model could not be built for this config"
    budget = model.budget
    rows = cap(
        budget.components,
        MAX_BUDGET_ROWS,
        lambda c: BudgetRow(
            name=text(c.name, 200),
            where=("GPU" if c.device is Device.GPU else "host")
            + (" (per host)" if c.per_host else ""),
            phase=c.phase.value,
            bytes=format_size(c.bytes),
            formula=text(c.formula, 300),
        ),
    )
    summary = (
        f"ZeRO stage {budget.stage}, {budget.precision.value}, "
        f"{budget.model.total_params:,} parameters ({text(budget.model.source, 100)}), "
        f"{budget.topology.world_size} rank(s), {budget.topology.ranks_per_host} per host"
    )
    verdicts = tuple(
        Fact(
            f"{v.kind} capacity {format_size(v.capacity_bytes)} ({text(v.capacity_source, 100)})",
            (
                f"fits: peak {format_size(v.required_bytes)} ({text(v.peak_phase, 60)}), "
                f"{format_size(v.headroom_bytes)} left"
                if v.fits
                else f"does not fit: peak {format_size(v.required_bytes)}, "
                f"{format_size(v.overflow_bytes)} over"
                + (f" from {text(v.overflow_phase, 60)}" if v.overflow_phase else "")
                + (
                    f" ({text(v.overflow_component.name, 120)})"
                    if v.overflow_component is not None
                    else ""
                )
            ),
        )
        for v in model.verdicts
    )
    patches = tuple(
        Fact(
            text(p.summary, 300),
            "; ".join(
                part
                for part in (
                    f"saves {format_size(p.gpu_bytes_saved)} per GPU" if p.gpu_bytes_saved else "",
                    f"cost: {text(p.cost, 200)}" if p.cost else "",
                )
                if part
            ),
        )
        for p in model.patches[:6]
    )
    return (
        ZeroBudget(
            summary=summary,
            rows=rows,
            gpu_peak=format_size(budget.gpu_peak_bytes),
            host_peak=format_size(budget.host_peak_bytes),
            assumptions=tuple(text(a, 400) for a in (*budget.assumptions, *model.assumptions)[:10]),
            verdicts=verdicts,
            patches=patches,
        ),
        "",
    )


# -------------------------------------------------------------------------------- inputs, blind


@dataclass(frozen=True, slots=True)
class InputRow:
    path: str
    kind: str
    detail: str
    rank: str
    problem: str
    notes: Capped[str]


def _inputs(report: Report) -> Capped[InputRow]:
    return cap(
        report.facts.inputs,
        MAX_INPUT_ROWS,
        lambda i: InputRow(
            path=text(i.path, MAX_SHORT_TEXT),
            kind=text(i.kind, 60).replace("_", " "),
            detail=text(i.detail, 300),
            rank="" if i.rank is None else str(i.rank),
            problem=text(i.problem or "", 600),
            notes=cap(i.notes, MAX_INPUT_NOTES, lambda n: text(n, 300)),
        ),
    )


@dataclass(frozen=True, slots=True)
class BlindSpots:
    """What the allocator's numbers leave out, with the figures the OOM message gives."""

    figures: tuple[Fact, ...]
    other_processes: Capped[Fact]
    where: str


def _blind_spots(report: Report) -> BlindSpots | None:
    event = report.facts.first_gpu_oom()
    if event is None or event.message.kind is not OomKind.ALLOCATOR:
        return None
    m = event.message
    figures = []
    reserved = None
    if m.allocated_by_pytorch is not None and m.reserved_unallocated is not None:
        reserved = m.allocated_by_pytorch + m.reserved_unallocated
        figures.append(Fact("reserved by PyTorch's allocator", format_size(reserved)))
    if m.process_in_use is not None:
        figures.append(
            Fact("this process in total (as the driver sees it)", format_size(m.process_in_use))
        )
        if reserved is not None and m.process_in_use >= reserved:
            figures.append(
                Fact(
                    "this process outside the allocator (CUDA context, NCCL, cuBLAS...)",
                    format_size(m.process_in_use - reserved),
                )
            )
    if m.other_processes_total:
        figures.append(Fact("other processes on the GPU", format_size(m.other_processes_total)))
    if m.total_capacity is not None and m.free is not None:
        figures.append(Fact("device capacity", format_size(m.total_capacity)))
        figures.append(Fact("free on the device", format_size(m.free)))
        used = m.total_capacity - m.free
        known = (m.process_in_use or 0) + (m.other_processes_total or 0)
        if m.process_in_use is not None and used - known > 256 * 1024**2:
            figures.append(
                Fact(
                    "used by processes the message does not list (other containers, MPS, "
                    "the driver)",
                    format_size(used - known),
                )
            )
    others = cap(
        m.other_processes,
        MAX_OTHER_PROCESSES,
        lambda p: Fact(f"process {p.pid}", format_size(p.bytes)),
    )
    return BlindSpots(figures=tuple(figures), other_processes=others, where=_where(event.source))


# -------------------------------------------------------------------------------- the view


@dataclass(frozen=True, slots=True)
class View:
    banner: Banner
    diagnoses: tuple[DiagnosisView, ...]
    ranks: RankTable
    oom_events: Capped[OomRow]
    traceback: Excerpt | None
    tails: tuple[Excerpt, ...]
    memory_chart: LineChart | None
    snapshots: tuple[SnapshotView, ...]
    config: ConfigView | None
    budget: BudgetView
    inputs: Capped[InputRow]
    unreadable: int
    missing: Capped[str]
    capture_snapshot: bool
    """Show the snippet that records and dumps a snapshot at the OOM."""
    blind_spots: BlindSpots | None
    cuts: tuple[str, ...]
    version: str
    schema_version: str
    redacted: bool
    world_size: str
    generated_from: str
    extra: dict[str, Any] = field(default_factory=dict)


def build_view(report: Report, *, redacted: bool = False) -> View:
    """The display model of ``report`` (see the module docstring for its contracts)."""
    cuts: list[str] = []
    diagnoses = tuple(
        _diagnosis(i, d, report.docs.get(d.id), cuts) for i, d in enumerate(report.diagnoses, 1)
    )
    events = report.facts.oom_events()
    oom_rows = _oom_rows(events)
    if oom_rows.more:
        cuts.append(f"{oom_rows.more:,} more out-of-memory errors not listed")
    ranks = _ranks(report)
    if ranks.rows.more:
        cuts.append(f"{ranks.rows.more:,} more ranks not listed")
    inputs = _inputs(report)
    if inputs.more:
        cuts.append(f"{inputs.more:,} more inputs not listed")
    config = _config(report)
    if config is not None and config.rows.more:
        cuts.append(f"{config.rows.more} more config settings not listed")
    if config is not None and config.raw_cut:
        cuts.append(f"the config as written: {config.raw_cut}")
    for log in report.facts.logs:
        for kind, count in log.dropped:
            cuts.append(
                f"{text(log.path, 200)}: the reader kept a bounded list of {kind}; "
                f"{count:,} not kept"
            )
    at_oom = _oom_budget(report)
    zero, zero_missing = _zero_budget(report)
    missing = cap(report.missing, MAX_MISSING * 2, lambda m: text(m, 1000))
    world = report.facts.world_size
    return View(
        banner=_banner(report),
        diagnoses=diagnoses,
        ranks=ranks,
        oom_events=oom_rows,
        traceback=_traceback_excerpt(report),
        tails=_tails(report, cuts),
        memory_chart=_series_chart(report, cuts),
        snapshots=_snapshots(report, cuts),
        config=config,
        budget=BudgetView(at_oom=at_oom, zero=zero, zero_missing=zero_missing),
        inputs=inputs,
        unreadable=sum(1 for i in report.facts.inputs if i.problem),
        missing=missing,
        capture_snapshot=not report.facts.snapshots
        and report.verdict in (Verdict.GPU_OOM, Verdict.UNKNOWN),
        blind_spots=_blind_spots(report),
        cuts=tuple(cuts),
        version=report.oomlens_version,
        schema_version=SCHEMA_VERSION,
        redacted=redacted,
        world_size=(
            f"{world.value} ({text(world.origin, 100)})" if world is not None else "unknown"
        ),
        generated_from=", ".join(text(i.path, 200) for i in report.facts.inputs[:3])
        + (f" and {len(report.facts.inputs) - 3} more" if len(report.facts.inputs) > 3 else ""),
    )
