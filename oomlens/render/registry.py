"""The one place that picks a renderer: the output formats, and which renderer makes each.

Every renderer has one signature, ``Renderer.render(document, options) -> str``, where the
document is an analysis ``Report``, ``oomlens check``'s ``CheckReport`` or ``oomlens whatif``'s
``WhatIfReport``; each renderer module defines ``RENDERER``, and ``_MODULES`` here says which
documents each format has.  The commands (``analyze``, ``check``, ``whatif``), the SLURM epilog
and ``triage`` all render through ``render`` here.
Renderer modules are imported when first used: a command that renders nothing loads none.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from oomlens.errors import UsageError
from oomlens.untrusted import without_surrogates

if TYPE_CHECKING:
    from oomlens.report import CheckReport, Report, WhatIfReport

    Document = Report | CheckReport | WhatIfReport


class Format(StrEnum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    HTML = "html"

    @classmethod
    def choose(cls, fmt: str | None, output: str | None) -> Format:
        """``--format`` wins; else the output file's extension; else text."""
        if fmt is not None:
            return cls(fmt)
        if output is None:
            return cls.TEXT
        suffix = Path(output).suffix.lower()
        for candidate, suffixes in _EXTENSIONS.items():
            if suffix in suffixes:
                return candidate
        known = ", ".join(s for suffixes in _EXTENSIONS.values() for s in suffixes[:1])
        raise UsageError(
            f"{output}: cannot tell the format from the extension {suffix or '(none)'}; "
            f"use {known}, or pass --format"
        )


_EXTENSIONS: Mapping[Format, tuple[str, ...]] = {
    Format.HTML: (".html", ".htm"),
    Format.JSON: (".json",),
    Format.MARKDOWN: (".md", ".markdown"),
    Format.TEXT: (".txt", ".text"),
}
_MODULES: Mapping[Format, tuple[str, frozenset[str]]] = {
    Format.TEXT: ("oomlens.render.text", frozenset({"report", "check", "whatif"})),
    Format.JSON: ("oomlens.render.json", frozenset({"report", "check", "whatif"})),
    Format.MARKDOWN: ("oomlens.render.markdown", frozenset({"report"})),
    Format.HTML: ("oomlens.render.html", frozenset({"report"})),
}
"""Each format's renderer module and the documents (``Report.document``) it renders."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    colour: bool = False
    """Terminal colours (the text renderer, on a terminal)."""
    redacted: bool = False
    """The report went through ``--redact``: renderers that say so, say so."""
    width: int = 0
    """Wrap the text renderer's lines to this many columns, with a hanging indent, and quote
    an allocator's out-of-memory message only up to its request (on a terminal); 0: one line
    per item, as written (a pipe, a file)."""


class Renderer(ABC):
    """Makes one format of a report."""

    format: ClassVar[Format]

    @abstractmethod
    def render(self, document: Document, options: RenderOptions) -> str:
        """``document`` in this renderer's format."""


def formats_for(document: str) -> tuple[Format, ...]:
    """The formats a document (``"report"``, ``"check"``, ``"whatif"``) can be rendered in."""
    return tuple(fmt for fmt, (_, documents) in _MODULES.items() if document in documents)


def available(fmt: Format) -> bool:
    """Whether this oomlens has the renderer of ``fmt`` (an older one may lack HTML)."""
    return importlib.util.find_spec(_MODULES[fmt][0]) is not None


def renderer(fmt: Format) -> Renderer:
    module = importlib.import_module(_MODULES[fmt][0])
    made: Renderer = module.RENDERER
    return made


def render(document: Document, fmt: Format, options: RenderOptions | None = None) -> str:
    """``document`` in ``fmt``: text that UTF-8 encodes, whatever the inputs held (a file name
    that is not UTF-8, a config's lone ``"\\ud800"``: see ``without_surrogates``).  Raises
    ``UsageError`` when no renderer makes that format of that document (``oomlens check
    --format html``)."""
    if document.document not in _MODULES[fmt][1]:
        choices = ", ".join(formats_for(document.document))
        raise UsageError(f"--format {fmt} is not available for {document.document}: use {choices}")
    # The JSON renderer escapes them in its strings (an escape put in the finished document
    # would be a JSON escape it does not mean); this pass is the other formats'.
    return without_surrogates(renderer(fmt).render(document, options or RenderOptions()))
