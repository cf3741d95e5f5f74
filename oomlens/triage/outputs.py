"""Write the triage table in the format its file name asks for, and read such files back.

=====================  ==========================================================
extension              what is written
=====================  ==========================================================
``.csv``               the table, one header line
``.jsonl``/``.ndjson`` one JSON object per run (``figures`` as an object)
``.parquet``           the table (needs pyarrow: ``pip install 'oomlens[parquet]'``)
``.sqlite``/``.db``    tables ``runs`` and ``groups``
``.html``/``.htm``     an index page: counts, groups, and every run linked to its report
=====================  ==========================================================

Every file is written to a temporary name and renamed into place, so a killed run leaves the
previous file or the new one, never half of one.  The HTML page is rendered by Jinja2 with
autoescaping on (paths and messages come from the runs and are untrusted), carries its own
styles and a Content-Security-Policy that forbids loading anything, and makes no requests.
"""

from __future__ import annotations

import datetime
import importlib.resources
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jinja2
import pandas

from oomlens import __version__
from oomlens.errors import InputError, UsageError
from oomlens.ingest.files import is_special_target, refuse_special
from oomlens.render.output import current_umask, write_atomically
from oomlens.triage.summary import diagnosis_counts, group_table, verdict_counts
from oomlens.triage.table import COLUMNS, EXACT_COLUMNS, format_time, normalize
from oomlens.units import format_size
from oomlens.untrusted import (
    BIDI_CONTROLS,
    escape_controls,
    neutralize_formula,
    restore_formula,
    shown,
    unescape_controls,
)

TABLE_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".sqlite": "sqlite",
    ".sqlite3": "sqlite",
    ".db": "sqlite",
}
OUTPUT_FORMATS = {**TABLE_FORMATS, ".html": "html", ".htm": "html"}


def output_format(path: str) -> str:
    """The format ``path``'s extension asks for; raises ``UsageError`` for any other."""
    suffix = os.path.splitext(path)[1].lower()
    try:
        return OUTPUT_FORMATS[suffix]
    except KeyError:
        known = ", ".join(sorted(OUTPUT_FORMATS))
        raise UsageError(
            f"{path}: unknown output format {suffix or '(none)'}; use {known}"
        ) from None


def check_outputs(paths: Iterable[str]) -> None:
    """Fail early, before any analysis, on an output that cannot be written; create an
    output's missing directories (as ``--reports`` does), as the user asked to write there."""
    for path in paths:
        if output_format(path) == "parquet":
            _require_pyarrow(path)
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"{path}: its directory {directory} cannot be created ({exc.strerror or exc})"
            ) from exc


def write_table(table: pandas.DataFrame, path: str, *, title: str = "oomlens triage") -> None:
    """Write ``table`` (``table.COLUMNS``) to ``path`` in the format of its extension.

    Raises ``UsageError`` for an unknown extension, Parquet without pyarrow, or a file that
    cannot be written.
    """
    kind = output_format(path)
    writers: dict[str, Callable[[pandas.DataFrame, str], None]] = {
        "csv": _write_csv,
        "jsonl": _write_jsonl,
        "parquet": _write_parquet,
        "sqlite": _write_sqlite,
        "html": lambda frame, target: _write_html(frame, target, title),
    }
    try:
        writers[kind](table, path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be written ({exc.strerror or exc})") from exc


def read_table(path: str) -> pandas.DataFrame:
    """A table written by ``write_table`` (any format but HTML), normalized.

    Raises ``InputError`` when the file cannot be read or is not such a table.
    """
    refuse_special(path, what="a triage table")
    suffix = os.path.splitext(path)[1].lower()
    kind = TABLE_FORMATS.get(suffix)
    if kind is None:
        raise InputError(
            path,
            f"not a triage table ({suffix or 'no extension'})",
            "merge takes the .csv, .jsonl, .parquet or .sqlite files that shards wrote",
        )
    try:
        if kind == "csv":
            frame = pandas.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
            for name in frame.columns:
                frame[name] = frame[name].map(
                    _unescape_exact if name in EXACT_COLUMNS else _restore_cell
                )
        elif kind == "jsonl":
            frame = pandas.DataFrame.from_records(_read_jsonl(path), columns=list(COLUMNS))
        elif kind == "parquet":
            _require_pyarrow(path)
            frame = pandas.read_parquet(path)
        else:
            frame = _read_sqlite(path)
        # made by hand or by an attacker, perhaps: every cell to its column's type, or refused
        return normalize(frame, untrusted=True)
    except KeyError as exc:
        raise InputError(path, f"not a triage table: no column {exc.args[0]}") from exc
    except (OSError, ValueError, RecursionError, sqlite3.Error) as exc:
        raise InputError(path, f"cannot be read as a triage table ({exc})") from exc


# --- formats ---------------------------------------------------------------------------------


def _write_csv(table: pandas.DataFrame, path: str) -> None:
    r"""CSV is opened in spreadsheets: a text cell that would start a formula (a run directory
    named ``=HYPERLINK(...)``, a frame ``@SUM(1+1)``) gets a leading apostrophe, and in the
    exact names (``EXACT_COLUMNS``) control characters and backslashes are written as backslash
    escapes (``a\tb``, ``\x1b``, ``\\``); :func:`read_table` undoes both.  (The other formats
    are typed data for programs and keep the text as it is; their other text cells are already
    free of control characters.)"""
    guarded = table.copy()
    for name, dtype in COLUMNS.items():
        if dtype == "string":
            exact = name in EXACT_COLUMNS
            guarded[name] = [_csv_cell(cell, exact=exact) for cell in guarded[name]]
    write_atomically(path, guarded.to_csv(index=False, lineterminator="\n").encode("utf-8"))


def _csv_cell(cell: object, *, exact: bool) -> object:
    if _missing(cell):
        return cell
    text = escape_controls(str(cell)) if exact else str(cell)
    return neutralize_formula(text)


def _restore_cell(cell: object) -> object:
    return restore_formula(cell) if isinstance(cell, str) else cell


def _unescape_exact(cell: object) -> object:
    return unescape_controls(restore_formula(cell)) if isinstance(cell, str) else cell


def _missing(value: object) -> bool:
    return value is None or value is pandas.NA or (isinstance(value, float) and value != value)


def _json_records(table: pandas.DataFrame) -> list[dict[str, Any]]:
    records = []
    for row in table.to_dict(orient="records"):
        record = {k: (None if _missing(v) else v) for k, v in row.items()}
        figures = record.get("figures")
        if isinstance(figures, str):
            try:
                record["figures"] = json.loads(figures)
            except ValueError:
                pass
        records.append(record)
    return records


_JSON_UNSAFE = re.compile(rf"[\x7f-\x9f{BIDI_CONTROLS}\ud800-\udfff]")
"""What ``json.dumps(ensure_ascii=False)`` leaves raw and a terminal (``cat runs.jsonl``) or an
encoder must not get: DEL, C1 controls, bidi controls, undecodable bytes' lone surrogates.  It
escapes C0 controls itself."""


def _write_jsonl(table: pandas.DataFrame, path: str) -> None:
    # Outside strings json.dumps writes ASCII only, so every match is inside a string, where
    # \uXXXX is the same character to any JSON reader.
    lines = [
        _JSON_UNSAFE.sub(
            lambda match: f"\\u{ord(match.group()):04x}",
            json.dumps(record, ensure_ascii=False, sort_keys=False, default=_json_default),
        )
        for record in _json_records(table)
    ]
    write_atomically(path, ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"))


def _json_default(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"line {number} is not a JSON object")
            records.append(record)
    return records


def _require_pyarrow(path: str) -> None:
    if importlib.util.find_spec("pyarrow") is None:
        raise UsageError(
            f"{path}: Parquet needs pyarrow, which is not installed; "
            "install it with pip install 'oomlens[parquet]' (or pip install pyarrow), "
            "or write .csv, .jsonl or .sqlite instead"
        )


def _write_parquet(table: pandas.DataFrame, path: str) -> None:
    _require_pyarrow(path)
    _write_via_temporary(path, lambda temporary: table.to_parquet(temporary, index=False))


def _write_sqlite(table: pandas.DataFrame, path: str) -> None:
    def write(temporary: str) -> None:
        with sqlite3.connect(temporary) as db:
            table.to_sql("runs", db, index=False)
            group_table(table).to_sql("groups", db, index=False)
        db.close()

    _write_via_temporary(path, write)


def _read_sqlite(path: str) -> pandas.DataFrame:
    if not os.path.isfile(path):
        raise OSError(f"no such file: {path}")
    with sqlite3.connect(
        f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro", uri=True
    ) as db:
        frame = pandas.read_sql_query("SELECT * FROM runs", db)
    db.close()
    return frame


def _write_via_temporary(path: str, write: Callable[[str], None]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(
        prefix=".oomlens-", suffix=os.path.splitext(path)[1], dir=directory
    )
    os.close(fd)
    os.unlink(temporary)
    try:
        write(temporary)
        # SQLite creates its files 0644 whatever the umask says; every output follows the umask.
        os.chmod(temporary, 0o666 & ~current_umask())
        if is_special_target(path):  # /dev/null: written through, never replaced
            with open(temporary, "rb") as source, open(path, "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# --- HTML ------------------------------------------------------------------------------------


def template_directories() -> list[Path]:
    """Where templates are: the installed package's ``oomlens/templates`` first, then the
    source tree's ``templates/``."""
    candidates: list[Path] = []
    installed = importlib.resources.files("oomlens") / "templates"
    if isinstance(installed, Path) and installed.is_dir():
        candidates.append(installed)
    source = Path(__file__).resolve().parents[2] / "templates"
    if source.is_dir():
        candidates.append(source)
    return candidates


def _environment() -> jinja2.Environment:
    directories = template_directories()
    if not directories:
        raise UsageError("the HTML templates are missing from this oomlens installation")
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in directories]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["size"] = lambda v: "" if v is None else format_size(int(v))
    environment.filters["percent"] = lambda v: "" if v is None else f"{float(v) * 100:.0f}%"
    environment.filters["shown"] = lambda v: "" if v is None else shown(str(v))
    environment.filters["when"] = shown_time
    return environment


_ZONE = re.compile(r"(?:Z|[+-]\d\d:\d\d)$")


def shown_time(value: object) -> str:
    """A time of the table (``table.format_time``) as the index shows it: the same ISO 8601
    text, its zone included; a log's time that printed none says so rather than pass for
    UTC or local time."""
    if value is None or _missing(value):
        return ""
    text = str(value)
    return text if _ZONE.search(text) else f"{text} (zone unknown)"


def _link(report: str | None, index_dir: str) -> str | None:
    """A relative, percent-encoded link from the index to a report file."""
    if not report:
        return None
    relative = os.path.relpath(report, index_dir).replace(os.sep, "/")
    return urllib.parse.quote(relative, safe="/", errors="surrogateescape")


def render_index(table: pandas.DataFrame, *, index_path: str, title: str) -> str:
    """The HTML index of ``table``, with links relative to where ``index_path`` will be."""
    index_dir = os.path.dirname(os.path.abspath(index_path))
    runs = _json_records(table)
    for run in runs:
        run["link"] = _link(run.get("report"), index_dir)
    template = _environment().get_template("triage/index.html.j2")
    return template.render(
        title=title,
        runs=runs,
        verdicts=verdict_counts(table),
        diagnoses=diagnosis_counts(table),
        groups=[
            {key: None if _missing(value) else value for key, value in group.items()}
            for group in group_table(table).to_dict(orient="records")
        ],
        errors=int(table["error"].notna().sum()),
        generated=format_time(datetime.datetime.now(datetime.UTC)),
        version=__version__,
    )


def _write_html(table: pandas.DataFrame, path: str, title: str) -> None:
    write_atomically(path, render_index(table, index_path=path, title=title).encode("utf-8"))
