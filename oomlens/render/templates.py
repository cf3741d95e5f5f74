"""Jinja2 environments for the reports, loading the top-level ``templates/`` folder (shipped in
the wheel as ``oomlens/templates``).

Every environment has autoescape on: every log line, config value and stack frame is untrusted
text.  Markdown needs its own escaping (HTML escaping would show ``&lt;`` inside code spans), so
the Markdown environment's filters ``md`` (inline text) and ``code`` (fenced blocks) return text
already made safe for Markdown, marked safe so autoescape does not escape it a second time; the
HTML environment's ``breakable`` escapes its text itself and adds only ``<wbr>`` tags.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from oomlens.render.text import clean
from oomlens.units import format_size

# Enough to neutralise emphasis, code, links, images, autolinks, HTML, tables and entities
# inside a line, and headings and block quotes at its start.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]#|<>~&])")
# What else starts a block when a line begins with it (a template puts a value at a line's
# start: a summary, a note, a snapshot's file): a list item ("- x", "+ x", "1. x", "1) x"), a
# thematic break or a setext underline (a text of only - or =).  At the text's start only.
_MD_LINE_START = re.compile(r"^(?:[-+](?=\s|$)|\d{1,9}(?=[.)](?:\s|$))|[-=](?=[-= ]*$))")


def template_dir() -> Path:
    """``oomlens/templates`` when installed from a wheel, else the checkout's ``templates/``.

    Found from this file's location, not through ``importlib.resources`` (whose lazy imports
    fail in a process that dropped to a user who cannot read the Python installation, as the
    SLURM Epilog's worker does).
    """
    package = Path(__file__).resolve().parents[1]
    packaged = package / "templates"
    if packaged.is_dir():
        return packaged
    return package.parent / "templates"


@lru_cache(maxsize=1)
def rule_partials() -> frozenset[str]:
    """The diagnosis ids that have a partial ``templates/rules/<id>.html``."""
    folder = template_dir() / "rules"
    return frozenset(p.stem for p in folder.glob("*.html") if not p.name.startswith("_"))


def md_inline(value: object) -> Markup:
    """Untrusted text for Markdown prose: one line, every Markdown/HTML metacharacter escaped."""
    text = _MD_SPECIAL.sub(r"\\\1", " ".join(clean(str(value)).split()))
    text = _MD_LINE_START.sub(_escape_line_start, text)
    # The text is fully escaped for Markdown here; Markup only stops a second, HTML escaping.
    return Markup(text)  # noqa: S704


def _escape_line_start(match: re.Match[str]) -> str:
    marker = match.group()
    # "1." is a list item only with its dot: escape the dot (``1\.``), which the match excludes
    return "\\" + marker if not marker[0].isdigit() else marker + "\\"


def md_span(value: object) -> Markup:
    """Untrusted text (a ``file:line`` locator) as one inline code span on one line: fenced
    by a backtick run longer than any in the text, so that nothing inside closes it, and
    nothing escaped inside (a code span shows its text as written, ``<`` and ``&`` included).
    For prose and list items, not table cells (GFM splits a cell at a ``|`` even in a span)."""
    text = " ".join(clean(str(value)).split())
    if not text:
        return Markup("")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    # a span that starts or ends with a backtick needs a space inside its fence (CommonMark
    # strips one from each side)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return Markup(f"{fence}{pad}{text}{pad}{fence}")  # noqa: S704


def md_code(value: object, language: str = "") -> Markup:
    """Untrusted text as a fenced code block whose fence cannot be closed from inside."""
    text = clean(str(value)).replace("\r", "")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return Markup(f"{fence}{language}\n{text}\n{fence}")  # noqa: S704


def breakable(value: object) -> Markup:
    """Text (a path, a ``file:line`` locator, a sentence holding one) that may wrap after each
    ``/``: escaped first, then a ``<wbr>`` put after every slash, so that a narrow window
    breaks a path between its folders and keeps ``name:line`` whole where it fits."""
    escaped = str(escape(str(value)))  # escaping makes no slash: its entities have none
    return Markup(escaped.replace("/", "/<wbr>"))  # noqa: S704


def _size(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_size(value)
    return "unknown"


def _percent(value: object) -> str:
    return f"{float(value):.0%}" if isinstance(value, int | float) else "?"


def _to_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str)


@lru_cache(maxsize=2)
def environment(kind: str) -> Environment:
    """The ``html`` or ``markdown`` environment."""
    env = Environment(
        loader=FileSystemLoader(str(template_dir())),
        autoescape=True,
        # templates never change under a running process; not checking their files again lets
        # a process that loaded them keep rendering after it lost the right to read them
        auto_reload=False,
        cache_size=-1,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["size"] = _size
    env.filters["percent"] = _percent
    env.filters["to_json"] = _to_json
    if kind == "html":
        env.filters["breakable"] = breakable
    if kind == "markdown":
        env.filters["md"] = md_inline
        env.filters["code"] = md_code
        env.filters["span"] = md_span
    return env
