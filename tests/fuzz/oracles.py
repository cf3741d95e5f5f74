"""What counts as a finding, from what a case's command left: its exit code, its standard
output and error, the files it wrote, its time and memory.

* ``internal_error``: exit code 1 (or any code the command does not document), a traceback, an
  input listed as an "internal error", more than one line on stderr for a failed command;
* ``hang``: past the time limit (wall-clock time; on a machine shared with other work, CPU
  time with ``clock="cpu"``, a blocked case still caught by the runner's wall-clock kill);
  ``memory``: past the memory limit;
* ``injection``: a control character, escape sequence or bidi override in text meant for a
  terminal, JSON, CSV or a page; live markup in HTML (a tag or attribute the report never
  writes, a planted payload unescaped); a CSV cell a spreadsheet would run as a formula;
* ``code_execution``: the marker file a hostile pickle would have created exists;
* ``output_size``: standard output or a written report past ``OUTPUT_LIMIT``;
* ``encoding``: standard output or a written report that is not UTF-8;
* ``direction`` (``direction()``): a wrong-direction answer, judged against the verdict the
  untransformed input gets (a metamorphic oracle): a failure read as ``no_failure`` or
  refused, an OOM read as another failure at high confidence, a document that only quotes an
  OOM read as one.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tests.fuzz.mutate import PAYLOADS

TIME_LIMIT = 20.0
MEMORY_LIMIT = 1024**3
OUTPUT_LIMIT = 32 * 1024**2
"""A report larger than this for a fuzz input is a finding (``output_size``), not parsed."""

EXIT_CODES = {"analyze": {0, 3}, "check": {0, 4}, "triage": {0, 3}, "whatif": {0, 3}}
"""The documented exit codes each command may end with on any input (2 is a usage error: the
fuzzer's command lines are valid)."""

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Nothing a terminal or a page would act on: C0 controls but tab and line feed, DEL, C1
controls, and every Unicode ``Bidi_Control`` character (the marks U+061C, U+200E, U+200F;
embeddings and overrides; isolates)."""

INTERNAL = re.compile(
    r"internal error while reading it|oomlens: internal error|\binternal_error\b|"
    r"rule \w+ failed"
)
"""oomlens' own words for a bug: an input that cost one, the CLI's last line, a rule that
raised (its ``internal_error`` diagnosis)."""

_ALLOWED_TAGS = frozenset(
    "html head meta title style script body header nav main section article footer div span "
    "p a h1 h2 h3 h4 ul ol li dl dt dd table thead tbody tr th td pre code details summary "
    "figure figcaption svg g line polyline rect circle text title button br strong em b small "
    "sub sup abbr wbr time".split()
)
_LIVE_PAYLOADS = tuple(p for p in PAYLOADS if "<" in p)


@dataclass(frozen=True)
class Finding:
    kind: str
    detail: str


def findings(
    argv: list[str],
    stdout_format: str,
    outputs: tuple[str, ...],
    folder: Path,
    result: dict[str, object],
    marker: str,
) -> list[Finding]:
    found: list[Finding] = []
    code = result["exit_code"]
    stdout, stderr = str(result["stdout"]), str(result["stderr"])
    clock = "cpu" if result.get("clock") == "cpu" else "wall"
    seconds = float(str(result["cpu_seconds" if clock == "cpu" else "seconds"]))
    if result["timed_out"] or seconds > TIME_LIMIT:
        found.append(Finding("hang", f"{seconds:.1f} s ({clock})"))
    if int(str(result["memory"])) > MEMORY_LIMIT:
        found.append(Finding("memory", f"{int(str(result['memory'])) / 2**20:.0f} MiB"))
    if (folder / marker).exists():
        found.append(Finding("code_execution", f"{marker} was created"))
    if int(str(result.get("stdout_bytes", 0))) > OUTPUT_LIMIT:
        found.append(Finding("output_size", f"stdout: {int(str(result['stdout_bytes'])):,} bytes"))
    if result.get("stdout_utf8") is False:
        found.append(Finding("encoding", "standard output is not UTF-8"))
    if not result["timed_out"]:
        if code not in EXIT_CODES[argv[0]]:
            found.append(Finding("internal_error", f"exit {code}: {stderr.strip()[-300:]}"))
        elif code != 0 and len(stderr.strip().splitlines()) != 1:
            found.append(Finding("internal_error", f"exit {code} with {stderr[-300:]!r}"))
    for where, text in (("stdout", stdout), ("stderr", stderr)):
        # a traceback quoted from a log is data on stdout; the command's own would be on stderr
        if where == "stderr" and "Traceback" in text:
            found.append(Finding("internal_error", "a traceback on stderr"))
        if INTERNAL.search(text):
            found.append(Finding("internal_error", f"{where}: {_match(INTERNAL, text)}"))
        if CONTROL.search(text):
            found.append(Finding("injection", f"control character in {where}: {_around(text)}"))
    if stdout_format == "json" and stdout.strip():
        found += _json(stdout, "stdout")
    for name in outputs:
        path = folder / name
        if not path.exists():
            continue
        if path.stat().st_size > OUTPUT_LIMIT:
            found.append(Finding("output_size", f"{name}: {path.stat().st_size:,} bytes"))
            continue
        raw = path.read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            found.append(Finding("encoding", f"{name} is not UTF-8: {exc}"))
        text = raw.decode("utf-8", errors="replace")
        if INTERNAL.search(text):
            found.append(Finding("internal_error", f"{name}: {_match(INTERNAL, text)}"))
        if name.endswith(".html"):
            found += _html(text, name)
        elif name.endswith(".csv"):
            found += _csv(text, name)
        elif name.endswith(".jsonl"):
            # A triage table's run, path and report are the names exactly as the file system
            # spells them (docs/triage.md): JSON escapes their control characters, so the file
            # shows none; every other value must be clean once decoded too.
            if CONTROL.search(text):
                found.append(Finding("injection", f"control character in {name}: {_around(text)}"))
            for line in text.splitlines():
                found += _json(line, name, exact=EXACT_KEYS)
        elif CONTROL.search(text):
            found.append(Finding("injection", f"control character in {name}: {_around(text)}"))
    return found


def _match(pattern: re.Pattern[str], text: str) -> str:
    match = pattern.search(text)
    start = match.start() if match else 0
    return text[max(0, start - 80) : start + 200].replace("\n", " ")


def _around(text: str) -> str:
    match = CONTROL.search(text)
    start = match.start() if match else 0
    return repr(text[max(0, start - 40) : start + 20])


EXACT_KEYS = frozenset({"run", "path", "report"})
"""The keys of a triage table's row whose values are names kept exactly (``EXACT_COLUMNS``)."""


def _json(text: str, name: str, *, exact: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings in one JSON document: a control character in any string once decoded, but in
    the values of top-level keys in ``exact``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [Finding("internal_error", f"{name} is not JSON: {exc}")]
    found: list[Finding] = []
    if isinstance(value, dict) and exact:
        value = {key: item for key, item in value.items() if key not in exact}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += list(item.keys()) + list(item.values())
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str) and CONTROL.search(item):
            found.append(Finding("injection", f"control character in {name}: {_around(item)}"))
            break
    return found


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.scripts = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _ALLOWED_TAGS:
            self.problems.append(f"<{tag}>")
        self.scripts += tag == "script"
        for name, value in attrs:
            lowered = (value or "").strip().lower()
            if name.startswith("on") or name in ("src", "srcdoc", "formaction", "action"):
                self.problems.append(f"<{tag} {name}=...>")
            if (
                name in ("href", "xlink:href")
                and not lowered.startswith("#")
                and (":" in lowered.split("/")[0])
            ):
                self.problems.append(f"<{tag} {name}={lowered[:40]}>")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _html(text: str, name: str) -> list[Finding]:
    parser = _Tags()
    parser.feed(text)
    found = [Finding("injection", f"{name}: {p}") for p in parser.problems[:5]]
    if parser.scripts > 1:
        found.append(Finding("injection", f"{name}: {parser.scripts} script elements"))
    found += [Finding("injection", f"{name}: {p!r} unescaped") for p in _LIVE_PAYLOADS if p in text]
    if CONTROL.search("".join(parser.text)):
        found.append(Finding("injection", f"control character in {name}"))
    return found


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def _csv(text: str, name: str) -> list[Finding]:
    found: list[Finding] = []
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            if cell[:1] in ("=", "+", "-", "@", "\t", "\r") and not _NUMBER.fullmatch(cell):
                found.append(Finding("injection", f"{name}: formula cell {cell[:40]!r}"))
            if CONTROL.search(cell.replace("\r", "")):
                found.append(Finding("injection", f"{name}: control character {cell[:40]!r}"))
    return found


OOM = frozenset({"gpu_oom", "host_oom"})
FAILURES = frozenset({"gpu_oom", "host_oom", "config_error", "other_failure"})
HIGH = 0.7
"""A confidence a user acts on without a second look (the renderers' "high")."""
CONFIDENT = 0.5


def verdict_of(result: dict[str, object]) -> tuple[str, float] | None:
    """``(verdict, confidence of the top diagnosis)`` from an ``analyze --format json`` run's
    standard output; None when it printed no report (a refusal)."""
    try:
        doc = json.loads(str(result["stdout"]))
    except ValueError:
        return None
    if not isinstance(doc, dict) or "verdict" not in doc:
        return None
    diagnoses = doc.get("diagnoses") or []
    confidence = float(diagnoses[0].get("confidence", 0.0)) if diagnoses else 0.0
    return str(doc["verdict"]), confidence


def direction(
    expect: str, before: tuple[str, float] | None, result: dict[str, object]
) -> list[Finding]:
    """Wrong-direction answers of a meaning-preserving change (a metamorphic oracle).

    ``before`` is the verdict the untransformed input gets (``verdict_of`` of its run), None
    when it has none.  ``expect`` is ``direction``: a failure must not become ``no_failure``
    nor be refused, an OOM must not become another verdict at ``HIGH`` confidence (unknown is
    allowed: less certain is not wrong); or ``no_oom``: the case adds only a document quoting
    an OOM, so the verdict must not become an OOM at ``CONFIDENT`` confidence unless it was
    one before.
    """
    after = verdict_of(result)
    found: list[Finding] = []
    was = f"{before[0]} at {before[1]:.2f}" if before else "none"
    if expect == "direction" and before is not None and before[0] in FAILURES:
        if after is None:
            line = str(result["stderr"]).strip().splitlines()[-1:] or [""]
            found.append(Finding("direction", f"failure refused (was {was}): {line[0][:200]}"))
        elif after[0] == "no_failure":
            found.append(Finding("direction", f"failure read as no_failure (was {was})"))
        elif before[0] in OOM and after[0] not in (before[0], "unknown") and after[1] >= HIGH:
            found.append(
                Finding(
                    "direction", f"{before[0]} read as {after[0]} at {after[1]:.2f} (was {was})"
                )
            )
    if expect == "no_oom" and after is not None and after[0] in OOM and after[1] >= CONFIDENT:
        if before is None:
            found.append(Finding("direction", f"document read as {after[0]} at {after[1]:.2f}"))
        elif before[0] not in OOM:
            found.append(
                Finding(
                    "direction",
                    f"healthy run with a document read as {after[0]} at {after[1]:.2f} (was {was})",
                )
            )
    return found
