"""Site settings of the Epilog mode: one TOML file, read as data, every key checked.

The file is optional; a missing file means the defaults.  It is parsed with ``tomllib`` (data
only, nothing evaluated).  A key oomlens does not know, a value of the wrong type or out of
range is an error that names the file, the key and what to write instead: a typo must not
silently turn a setting off.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from oomlens.errors import UsageError
from oomlens.ingest.files import not_regular_problem
from oomlens.units import format_size, parse_size

DEFAULT_SETTINGS_PATH = Path("/etc/oomlens/epilog.toml")
_MAX_SETTINGS_BYTES = 1024 * 1024
_SYSLOG_FACILITIES = ("user", "daemon", "local0", "local1", "local2", "local3", "local4",
                      "local5", "local6", "local7")  # fmt: skip


@dataclass(frozen=True, slots=True)
class EpilogSettings:
    """The Epilog's settings; every field is a key of the settings file."""

    spool_dir: Path = Path("/var/spool/oomlens")
    """Where each handled job gets ``<job id>/`` (``verdict.json``, ``report.html``,
    ``epilog.json``) and where ``epilog.log`` is appended to."""
    budget_seconds: float = 20.0
    """Wall time the Epilog may take, start to exit; keep it well under ``PrologEpilogTimeout``."""
    copy_to_workdir: bool = False
    """Also write ``oomlens-<job id>.json`` / ``.html`` into the job's work directory, as the
    job's user."""
    log_file: Path = Path("epilog.log")
    """One JSON line per job; relative paths are relative to ``spool_dir``."""
    syslog: bool = False
    """Also send one line per job to syslog (ident ``oomlens-epilog``)."""
    syslog_facility: str = "daemon"
    log_successful_jobs: bool = True
    """Log a ``skipped`` line for jobs that did not fail (nothing else is done for them)."""
    max_log_bytes: int = 32 * 1024**2
    """A larger stdout/stderr file is read as its first eighth and its last seven eighths of
    this size."""
    max_snapshot_bytes: int = 256 * 1024**2
    """A larger snapshot is not analyzed by the Epilog; it is listed in ``epilog.json`` for a
    later sweep."""
    max_memory_bytes: int = 8 * 1024**3
    """Address-space limit of the analysis process (0: none)."""
    tmp_dir: Path = Path("/tmp")
    """Where the shortened copy of a huge log is written while the analysis runs."""
    workdir_patterns: tuple[str, ...] | None = None
    """Names (shell patterns) of the files in the work directory that join the analysis; None:
    the names input kinds say jobs leave there (``patterns_in_force``)."""
    workdir_recent_seconds: float = 86400.0
    """Work-directory files older than this (before the job ended) belong to other runs."""
    workdir_max_entries: int = 10_000
    """The work directory is listed up to this many entries."""
    workdir_max_files: int = 32
    """At most this many work-directory files join the analysis (newest first)."""

    def patterns_in_force(self) -> tuple[str, ...]:
        """``workdir_patterns``, or the input kinds' names of the files jobs leave in their work
        directory (snapshots, DeepSpeed configs, torchelastic error files)."""
        if self.workdir_patterns is not None:
            return self.workdir_patterns
        # imported when needed: the Epilog reads its settings long before it analyzes anything
        from oomlens.ingest.kinds import workdir_patterns

        return workdir_patterns()

    def describe(self) -> dict[str, Any]:
        """The settings as TOML-ready values (what ``oomlens epilog --check`` prints)."""
        out: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "workdir_patterns":
                value = self.patterns_in_force()
            if isinstance(value, Path):
                value = str(value)
            elif field.name in _SIZE_KEYS:
                value = format_size(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @property
    def log_path(self) -> Path:
        return self.log_file if self.log_file.is_absolute() else self.spool_dir / self.log_file


_SIZE_KEYS = frozenset({"max_log_bytes", "max_snapshot_bytes", "max_memory_bytes"})
_PATH_KEYS = frozenset({"spool_dir", "log_file", "tmp_dir"})
_BOOL_KEYS = frozenset({"copy_to_workdir", "syslog", "log_successful_jobs"})
_SECONDS_RANGE: Mapping[str, tuple[float, float]] = {
    "budget_seconds": (1.0, 3600.0),
    "workdir_recent_seconds": (0.0, 366 * 86400.0),
}
_INT_RANGE: Mapping[str, tuple[int, int]] = {
    "workdir_max_entries": (0, 10_000_000),
    "workdir_max_files": (0, 10_000),
}
KNOWN_KEYS = tuple(field.name for field in fields(EpilogSettings))


def load_settings(path: str | Path) -> EpilogSettings:
    """Read the settings file at ``path``; the defaults when it does not exist.

    Raises ``UsageError`` (one line naming the file, the key, and what to do) for a file that
    cannot be read, is not TOML, or holds an unknown key or a bad value.
    """
    path = Path(path)
    special = not_regular_problem(path, "a settings file")
    if special is not None:
        raise UsageError(f"{path}: {special}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_SETTINGS_BYTES + 1)
    except FileNotFoundError:
        return EpilogSettings()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the settings file ({exc.strerror or exc})") from exc
    if len(data) > _MAX_SETTINGS_BYTES:
        raise UsageError(f"{path}: larger than 1 MiB; this is not an oomlens settings file")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML ({exc}); fix the file or remove it") from exc
    return settings_from_table(table, origin=str(path))


def with_spool(settings: EpilogSettings, spool: str | Path) -> EpilogSettings:
    """``settings`` with ``spool_dir`` from ``--spool``, which must be an absolute path as the
    file's ``spool_dir`` must; raises ``UsageError`` naming the option."""
    text = str(spool)
    if not text or "\x00" in text or not Path(text).is_absolute():
        raise UsageError(f"--spool {text!r}: give an absolute path, as for spool_dir")
    return replace(settings, spool_dir=Path(text))


def settings_from_table(table: Mapping[str, Any], *, origin: str) -> EpilogSettings:
    """Build settings from a parsed TOML table; raises ``UsageError`` naming ``origin``."""
    unknown = sorted(set(table) - set(KNOWN_KEYS))
    if unknown:
        raise UsageError(
            f"{origin}: unknown setting {unknown[0]!r}; known settings are " + ", ".join(KNOWN_KEYS)
        )
    values: dict[str, Any] = {}
    for key, raw in table.items():
        values[key] = _convert(key, raw, origin)
    return replace(EpilogSettings(), **values)


def _convert(key: str, raw: Any, origin: str) -> Any:
    def bad(expected: str) -> UsageError:
        return UsageError(f"{origin}: {key} = {raw!r} is not {expected}")

    if key in _BOOL_KEYS:
        if not isinstance(raw, bool):
            raise bad("true or false")
        return raw
    if key in _PATH_KEYS:
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise bad("a path")
        path = Path(raw)
        if key != "log_file" and not path.is_absolute():
            raise bad("an absolute path")
        return path
    if key in _SIZE_KEYS:
        try:
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
            if value is None and isinstance(raw, str):
                value = parse_size(raw)
        except ValueError:
            value = None
        if value is None or value < 0:
            raise bad('a size such as "64 MiB" or a number of bytes')
        if key != "max_memory_bytes" and value < 1024:
            raise bad("at least 1 KiB")
        return value
    if key in _SECONDS_RANGE:
        low, high = _SECONDS_RANGE[key]
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not low <= raw <= high:
            raise bad(f"a number of seconds from {low:g} to {high:g}")
        return float(raw)
    if key in _INT_RANGE:
        low_int, high_int = _INT_RANGE[key]
        if isinstance(raw, bool) or not isinstance(raw, int) or not low_int <= raw <= high_int:
            raise bad(f"a whole number from {low_int} to {high_int}")
        return raw
    if key == "syslog_facility":
        if raw not in _SYSLOG_FACILITIES:
            raise bad("one of " + ", ".join(_SYSLOG_FACILITIES))
        return raw
    if key == "workdir_patterns":
        if not isinstance(raw, list) or not all(
            isinstance(item, str) and item and "/" not in item and "\x00" not in item
            for item in raw
        ):
            raise bad("a list of file-name patterns (no '/')")
        return tuple(raw)
    raise AssertionError(f"setting {key} has no converter")  # pragma: no cover
