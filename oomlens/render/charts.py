"""The charts of the HTML report, as geometry: numbers only (every label stays a plain string the
templates autoescape), each line downsampled to ``MAX_POINTS`` points keeping each stretch's
maximum, every list capped.  Memory over time (``see_memory_usage`` per rank, or a snapshot's
timeline), the segment map with the free space that cannot be released, and live memory by
call site and by category.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomlens.facts.log import MemorySeries
from oomlens.facts.snapshot import DeviceAnalysis, SnapshotAnalysis
from oomlens.render import words
from oomlens.render.bounded import Fact, size, text, where
from oomlens.report import Report
from oomlens.units import format_size

MIN_SERIES_SAMPLES = 2
"""A memory series with fewer samples is not charted (one point is no trend)."""

MAX_SERIES = 8
"""Ranks drawn in one memory chart (two lines each)."""
MAX_POINTS = 300
"""Points of one chart line; longer series are downsampled keeping each stretch's maximum."""
MAX_TIMELINES = 4
MAX_SEGMENT_ROWS = 20
MAX_BARS = 10


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
    label_x: float
    label_y: float
    anchor: str
    """``start`` or ``end``: the label's side, chosen so that it covers no OOM marker's."""


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
    placed = tuple(Marker(sx(x), sy(y), label) for x, y, label in markers)
    hlines: tuple[HLine, ...] = ()
    if limit is not None:
        hlines = (_limit_line(sy(limit[0]), f"{limit[1]} {format_size(limit[0])}", width, placed),)
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
        markers=placed,
        summaries=tuple(summaries),
        note=note,
    )


_CHAR_WIDTH = 7.0
"""A generous width of one character of an 11 px chart label, in chart units."""


def _limit_line(y: float, label: str, width: int, markers: Sequence[Marker]) -> HLine:
    """The limit line with its label at the first place (right or left end, above or below
    the line) where it covers no OOM marker or marker label (they sit at the line's end when
    the run died at the limit)."""
    left, right = _LEFT + 4, width - _RIGHT
    span = _CHAR_WIDTH * len(label)
    taken = [(m.x - 10 - _CHAR_WIDTH * len(m.label), m.y - 21, m.x + 6, m.y + 6) for m in markers]
    candidates = [
        (right, y - 4, "end"),
        (left, y - 4, "start"),
        (right, y + 14, "end"),
        (left, y + 14, "start"),
    ]
    for x, base, anchor in candidates:
        x0, x1 = (x - span, x) if anchor == "end" else (x, x + span)
        box = (x0, base - 11, x1, base + 3)
        if not any(_overlap(box, other) for other in taken):
            return HLine(y, label, x, base, anchor)
    x, base, anchor = candidates[0]
    return HLine(y, label, x, base, anchor)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def oom_limit(report: Report, rank: int | None = None) -> tuple[int, str] | None:
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


_SERIES_ORIGINS: dict[frozenset[str], tuple[str, str]] = {
    frozenset({"see_memory_usage"}): ("DeepSpeed see_memory_usage", "DeepSpeed printed it"),
    frozenset({"capture"}): ("oomlens capture", "oomlens capture recorded it"),
    frozenset({"see_memory_usage", "capture"}): (
        "DeepSpeed see_memory_usage and oomlens capture",
        "DeepSpeed printed it and oomlens capture recorded it",
    ),
}
"""The chart's source in its title and caption, by the origins of the series shown."""


def series_chart(report: Report, cuts: list[str]) -> LineChart | None:
    """Memory over time from the logs' ``see_memory_usage`` series; a series of one sample is
    no curve, so none is drawn from it."""
    series = [s for s in report.facts.memory_series() if len(s.samples) >= MIN_SERIES_SAMPLES]
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
    source, how = _SERIES_ORIGINS.get(
        frozenset(s.origin for s in shown), _SERIES_ORIGINS[frozenset({"see_memory_usage"})]
    )
    return _line_chart(
        "chart-memory",
        f"Memory over time ({source})",
        f"Allocated (MA, solid) and reserved (CA, dashed) GPU memory per rank, as {how}; "
        "the red line is the limit the OOM message reported.",
        lines,
        x_label,
        x_format,
        oom_limit(report, rank),
        (),
        summaries,
        "; ".join(notes),
    )


def _series_name(s: MemorySeries) -> str:
    name = "the log (no rank printed)" if s.rank is None else f"rank {s.rank}"
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
        oom_limit(report, snapshot.source.rank),
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
                    f"{words.count(segment.blocks, 'block')}, {format_size(segment.free_bytes)} "
                    "free (largest "
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
            f"Reserved {format_size(state.reserved_bytes)} in "
            f"{words.count(state.segments, 'segment')} ({words.count(state.blocks, 'block')}, "
            f"{state.live_blocks:,} live). Free space inside a segment "
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
            f"{words.count(site.blocks, 'block')}; {site.common_size_blocks:,} of "
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
            f"{words.count(c.blocks, 'block')}; {c.confidence.value} confidence: "
            f"{text(c.evidence, 400)}",
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


def snapshot_views(report: Report, cuts: list[str]) -> tuple[SnapshotView, ...]:
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
                where=where(snapshot.source),
                history=words.HISTORY_WORDS.get(snapshot.history, snapshot.history.value),
                stacks=words.STACK_WORDS.get(snapshot.stacks, snapshot.stacks.value),
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
