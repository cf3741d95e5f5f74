"""The HTML report (``--html FILE``, ``--format html``, ``-o report.html``): one self-contained
page for the person who did not run the job.

Rendered from ``templates/html/`` (a base layout, one partial per section) and
``templates/rules/<id>.html`` (one partial per diagnosis id) over the view model of
``oomlens.render.view``.  Autoescape is on everywhere; nothing from the inputs is marked safe.

The page carries a Content-Security-Policy that allows no source of any kind except its own
inline stylesheet and script, each by its SHA-256 hash: no request can leave the file, and
no script can run but the page's own few lines, even if some text escaped escaping.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from oomlens.render.registry import Format, Renderer, RenderOptions
from oomlens.render.templates import environment, rule_partials
from oomlens.render.view import View, build_view
from oomlens.report import Report

if TYPE_CHECKING:
    from oomlens.render.registry import Document

STYLE_TEMPLATE = "html/style.css"
SCRIPT_TEMPLATE = "html/script.js"
REPORT_TEMPLATE = "html/report.html"
MAX_REPORT_BYTES = 2 * 1024 * 1024
"""The size the report is designed to stay under for any input (lists and series are capped)."""


def _sha256(text: str) -> str:
    return (
        "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"
    )


@lru_cache(maxsize=1)
def content_security_policy() -> str:
    """The policy: nothing but this page's own style and script, by hash."""
    env = environment("html")
    style = env.get_template(STYLE_TEMPLATE).render()
    script = env.get_template(SCRIPT_TEMPLATE).render()
    return (
        "default-src 'none'; "
        f"style-src {_sha256(style)}; "
        f"script-src {_sha256(script)}; "
        "img-src 'none'; font-src 'none'; connect-src 'none'; media-src 'none'; "
        "object-src 'none'; frame-src 'none'; child-src 'none'; worker-src 'none'; "
        "manifest-src 'none'; base-uri 'none'; form-action 'none'"
    )


def render_view_html(view: View) -> str:
    return (
        environment("html")
        .get_template(REPORT_TEMPLATE)
        .render(v=view, csp=content_security_policy())
    )


def render_html(report: Report, *, redacted: bool = False) -> str:
    """The report as one HTML page (see the module docstring)."""
    return render_view_html(build_view(report, redacted=redacted))


class HtmlRenderer(Renderer):
    format: ClassVar[Format] = Format.HTML

    def render(self, document: Document, options: RenderOptions) -> str:
        assert isinstance(document, Report)  # the registry sends only reports
        return render_view_html(build_view(document, redacted=options.redacted))


RENDERER = HtmlRenderer()


def load_templates() -> None:
    """Compile every template the HTML and Markdown reports use, and the page's policy.

    Called on import: a process that imports this module and then drops to a user who cannot
    read the installation (the SLURM Epilog's worker) still renders from the compiled templates
    (the environments never re-read a template they hold).
    """
    html = environment("html")
    for name in html.list_templates(filter_func=lambda n: n.startswith(("html/", "rules/"))):
        html.get_template(name)
    markdown = environment("markdown")
    for name in markdown.list_templates(filter_func=lambda n: n.startswith("markdown/")):
        markdown.get_template(name)
    rule_partials()
    content_security_policy()


load_templates()
