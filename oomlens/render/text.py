"""The terminal summary: verdict, the top diagnoses with their key evidence, the fix.

Short by design (a screenful); the JSON, Markdown and HTML reports carry everything.  Colour
only when asked (the CLI asks on a tty).  Untrusted text (log lines) is printed with control
characters removed, so a hostile log cannot drive the terminal.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, ClassVar

import click

from oomlens.render import words
from oomlens.render.check_text import check_text
from oomlens.render.registry import Format, Renderer, RenderOptions
from oomlens.render.whatif import whatif_text
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


def clean(text: str) -> str:
    """Untrusted text made safe for a terminal: control and bidi characters removed."""
    return strip_controls(text)


def _fix_lines(fix: Fix) -> list[str]:
    lines = [f"    fix: {clean(fix.summary)}"]
    if fix.config_patch is not None:
        lines.append(f"         ds_config patch: {clean(json.dumps(fix.config_patch))}")
    for name, value in fix.environment.items():
        lines.append(f"         environment: {clean(name)}={clean(value)}")
    if fix.command:
        lines.append(f"         command: {clean(fix.command)}")
    details = []
    if fix.predicted_saving_bytes:
        details.append(f"saves ~{format_size(fix.predicted_saving_bytes)}")
    if fix.cost:
        details.append(f"cost: {clean(fix.cost)}")
    if details:
        lines.append("         " + "; ".join(details))
    return lines


def _diagnosis_lines(index: int, d: Diagnosis, style: bool) -> list[str]:
    head = f"{index}. {d.title} [{d.id}] confidence {d.confidence:.0%}, severity {d.severity.label}"
    if d.rank is not None:
        head += f", rank {d.rank}"
    lines = [click.style(head, bold=True) if style else head, f"    {clean(d.summary)}"]
    for item in d.evidence[:SHOWN_EVIDENCE]:
        cited = clean(item.source.describe()) if item.source else ""
        # Config values cite their own line ("... (user at ds_config.json:14)"): once is enough.
        where = f" ({cited})" if cited and cited.split(" (")[0] not in item.text else ""
        mark = "+" if item.supports else "-"
        lines.append(f"    {mark} {clean(item.text)}{where}")
    if len(d.evidence) > SHOWN_EVIDENCE:
        lines.append(f"    ... {len(d.evidence) - SHOWN_EVIDENCE} more in the full report")
    for fix in d.fixes[:1]:
        lines.extend(_fix_lines(fix))
    return lines


def render_text(report: Report, *, colour: bool = False) -> str:
    verdict = report.verdict
    title = f"oomlens: {verdict.value.replace('_', ' ').upper()}"
    lines = [
        click.style(title, fg=_VERDICT_COLOUR[verdict], bold=True) if colour else title,
        f"  {clean(report.verdict_reason)}",
    ]
    first = words.first_failure(report.facts.ranks)
    if first is not None:
        lines.append(f"  first failure: {first[0]} ({first[1]})")
    victims = [str(r) for r in report.facts.ranks.peer_victims]
    if victims:
        lines.append(f"  died because a peer did: rank(s) {', '.join(victims)}")
    lines.append("")
    causes = list(report.diagnoses[:SHOWN_DIAGNOSES])
    if not causes:
        lines.append("No diagnosis: nothing in the inputs points at a cause.")
    for index, d in enumerate(causes, 1):
        lines.extend(_diagnosis_lines(index, d, colour))
        lines.append("")
    if len(report.diagnoses) > SHOWN_DIAGNOSES:
        others = ", ".join(
            f"{d.id} ({d.confidence:.0%})" for d in report.diagnoses[SHOWN_DIAGNOSES:]
        )
        lines.append(f"Also considered: {others}")
    if report.missing:
        lines.append("To capture next time:")
        lines.extend(f"  - {clean(m)}" for m in report.missing)
    problems = [i for i in report.facts.inputs if i.problem]
    if problems:
        lines.append("Inputs that could not be used:")
        lines.extend(f"  - {clean(i.problem or '')}" for i in problems)
    return "\n".join(lines).rstrip() + "\n"


class TextRenderer(Renderer):
    format: ClassVar[Format] = Format.TEXT

    def render(self, document: Document, options: RenderOptions) -> str:
        if isinstance(document, CheckReport):
            # a config's keys and values are untrusted text, printed in many places
            return clean(check_text(document)) + "\n"
        if isinstance(document, WhatIfReport):
            return whatif_text(document)
        return render_text(document, colour=options.colour)


RENDERER = TextRenderer()
