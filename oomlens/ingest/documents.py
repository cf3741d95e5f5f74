"""Text files that are not logs: an HTML page, an XML file (a JUnit test report), Python source,
a shell or batch script, a JSON array, a CSV/TSV table, a Markdown document, a TOML or INI
file.  People hand oomlens such files by mistake (the project's README, a saved issue page, a
test report, the training script instead of its output), and run directories hold them (a
dataset of issues, notes): an error quoted in one must not be read as a crash.

``document(text, whole=...)`` looks at a file's head and names what it is, or returns None.
Recognition is by each format's own structure, whatever the file quotes:

* markup: the root element (``<!DOCTYPE html>``/``<html>``; ``<testsuites>``/``<testsuite>``
  after an optional ``<?xml ...?>`` declaration and comments);
* Python: the head parses (``ast``) and defines or imports something at module level, or is
  a module of assignments and strings with a docstring or a multi-line string (a test's
  fixture messages); a head the reading cut is tokenized (``tokenize``: a string or bracket
  may span lines, and a line inside a string starts no statement) and parsed up to a
  module-level statement the cut did not reach; its comments are ``quoted`` (a reproduction
  snippet with its output in them);
* a script: a shell shebang (``#!/bin/bash``, ``#!/usr/bin/env sh``...) and shell syntax with
  no more log lines than a script's ``echo`` could print;
* JSON: an array whose elements decode (``[{...}, ...``);
* CSV/TSV: a header of column names (``csv`` module's quoting: a quoted field may hold commas
  and newlines) and the same number of fields in most records after it; a log whose lines
  carry commas has no header of names, or its "header" has the form of its other lines;
* Markdown: a fenced code block or headings, and prose or Markdown marks outside its code
  blocks; log lines outside the code blocks make it a log (a paste with prose around).  A code
  block that is not code (commands, Python, a config: a JSON object or array, not a quoted
  line) nor oomlens' own report is ``quoted``: a program's output; when it is a log (what
  ``oomlens.ingest.detect`` decides: log lines' forms, a text kind's markers, or what the log
  reader reads in it), or when the head read ends inside a code block, the document is a
  ticket's paste when the user names it, notes when found in a run directory;
* oomlens' own text or Markdown report (its evidence quotes the errors it read);
* TOML/INI and Python that does not parse: by the form of their lines, only when the file has
  (almost) no log lines; the lines of a TOML multi-line string (``'''``/``\"\"\"`` opened by a
  key's value) are that value, whatever they hold.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import tokenize
import tomllib
import warnings
from dataclasses import dataclass
from itertools import islice

import regex

_LOG_LINE = regex.compile(
    r"\s{0,4}(?:\[?(?:rank|default)\d{1,6}\]?:|Traceback \(most recent call last\)|"
    r'File "[^"]{1,500}", line \d|File [^\s,]{1,500}:\d{1,9}, in |\[enforce fail at |'
    r"\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|\[?[IWEF]\d{4} \d\d:\d\d:\d\d|"
    r"[\w.-]{1,64}:\d{1,10}:\d{1,10} \[\d{1,3}\] NCCL|"
    r"[\w.]{1,200}(?:Error|Exception): |"
    r".{0,80}\d{1,3}%\|.{0,200}\| ?\d{1,9}/\d{1,9}|"
    r"(?:INFO|WARNING|ERROR|DEBUG)[: ]|"
    r"[│╭╰❱])"
)
_HEADING = regex.compile(r"#{1,6} \S")
_FENCE = regex.compile(r"\s{0,3}(?:`{3,}|~{3,})")
_INDENTED = regex.compile(r"(?: {4}|\t)")
_MARKDOWN = regex.compile(
    r"#{1,6} \S|\s{0,3}(?:[-*+]|\d{1,3}\.) \S|\|.{0,2000}\|\s{0,8}\Z|"
    r".{0,2000}\]\([^)\s]{1,500}\)|\s{0,3}>\s|\s{0,3}(?:\*\*|__)\S"
)
_WORD = regex.compile(r"(?<![\w/.])[A-Za-z][a-z'’-]{1,30}(?![\w/])")
_TOML_SECTION = regex.compile(r"\s{0,4}\[\[?[\w.\"' -]{1,200}\]\]?\s{0,8}(?:#.{0,500})?\Z")
_TOML_ENTRY = regex.compile(r"\s{0,8}[\w.\"'-]{1,200}\s{0,8}=\s{0,8}\S|\s{0,8}#|\s{0,8}[\]}\"'\d]")
_PY_TOP = regex.compile(
    r"(?:def |async def |class |import |from [\w.]{1,200} import |@[\w.]{1,200}|"
    r"if __name__ ==|\"\"\"|[A-Z_][A-Z0-9_]{1,60} ?(?::[^=]{1,200})?= )"
)
_PY_BODY = regex.compile(r"(?: {4}|\t){1,20}\s{0,3}\S|\s{0,8}#|\s{0,8}[)\]}]")
_TOML_MULTILINE = regex.compile(r"\s{0,8}[\w.\"'-]{1,200}\s{0,8}=\s{0,8}(?P<quote>'''|\"\"\")")
"""A key whose value opens a TOML multi-line string."""

_MARKUP_ROOT = regex.compile(r"<(?P<name>[A-Za-z][\w.:-]{0,100})(?=[\s/>])")
_SHEBANG = regex.compile(
    r"#!\s{0,4}/[\w/.-]{0,200}?/(?:env\s{1,4}(?:-\S{1,20}\s{1,4}){0,3})?(?:ba|da|z|k|mk|a)?sh"
    r"(?:\s|\Z)"
)
_SHELL_LINE = regex.compile(
    r"\s{0,40}(?:#(?:SBATCH|PBS|BSUB|\$)\s|(?:export\s{1,8}|local\s{1,8}|readonly\s{1,8})?"
    r"[A-Za-z_]\w{0,100}=|(?:if|then|elif|else|fi|for|while|until|do|done|case|esac|function|"
    r"set|shift|source|exec|trap|exit|return)(?:\s|;|\Z)|\[\[? |\S.{0,2000}(?: \\|\$\{|\$\(|"
    r"\$[A-Za-z_]|&&|\|\|)\S{0,2000})"
)
"""Shell syntax: a scheduler directive, an assignment, a keyword, a test, a continued line, an
expansion or a command list."""
_HEADER_FIELD = regex.compile(r"[^\W\d][^\[\]{}:=<>\"]{0,63}")
"""A column name: starts with a letter, no brackets, colons, equals signs or quotes."""
_OOMLENS_REPORT = regex.compile(r"(?:# )?oomlens: [A-Z]{2,}(?: [A-Z]{2,}){0,3}(?::\s|\s*\Z)")
"""The first line of oomlens' own text or Markdown report (``oomlens: GPU OOM``)."""
_COLUMN_NAME = regex.compile(r"[^\W\d][\w.-]{0,63}")
_NAME_WORD = regex.compile(r"[A-Za-z]{2,}")
_MAX_RECORDS = 2000


@dataclass(frozen=True, slots=True)
class Document:
    """What a text file is, when it is no log."""

    what: str
    """In words: ``an HTML page``, ``a CSV table``..."""
    quoted: str = ""
    """What Markdown's code blocks that are not code (commands, Python, a config) nor oomlens'
    own report hold, or a Python snippet's comments: when it is a log (``quotes_log``, or a
    text input kind recognises it: ``oomlens.ingest.detect``), the document is a ticket's paste
    when the user names it, notes that quote one in a run directory."""

    fenced: bool = False
    """``quoted`` is code blocks of Markdown: text its author set apart as it was printed (a
    program's output), not a source's comments, which are prose about the code."""
    cut_in_block: bool = False
    """The head read ends inside a Markdown code block: what the block holds past it is
    unknown, so whether the document quotes a log is too."""

    @property
    def quotes_log_lines(self) -> bool:
        """A quoted line has a log line's form (a traceback frame, a logger's record...)."""
        return any(_LOG_LINE.match(line.lstrip()) for line in self.quoted.splitlines())


def document(text: str, *, whole: bool) -> Document | None:
    """What ``text`` (a file's head; ``whole`` when it is all of the file) is, when it is a
    document (see the module docstring), else None."""
    text = text.lstrip("\ufeff")
    if not whole:
        text = text[: text.rfind("\n") + 1]  # without the line the head may have cut
    markup = _markup(text)
    if markup is not None:
        return Document(markup)
    if _json_array(text, whole=whole):
        return Document("a JSON array")
    if _python_source(text, whole=whole):
        # a snippet with its output pasted into comments (an issue's reproduction)
        return Document("Python source code", quoted="\n".join(_comments(text)))
    every_line = text.splitlines()
    lines = [line for line in every_line if line.strip()]
    if lines and _OOMLENS_REPORT.match(lines[0]):
        return Document("a report of oomlens")
    if len(lines) == 2 and whole:
        table = _table(text, whole=whole)
        return Document(table) if table is not None else None
    if len(lines) < 3:
        return None
    script = _script(lines)
    if script is not None:
        return Document(script)
    table = _table(text, whole=whole)
    if table is not None:
        return Document(table)
    markdown = _markdown(every_line, whole=whole)
    if markdown is not None:
        return markdown
    head = lines[:400]
    if _toml(head):
        return Document("a TOML/INI file")
    logged = sum(1 for line in head if _LOG_LINE.match(line))
    if logged > max(1, len(head) // 20):
        return None
    if _python(head):
        return Document("Python source code")
    return None


def _markup(text: str) -> str | None:
    """``an HTML page`` or ``a JUnit XML test report`` (``an XML document``) by the root
    element, after the declarations and comments markup may open with."""
    rest = text.lstrip()
    declared = False
    for _ in range(50):
        low = rest[:16].lower()
        if low.startswith("<?xml"):
            end = rest.find("?>")
            if end < 0:
                return None
            declared, rest = True, rest[end + 2 :].lstrip()
        elif low.startswith("<!--"):
            end = rest.find("-->")
            if end < 0:
                return None
            rest = rest[end + 3 :].lstrip()
        elif low.startswith("<!doctype"):
            end = rest.find(">")
            if end < 0:
                return None
            if rest[9:end].lower().split()[:1] == ["html"]:
                return "an HTML page"
            declared, rest = True, rest[end + 1 :].lstrip()
        else:
            break
    match = _MARKUP_ROOT.match(rest)
    if match is None:
        return None
    name = match.group("name").lower()
    if name == "html":
        return "an HTML page"
    if name in ("testsuites", "testsuite"):
        return "a JUnit XML test report"
    return "an XML document" if declared else None


def _json_array(text: str, *, whole: bool) -> bool:
    """An array whose elements decode one by one up to its end or the head's."""
    body = text.lstrip()
    if not body.startswith("["):
        return False
    decoder = json.JSONDecoder()
    position, decoded = 1, 0
    while True:
        while position < len(body) and body[position] in " \t\r\n":
            position += 1
        if position >= len(body):
            return not whole and decoded > 0  # the head ends inside the array
        if body[position] == "]":
            return decoded > 0 and not body[position + 1 :].strip()
        try:
            _, position = decoder.raw_decode(body, position)
        except (ValueError, RecursionError):
            return not whole and decoded > 0  # the element the head cut
        decoded += 1
        while position < len(body) and body[position] in " \t\r\n":
            position += 1
        if position < len(body) and body[position] == ",":
            position += 1
        elif position < len(body) and body[position] != "]":
            return False


def _python_source(text: str, *, whole: bool) -> bool:
    """The head parses as Python (up to a module-level statement the head did not cut) and
    defines or imports something at module level, or holds only assignments and strings with
    a docstring or a multi-line string."""
    sources = [text] if whole else _cut_sources(text)
    for source in sources:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in the file's strings
                tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            continue
        return _module(tree)
    return False


def _module(tree: ast.Module) -> bool:
    """A module that defines or imports something, or a module of assignments and strings
    only (fixture messages of a test) with what no config dump has: a docstring or a string
    spanning lines."""
    body = tree.body
    if any(
        isinstance(
            node,
            ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        )
        for node in body
    ):
        return True
    docstring = ast.get_docstring(tree, clean=False) is not None
    assigned = body[1:] if docstring else body
    values = [node.value for node in assigned if isinstance(node, ast.Assign | ast.AnnAssign)]
    if not assigned or len(values) < len(assigned):
        return False
    strings = [v for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return bool(strings) and (
        docstring or any((s.end_lineno or s.lineno) > s.lineno for s in strings)
    )


def _comments(text: str) -> list[str]:
    """The text of the source's comments (``#`` lines inside a string are the string's), up
    to where the head was cut."""
    tokens: list[tokenize.TokenInfo] = []
    try:
        tokens.extend(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        pass  # the string or statement the head cut: the tokens before it are kept
    return [token.string[1:] for token in tokens if token.type == tokenize.COMMENT]


def _cut_sources(text: str) -> list[str]:
    """The head up to each of its last three module-level statements, found by tokenizing it:
    a string or bracket spans lines, so a line inside one starts no statement, and the head
    may end inside either (the cut).  None when the head does not tokenize as Python."""
    lines = io.StringIO(text).readlines()
    starts: list[int] = []
    depth, new_line = 0, True
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.ERRORTOKEN and not token.string.isspace():
                return []  # a character Python has no token for
            if token.type == tokenize.INDENT:
                depth += 1
            elif token.type == tokenize.DEDENT:
                depth -= 1
            elif token.type == tokenize.NEWLINE:
                new_line = True
            elif new_line and token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                new_line = False
                if depth == 0:
                    starts.append(token.start[0] - 1)
    except tokenize.TokenError:
        pass  # the string or statement the head cut
    except SyntaxError:  # an indentation no Python has
        return []
    return ["".join(lines[:i]) for i in reversed(starts[-3:]) if i > 0]


def _script(lines: list[str]) -> str | None:
    """A shell script: its shebang, shell syntax, and no more log lines than it could echo."""
    if not _SHEBANG.match(lines[0]):
        return None
    body = lines[1:401]
    logged = sum(1 for line in body if _LOG_LINE.match(line))
    if logged > max(1, len(body) // 20) or not any(_SHELL_LINE.match(line) for line in body):
        return None
    if any(line.startswith("#SBATCH") for line in body):
        return "a SLURM batch script"
    return "a shell script"


def _table(text: str, *, whole: bool) -> str | None:
    """A CSV or TSV table: a header of column names, most records as wide as it."""
    first = text.lstrip("\r\n").split("\n", 1)[0]
    for delimiter, what in ((",", "a CSV table"), ("\t", "a TSV table"), (";", "a CSV table")):
        if delimiter not in first:
            continue
        try:
            reader = csv.reader(io.StringIO(text), delimiter=delimiter)
            records = [r for r in islice(reader, _MAX_RECORDS) if r]
        except csv.Error:
            continue
        if not whole and len(records) < _MAX_RECORDS:
            records = records[:-1]  # the head may have cut the last one
        if len(records) < 2 or (len(records) == 2 and not whole):
            continue
        header, rows = records[0], records[1:]
        names = [field.strip() for field in header]
        if (
            len(names) < 2
            or len(set(names)) < len(names)
            or not all(_HEADER_FIELD.fullmatch(name) for name in names)
        ):
            continue
        if len(rows) == 1 and not (
            len(rows[0]) == len(header) and all(_COLUMN_NAME.fullmatch(name) for name in names)
        ):
            # one record: the header must be what exports write (names without spaces, as
            # pandas', a spreadsheet's or an issue tracker's), and the record as wide
            continue
        width = sum(1 for row in rows if len(row) == len(header))
        if width < 0.9 * len(rows):
            continue
        # a log line that only looks like names: the other lines repeat its words, column by
        # column, where a table's rows hold values
        if sum(1 for row in rows if _repeats(names, row)) * 2 >= len(rows):
            continue
        return what
    return None


def _repeats(names: list[str], row: list[str]) -> bool:
    """Most of the header's words recur in the same columns of ``row``."""
    shared = total = 0
    for name, field in zip(names, row, strict=False):
        words = set(_NAME_WORD.findall(name))
        total += len(words)
        shared += len(words & set(_NAME_WORD.findall(field)))
    return total > 0 and shared * 2 >= total


def _markdown(lines: list[str], *, whole: bool) -> Document | None:
    """Code fences or headings, and outside its code blocks mostly prose and Markdown's own
    marks, with (almost) no log line; see the module docstring.  ``whole``: ``lines`` are all
    of the file, not a head that may end inside a code block."""
    headings = fences = 0
    outside: list[str] = []
    blocks: list[list[str]] = []
    fenced = indented = False
    after_blank = True
    for line in lines:
        if not line.strip():
            after_blank = True
            continue
        # CommonMark's indented code block: four spaces or a tab, begun after a blank line (it
        # cannot interrupt a paragraph, so a traceback's indented source lines, which follow
        # their "File" line, are none), running on over blank lines
        if not fenced and _INDENTED.match(line) and (after_blank or indented):
            if not indented:
                blocks.append([])
            indented, after_blank = True, False
            blocks[-1].append(line)
            continue
        indented = after_blank = False
        if _FENCE.match(line):
            fenced = not fenced
            fences += not fenced
            if fenced:
                blocks.append([])
            continue
        if fenced:
            blocks[-1].append(line)
        else:
            outside.append(line)
            headings += _HEADING.match(line) is not None
    if not outside:
        return None
    logged = sum(1 for line in outside if _LOG_LINE.match(line))
    # one heading is structure enough for text with no log line at all (a README's section);
    # text with log lines needs more, or it is a ticket's paste under a title
    if fences == 0 and headings < (1 if logged == 0 else 2):
        return None
    if logged > max(1, len(outside) // 20):
        return None  # a log with prose around it
    marked = sum(
        1 for line in outside if _MARKDOWN.match(line) or len(_WORD.findall(line[:400])) >= 4
    )
    if marked < 0.7 * len(outside):
        return None
    quoted = [line for block in blocks if _output(block) for line in block]
    return Document(
        "a Markdown document",
        quoted="\n".join(quoted),
        fenced=True,
        cut_in_block=fenced and not whole,
    )


def _output(block: list[str]) -> bool:
    """A code block that may be a program's output (a pasted log): not code (commands at a
    prompt, a script, Python, a JSON, TOML or INI config) nor oomlens' own report (its evidence
    quotes errors)."""
    shown = [line for line in block if not line.lstrip().startswith(("$ ", "# ", ">>> "))]
    if not shown or _OOMLENS_REPORT.match(shown[0]):
        return False
    text = "\n".join(block) + "\n"
    if _python_source(text, whole=True) or _config(text):
        return False
    return not all(_SHELL_LINE.match(line) or line.lstrip().startswith("#") for line in shown)


def _config(text: str) -> bool:
    """A JSON or TOML config: an object or an array (a quoted line alone is JSON too, a
    string, but no config), or TOML's tables."""
    try:
        return isinstance(json.loads(text), dict | list)
    except (ValueError, RecursionError):
        pass
    try:
        return bool(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, RecursionError):
        return False


def _toml(lines: list[str]) -> bool:
    """Sections and entries (a multi-line string's lines are its entry's value), with (almost)
    no log line outside the strings."""
    outside: list[str] = []
    quote = ""
    for line in lines:
        if quote:
            if _unescaped(line, quote) % 2:
                quote = ""  # the string ends on this line; what follows is the entry's
            continue
        outside.append(line)
        opened = _TOML_MULTILINE.match(line)
        if opened and _unescaped(line, opened.group("quote")) % 2:
            quote = opened.group("quote")
    if not outside:
        return False
    logged = sum(1 for line in outside if _LOG_LINE.match(line))
    if logged > max(1, len(outside) // 20):
        return False
    sections = sum(1 for line in outside if _TOML_SECTION.match(line))
    entries = sum(1 for line in outside if _TOML_ENTRY.match(line) or _TOML_SECTION.match(line))
    return sections >= 1 and entries >= 0.85 * len(outside)


def _unescaped(line: str, quote: str) -> int:
    """How many times ``quote`` occurs in ``line`` not escaped by a backslash (a literal
    string has no escapes, but cannot hold its delimiter either)."""
    return sum(
        1
        for m in regex.finditer(regex.escape(quote), line)
        if line[max(0, m.start() - 1) : m.start()] != "\\"
    )


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
