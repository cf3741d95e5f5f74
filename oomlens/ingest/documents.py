"""Text files that are not logs: a Markdown document, a TOML or INI file, Python source, a CSV
table.  People hand oomlens such files by mistake (the project's README, a ``pyproject.toml``,
the training script instead of its output); an example error quoted in prose must not be read
as a crash.

``document_kind(lines)`` looks at the first non-blank lines of a file and names what it is, or
returns None.  A file with the structure of a log (a traceback, logger records, launcher
prefixes, progress bars) is never a document, whatever else it holds: a paste of an issue's
log keeps its Markdown around it sometimes, and is still a log.
"""

from __future__ import annotations

import regex

_LOG_LINE = regex.compile(
    r"\s{0,4}(?:\[?(?:rank|default)\d{1,6}\]?:|Traceback \(most recent call last\)|"
    r'File "[^"]{1,500}", line \d|'
    r"\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|\[?[IWEF]\d{4} \d\d:\d\d:\d\d|"
    r"[\w.-]{1,64}:\d{1,10}:\d{1,10} \[\d{1,3}\] NCCL|"
    r"[\w.]{1,200}(?:Error|Exception): |"
    r".{0,80}\d{1,3}%\|.{0,200}\| ?\d{1,9}/\d{1,9}|"
    r"(?:INFO|WARNING|ERROR|DEBUG)[: ]|"
    r"[│╭╰❱])"
)
_HEADING = regex.compile(r"#{1,6} \S")
_FENCE = regex.compile(r"\s{0,3}(?:`{3,}|~{3,})")
_MARKDOWN = regex.compile(
    r"#{1,6} \S|\s{0,3}(?:[-*+]|\d{1,3}\.) \S|\|.{0,2000}\|\s{0,8}\Z|"
    r".{0,2000}\]\([^)\s]{1,500}\)|\s{0,3}>\s"
)
_WORD = regex.compile(r"(?<![\w/.])[A-Za-z][a-z'’-]{1,30}(?![\w/])")
_TOML_SECTION = regex.compile(r"\s{0,4}\[\[?[\w.\"' -]{1,200}\]\]?\s{0,8}(?:#.{0,500})?\Z")
_TOML_ENTRY = regex.compile(r"\s{0,8}[\w.\"'-]{1,200}\s{0,8}=\s{0,8}\S|\s{0,8}#|\s{0,8}[\]}\"'\d]")
_PY_TOP = regex.compile(
    r"(?:def |async def |class |import |from [\w.]{1,200} import |@[\w.]{1,200}|"
    r"if __name__ ==|\"\"\"|[A-Z_][A-Z0-9_]{1,60} ?(?::[^=]{1,200})?= )"
)
_PY_BODY = regex.compile(r"(?: {4}|\t){1,20}\s{0,3}\S|\s{0,8}#|\s{0,8}[)\]}]")


def document_kind(lines: list[str]) -> str | None:
    """What kind of document ``lines`` (the first non-blank lines of a file) are, in words
    (``a Markdown document``...), or None when they may be a log."""
    if len(lines) < 3:
        return None
    logged = sum(1 for line in lines if _LOG_LINE.match(line))
    if logged > max(1, len(lines) // 20):
        return None
    if _toml(lines):
        return "a TOML/INI file"
    if _python(lines):
        return "Python source code"
    if _csv(lines):
        return "a CSV table"
    if _markdown(lines):
        return "a Markdown document"
    return None


def _markdown(lines: list[str]) -> bool:
    """Headings, and outside its code blocks mostly prose and Markdown's own marks."""
    headings = 0
    outside: list[str] = []
    fenced = False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            outside.append(line)
            headings += _HEADING.match(line) is not None
    if headings < 2 or not outside:
        return False
    marked = sum(
        1 for line in outside if _MARKDOWN.match(line) or len(_WORD.findall(line[:400])) >= 4
    )
    return marked >= 0.7 * len(outside)


def _toml(lines: list[str]) -> bool:
    sections = sum(1 for line in lines if _TOML_SECTION.match(line))
    entries = sum(1 for line in lines if _TOML_ENTRY.match(line) or _TOML_SECTION.match(line))
    return sections >= 1 and entries >= 0.85 * len(lines)


def _python(lines: list[str]) -> bool:
    top = body = 0
    in_string = False
    for line in lines:
        quotes = line.count('"""') + line.count("'''")
        if in_string or quotes:
            body += 1  # a docstring's lines
            in_string = in_string != (quotes % 2 == 1)
        elif _PY_TOP.match(line):
            top += 1
        elif _PY_BODY.match(line):
            body += 1
    return top >= 3 and top + body >= 0.8 * len(lines)


def _csv(lines: list[str]) -> bool:
    commas = [line.count(",") for line in lines[:200]]
    if commas[0] < 1:
        return False
    same = sum(1 for c in commas if c == commas[0])
    return len(lines) >= 3 and same >= 0.9 * len(commas)
