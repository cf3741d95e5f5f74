"""The Markdown report (``--format markdown``): the HTML report's content without charts, for
ticket bodies in GitHub or Jira.

Rendered from ``templates/markdown/`` over the same view model as the HTML report
(``oomlens.render.view``), one partial per section.  Every value from the inputs goes through
the ``md`` (inline) or ``code`` (fenced block) filter (see ``oomlens.render.templates``).  The
per-rule text (how to read the evidence, how to tell the fix worked, the explanation of ids that
are not rules) is the same text the HTML report shows: the plain-text blocks of
``templates/rules/<id>.html``.
"""

from __future__ import annotations

from functools import lru_cache

from oomlens.render.templates import environment
from oomlens.render.view import View, build_view
from oomlens.report import Report

RULE_BASE = "rules/_rule.html"
RULE_TEXT_BLOCKS = ("explanation", "reading", "verify")


@lru_cache(maxsize=128)
def rule_text(partial: str, block: str) -> str:
    """The plain text of ``block`` in the rule partial ``partial`` (or in the base layout when
    the partial does not override it), whitespace collapsed; '' when neither defines it.

    These blocks hold trusted prose and no variables, so the text is the same in every format.
    """
    if block not in RULE_TEXT_BLOCKS:
        raise ValueError(f"{block!r} is not a rule text block")
    env = environment("html")
    for name in (partial, RULE_BASE):
        template = env.get_template(name)
        render = template.blocks.get(block)
        if render is not None:
            return " ".join("".join(render(template.new_context({}))).split())
    return ""


def render_view_markdown(view: View) -> str:
    env = environment("markdown")
    return env.get_template("markdown/report.md.j2").render(v=view, rule_text=rule_text)


def render_markdown(report: Report, *, redacted: bool = False) -> str:
    return render_view_markdown(build_view(report, redacted=redacted))
