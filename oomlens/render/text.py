"""The terminal summary: verdict, the top diagnoses with their key evidence, the fix.

Short by design (a screenful); the JSON, Markdown and HTML reports carry everything.  Colour
and wrapping to a width (``wrap``) only when asked (the CLI asks on a tty).  Untrusted text
(log lines) is printed with control characters removed, so a hostile log cannot drive the
terminal.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, ClassVar

import click

from oomlens.render import words
from oomlens.render.account_view import AccountView, account_view
from oomlens.render.check_text import check_text
from oomlens.render.registry import Format, Renderer, RenderOptions
from oomlens.render.whatif import whatif_text
from oomlens.render.wrap import Wrapped, json_members
from oomlens.report import CheckReport, Diagnosis, Fix, Report, Verdict, WhatIfReport
from oomlens.units import format_size
from oomlens.untrusted import strip_controls

if TYPE_CHECKING:
    from oomlens.render.registry import Document

_VERDICT_COLOUR = {
    Verdict.GPU_OOM: "red",
    Verdict.HOST_OOM: "red",
    Verdict.CONFIG_ERROR: "yellow",
    Verdict.OTHER_FAILURE: "yellow",
    Verdict.NO_FAILURE: "green",
    Verdict.UNKNOWN: "white",
}
SHOWN_DIAGNOSES = 3
SHOWN_EVIDENCE = 4
FULL_REPORT = "--format markdown, or -o report.html"
"""How to get the full report, which lists what the summary leaves out (``oomlens analyze``'s
options: every other format is the full report)."""


def clean(text: str) -> str:
    """Untrusted text made safe for a terminal: control and bidi characters removed."""
    return strip_controls(text)


# An allocator's out-of-memory message, up to the size it asked for: on a terminal the rest
# (capacity, free, allocated, reserved: four lines when wrapped, in every diagnosis that cites
# it) is left to the line cited and to the full reports, which quote the message whole.
_OOM_REQUEST = re.compile(r"^(.*\bout of memory\. Tried to allocate [\d.]+ [KMGTP]?i?B)\.? .+$")


def short_quote(text: str) -> str:
    """An allocator's OOM message quoted up to its request, "…" after: the terminal's
    form (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 24.00 MiB. …``)."""
    match = _OOM_REQUEST.match(text)
    return f"{match.group(1)}. …" if match else text


def _fix_lines(fix: Fix, out: Wrapped) -> None:
    out.add(f"    fix: {clean(fix.summary)}", hang=9)
    if fix.config_patch is not None:
        patch = clean(json.dumps(fix.config_patch))
        out.add(f"         ds_config patch: {patch}", hang=26, keep=json_members(patch))
    for name, value in fix.environment.items():
        out.add(f"         environment: {clean(name)}={clean(value)}", hang=22)
    if fix.command:
        out.add(f"         command: {clean(fix.command)}", hang=18)
    if fix.arguments and not fix.command:  # the command already says them
        out.add(f"         arguments: {clean(words.arguments(fix.arguments))}", hang=20)
    details = []
    if fix.predicted_peak_bytes is not None:
        details.append(f"predicted peak {format_size(fix.predicted_peak_bytes)}")
    if fix.predicted_saving_bytes:
        details.append(f"saves ~{format_size(fix.predicted_saving_bytes)}")
    if fix.cost:
        details.append(f"cost: {clean(fix.cost)}")
    if details:
        out.add("         " + "; ".join(details), hang=11)


def _diagnosis_lines(index: int, d: Diagnosis, style: bool, out: Wrapped) -> None:
    head = f"{index}. {d.title} [{d.id}] confidence {d.confidence:.0%}, severity {d.severity.label}"
    if d.rank is not None:
        head += f", rank {d.rank}"
    out.add(head, hang=len(f"{index}. "), style=_bold if style else None)
    out.add(f"    {clean(d.summary)}", hang=4)
    for item in d.evidence[:SHOWN_EVIDENCE]:
        cited = clean(item.source.describe()) if item.source else ""
        # Config values cite their own line ("... (user at ds_config.json:14)"): once is enough.
        where = f" ({cited})" if cited and cited.split(" (")[0] not in item.text else ""
        mark = "+" if item.supports else "-"
        text = clean(item.text)
        if out.width:
            text = short_quote(text)
        out.add(f"    {mark} {text}{where}", hang=6, keep=[where.strip()] if where else ())
    if len(d.evidence) > SHOWN_EVIDENCE:
        more = len(d.evidence) - SHOWN_EVIDENCE
        out.add(f"    ... {more} more in the full report ({FULL_REPORT})", hang=8)
    for fix in d.fixes[:1]:
        _fix_lines(fix, out)


def _account_lines(view: AccountView, out: Wrapped) -> None:
    """The memory account: a heading with what was needed against the limit, then one line
    per term (words, bytes, range, how known: where from)."""
    head = f"Memory account ({view.heading})" if view.heading else "Memory account"
    against = []
    if view.needed:
        against.append(f"{view.needed} needed")
    if view.limit:
        against.append(f"{view.limit} {view.limit_name}")
    out.add(head + (": " + ", ".join(against) if against else ""), hang=2)
    rows = [*view.rows, *([view.at_peak] if view.at_peak is not None else [])]
    label_width = max(len(r.label) for r in rows)
    range_width = max(len(r.range) for r in rows)
    previous = None
    for row in rows:
        source = "(as above)" if row.source == previous else row.source
        previous = row.source
        note = f"; {row.note}" if row.note else ""
        ranged = f"  {row.range:<{range_width}}" if range_width else ""
        line = f"  {row.label:<{label_width}}  {row.bytes:>10}{ranged}  {row.basis}: {source}{note}"
        out.add(line, hang=4)


def _bold(text: str) -> str:
    return click.style(text, bold=True)


def render_text(report: Report, *, colour: bool = False, width: int = 0) -> str:
    """The terminal summary; ``width`` > 0 wraps it to that many columns (``wrap.wrap``)."""
    verdict = report.verdict
    title = f"oomlens: {verdict.value.replace('_', ' ').upper()}"
    out = Wrapped(width)
    out.add(
        title,
        style=(lambda line: click.style(line, fg=_VERDICT_COLOUR[verdict], bold=True))
        if colour
        else None,
    )
    out.add(f"  {clean(report.verdict_reason)}", hang=4)
    first = words.first_failure(report.facts.ranks)
    if first is not None:
        out.add(f"  first failure: {first[0]} ({first[1]})", hang=4)
    victims = [str(r) for r in report.facts.ranks.peer_victims]
    if victims:
        out.add(f"  died because a peer did: rank(s) {', '.join(victims)}", hang=4)
    out.add("")
    causes = list(report.diagnoses[:SHOWN_DIAGNOSES])
    if not causes:
        out.add("No diagnosis: nothing in the inputs points at a cause.")
    for index, d in enumerate(causes, 1):
        _diagnosis_lines(index, d, colour, out)
        out.add("")
    if len(report.diagnoses) > SHOWN_DIAGNOSES:
        others = ", ".join(
            f"{d.id} ({d.confidence:.0%})" for d in report.diagnoses[SHOWN_DIAGNOSES:]
        )
        out.add(f"Also considered: {others}", hang=2)
    account = account_view(report.facts.account)
    if account is not None:
        _account_lines(account, out)
        out.add("")
    if report.missing:
        out.add("To capture next time:")
        for m in report.missing:
            out.add(f"  - {clean(m)}", hang=4)
    problems = [i for i in report.facts.inputs if i.problem]
    if problems:
        out.add("Inputs that could not be used:")
        for i in problems:
            out.add(f"  - {clean(i.problem or '')}", hang=4)
    return out.text().rstrip() + "\n"


class TextRenderer(Renderer):
    format: ClassVar[Format] = Format.TEXT

    def render(self, document: Document, options: RenderOptions) -> str:
        if isinstance(document, CheckReport):
            # a config's keys and values are untrusted text, printed in many places
            return clean(check_text(document, width=options.width)) + "\n"
        if isinstance(document, WhatIfReport):
            return whatif_text(document, width=options.width)
        return render_text(document, colour=options.colour, width=options.width)


RENDERER = TextRenderer()
