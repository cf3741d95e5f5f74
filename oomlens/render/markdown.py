"""The Markdown report (``--format markdown``): the HTML report's content without charts, for
ticket bodies in GitHub or Jira.

Rendered from ``templates/markdown/`` over the same view model as the HTML report
(``oomlens.render.view``), one partial per section.  Every value from the inputs goes through
the ``md`` (inline) or ``code`` (fenced block) filter (see ``oomlens.render.templates``).  The
per-rule text (its explanation, how to read the evidence, how to tell the fix worked) is the
text the HTML report shows, declared with the rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from oomlens.render.registry import Format, Renderer, RenderOptions
from oomlens.render.templates import environment
from oomlens.render.view import View, build_view
from oomlens.report import Report

if TYPE_CHECKING:
    from oomlens.render.registry import Document


def render_view_markdown(view: View) -> str:
    env = environment("markdown")
    return env.get_template("markdown/report.md.j2").render(v=view)


def render_markdown(report: Report, *, redacted: bool = False) -> str:
    return render_view_markdown(build_view(report, redacted=redacted))


class MarkdownRenderer(Renderer):
    format: ClassVar[Format] = Format.MARKDOWN

    def render(self, document: Document, options: RenderOptions) -> str:
        assert isinstance(document, Report)  # the registry sends only reports
        return render_view_markdown(build_view(document, redacted=options.redacted))


RENDERER = MarkdownRenderer()
