"""The report as the HTML and Markdown templates show it: a view model built from a ``Report``.

``build_view(report)`` turns the report's facts and diagnoses into small, bounded, display-ready
pieces: the verdict banner, the ranked diagnoses with their evidence and fixes, the memory
account (``oomlens.render.account_view``), the per-rank table, chart geometry (numbers only:
every label stays a plain string that the templates autoescape), the config summary and memory
budgets, the inputs, what was missing, what the allocator cannot see, and the list of everything
that was cut to keep the report small.

Contracts:

* every string that came from an input is cleaned of control and bidi characters and capped
  (``MAX_TEXT``); nothing here is markup, so the templates escape all of it;
* every list is capped (``Capped.more`` says how many items were left out, and ``View.cuts``
  says it in words), and every chart has at most ``MAX_POINTS`` points per line, so the report's
  size does not grow with the inputs';
* building a view never raises on odd facts (a missing number just leaves its cell empty).

The charts' geometry is ``oomlens.render.charts``, the config and budget part
``oomlens.render.config_view``, the bounded pieces they share ``oomlens.render.bounded``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from oomlens.facts.log import OomEvent, OomKind, StepSample
from oomlens.facts.ranks import RankPicture
from oomlens.render import words
from oomlens.render.account_view import AccountView, account_view
from oomlens.render.bounded import MAX_SHORT_TEXT, Capped, Fact, cap, pct, plain, size, text, where
from oomlens.render.charts import LineChart, SnapshotView, series_chart, snapshot_views
from oomlens.render.config_view import BudgetView, ConfigView, config_view, oom_budget, zero_budget
from oomlens.render.templates import rule_partials
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

MAX_EVIDENCE = 12
MAX_FIXES = 6
MAX_MISSING = 12
MAX_RANK_ROWS = 64
MAX_OOM_ROWS = 16
MAX_INPUT_ROWS = 100
MAX_INPUT_NOTES = 5
MAX_FRAMES = 40
MAX_TAIL_LINES = 20
MAX_TAIL_LOGS = 3
MAX_OTHER_PROCESSES = 16

# -------------------------------------------------------------------------------- banner


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
    return f"step {sample.step}{total} (last progress line, {where(sample.source)})"


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
        rows.append(Fact("Where", where(failure.source)))
    if failure is not None and failure.rank is not None and not picture.unranked_run:
        rows.append(Fact("Rank", str(failure.rank)))
    if failure is not None and failure.time is not None:
        when = failure.time.isoformat(sep=" ")
        rows.append(Fact("When", when + ("" if failure.time_exact else " (or just after)")))
    step = _step(failure.step) if failure is not None else None
    if step is not None:
        rows.append(Fact("Step", step))
    if phase and phase != "unknown":
        rows.append(Fact("Phase", phase))
    said = words.first_failure(picture)
    if said is not None:
        rows.append(Fact("First failure", f"{said[0]} ({said[1]})"))
    if picture.suspected_stragglers and (picture.first_failed is None):
        rows.append(
            Fact(
                "Waited for",
                "rank "
                + ", ".join(str(r) for r in picture.suspected_stragglers)
                + " (the ranks that did not time out: a hang or a slow rank)",
            )
        )
    victims = [str(r) for r in picture.peer_victims]
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
        top_confidence=pct(top.confidence) if top is not None else None,
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
    """True for text quoted word for word from an input (a log line, an error file): shown as
    an excerpt of the line it cites."""


@dataclass(frozen=True, slots=True)
class FixView:
    index: int
    summary: str
    patch: str | None
    """The ds_config merge patch as indented JSON."""
    environment: str | None
    """``export VAR=value`` lines, shell-quoted."""
    command: str | None
    arguments: str | None
    """The command-line arguments to set, ``--flag value ...`` shell-quoted (what ``oomlens
    fix`` sets in the run's command)."""
    saving: str | None
    saving_bytes: int | None
    predicted_peak: str | None
    """The peak the run is predicted to reach with the fix applied."""
    predicted_peak_bytes: int | None
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
    # An excerpt with the line's number in its gutter says "this is that line": only for the
    # input's own words; oomlens' account of a line is shown as text citing it.
    quoted = item.verbatim and item.kind.value in ("log", "error_file", "kernel")
    return EvidenceView(
        kind=item.kind.value,
        text=text(item.text),
        where=where(item.source),
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
        patch = text(json.dumps(plain(item.config_patch), indent=2, default=str), 8000)
    return FixView(
        index=index,
        summary=text(item.summary, 1000),
        patch=patch,
        environment=_env_lines(dict(item.environment)),
        command=text(item.command, 1000) if item.command else None,
        # the command already says them, in words a reader of the report follows
        arguments=(
            text(words.arguments(item.arguments), 1000)
            if item.arguments and not item.command
            else None
        ),
        saving=size(item.predicted_saving_bytes) if item.predicted_saving_bytes else None,
        saving_bytes=item.predicted_saving_bytes,
        predicted_peak=size(item.predicted_peak_bytes)
        if item.predicted_peak_bytes is not None
        else None,
        predicted_peak_bytes=item.predicted_peak_bytes,
        cost=text(item.cost, 400) if item.cost else None,
    )


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
        confidence=pct(d.confidence),
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
    """Who failed first (``rank 1``, ``the only process``), None when no rank is known to."""
    first_why: str
    """Why that one, in words (``out of memory; it failed earliest``)."""
    victims: str
    timed_out: str
    stragglers: str
    launcher_exits: Capped[str]


def _ranks(report: Report) -> RankTable:
    picture = report.facts.ranks
    first = picture.first_failed
    said = words.first_failure(picture)
    rows = cap(
        picture.ranks,
        MAX_RANK_ROWS,
        lambda s: RankRow(
            rank=words.rank_cell(s, picture),
            outcome=words.outcome(s),
            own_failure=s.own_failure,
            died_because_of_peer=s.died_because_of_peer,
            peer_evidence=text(s.peer_evidence or "", 400),
            exitcode="" if s.exitcode is None else str(s.exitcode),
            signal=text(s.signal or "", 40),
            when=s.first_time.isoformat(sep=" ") if s.first_time else "",
            where=where(s.first_source),
            is_first=first is not None and s is first,
        ),
    )
    return RankTable(
        rows=rows,
        first_failed=said[0] if said is not None else None,
        first_why=said[1] if said is not None else "",
        victims=", ".join(str(r) for r in picture.peer_victims),
        timed_out=", ".join(str(r) for r in picture.timed_out_ranks),
        stragglers=", ".join(str(r) for r in picture.suspected_stragglers),
        launcher_exits=cap(
            picture.launcher_exits,
            8,
            lambda e: f"exit code {e.return_code} ({where(e.source)})",
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


def _oom_rows(events: Sequence[OomEvent], picture: RankPicture) -> Capped[OomRow]:
    return cap(
        events,
        MAX_OOM_ROWS,
        lambda e: OomRow(
            rank=words.event_rank(e, picture),
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
            where=where(e.source),
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
    """The failing rank's traceback as the reader kept it: its frames (each numbered with the
    log line it was read on) and its exception.  The source lines under the frames are not
    kept, so the title says frames, not the text as printed."""
    tb = None
    exception_line: int | None = None
    title = "Frames of the failure"
    first = report.facts.first_gpu_oom()
    if first is not None and first.traceback is not None:
        tb, exception_line = first.traceback, first.source.line
    elif report.facts.ranks.first_failed is not None:
        status = report.facts.ranks.first_failed
        for exc in status.exceptions:
            if exc.traceback is not None:
                tb, exception_line = exc.traceback, exc.source.line
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
            tb, exception_line = candidates[0].traceback, candidates[0].source.line
    if tb is None:
        return None
    lines: list[Line] = []
    if not tb.headless:  # a paste that starts inside the traceback printed no header
        lines.append(Line(_number(tb.source.line), "Traceback (most recent call last):"))
    frames = tb.frames
    shown = frames if len(frames) <= MAX_FRAMES else frames[:8] + frames[-(MAX_FRAMES - 8) :]
    for index, frame in enumerate(shown):
        if len(frames) > MAX_FRAMES and index == 8:
            lines.append(Line("", f"… {len(frames) - MAX_FRAMES:,} frames not shown …"))
        lines.append(
            Line(
                _number(frame.at),
                f'  File "{text(frame.filename, 500)}", line {frame.line}, '
                f"in {text(frame.function, 300)}",
            )
        )
    if tb.frames_omitted:
        lines.append(Line("", f"… {tb.frames_omitted:,} more frames were not kept by the reader …"))
    if tb.exception_text:
        lines.append(Line(_number(exception_line), text(tb.exception_text, 3000)))
    elif tb.cut:
        lines.append(Line("", "(the log ends here: the traceback was cut before its exception)"))
    note = "the first failing rank's traceback" if tb.chained is False else "a chained traceback"
    note += ", its frames and exception as read (the source lines under the frames are not kept)"
    return Excerpt(title=title, where=where(tb.source), lines=tuple(lines), note=note)


def _number(line: int | None) -> str:
    return "" if line is None else str(line)


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
    return BlindSpots(figures=tuple(figures), other_processes=others, where=where(event.source))


# -------------------------------------------------------------------------------- the view


@dataclass(frozen=True, slots=True)
class View:
    banner: Banner
    diagnoses: tuple[DiagnosisView, ...]
    account: AccountView | None
    """The memory account of the first GPU OOM (None without one)."""
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
    oom_rows = _oom_rows(events, report.facts.ranks)
    if oom_rows.more:
        cuts.append(f"{oom_rows.more:,} more out-of-memory errors not listed")
    ranks = _ranks(report)
    if ranks.rows.more:
        cuts.append(f"{ranks.rows.more:,} more ranks not listed")
    inputs = _inputs(report)
    if inputs.more:
        cuts.append(f"{inputs.more:,} more inputs not listed")
    config = config_view(report)
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
    at_oom = oom_budget(report)
    zero, zero_missing = zero_budget(report)
    missing = cap(report.missing, MAX_MISSING * 2, lambda m: text(m, 1000))
    world = report.facts.world_size
    return View(
        banner=_banner(report),
        diagnoses=diagnoses,
        account=account_view(report.facts.account),
        ranks=ranks,
        oom_events=oom_rows,
        traceback=_traceback_excerpt(report),
        tails=_tails(report, cuts),
        memory_chart=series_chart(report, cuts),
        snapshots=snapshot_views(report, cuts),
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
        world_size=text(words.world_size(world), 400),
        generated_from=", ".join(text(i.path, 200) for i in report.facts.inputs[:3])
        + (f" and {len(report.facts.inputs) - 3} more" if len(report.facts.inputs) > 3 else ""),
    )
