"""The Markdown report (``--format markdown``): the HTML report's content without charts, for
ticket bodies in GitHub or Jira.  Rendered from ``templates/markdown/`` with Markdown escaping
(see ``oomlens.render.templates``)."""

from __future__ import annotations

from oomlens.render.templates import environment
from oomlens.report import SCHEMA_VERSION, Report

MAX_CONFIG_ROWS = 40
MAX_OOM_ROWS = 16


def render_markdown(report: Report) -> str:
    facts = report.facts
    picture = facts.ranks
    config_values = []
    if facts.config is not None:
        effective = facts.config.reading.effective
        config_values = [v for v in effective.all_values() if v.is_explicit][:MAX_CONFIG_ROWS]
    template = environment("markdown").get_template("markdown/report.md.j2")
    return template.render(
        report=report,
        schema_version=SCHEMA_VERSION,
        verdict_title=report.verdict.value.replace("_", " ").upper(),
        first_failed=picture.first_failed,
        basis=picture.basis,
        victims=[str(r) for r in picture.peer_victims if r is not None],
        ranks=picture.ranks,
        oom_events=facts.oom_events()[:MAX_OOM_ROWS],
        config=facts.config,
        config_values=config_values,
    )
