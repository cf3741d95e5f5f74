"""What the capture records, and where: defaults, the ``OOMLENS_CAPTURE_*`` environment, and
explicit overrides (``install(**settings)``, the ``python -m oomlens.capture`` options).

The defaults are the measured policy (docs/capture.md): allocator history without
stacks from the start, Python stacks only once memory comes close to the limit, a bounded ring
of trace entries, one snapshot at the out-of-memory, memory counters once per step and host
counters once per second, 20 MB per rank at most.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    directory: str = "oomlens-capture"
    """Parent of the per-run directory (relative paths are from the working directory)."""
    run: str | None = None
    """The run's directory name; None: from SLURM / torchrun / the launcher (``naming``)."""
    history: bool = True
    """Record the allocator's history (needed for the snapshot's trace)."""
    max_entries: int = 50_000
    """Trace entries the allocator keeps (a ring: the newest win)."""
    stacks_at: float = 0.80
    """Turn on Python stacks once the peak reserved memory reaches this fraction of the limit
    (or the allocator starts flushing its cache and retrying, or allocated memory after each
    step keeps rising); 0 records stacks from the start, 1 or more never."""
    rising_steps: int = 8
    """Allocated memory after this many consecutive steps, each higher than the last, also
    turns stacks on (the shape of a leak)."""
    interval: float = 1.0
    """Seconds between host samples (and GPU samples when no step happens)."""
    step_interval: float = 0.1
    """At most one step sample per this many seconds (fast loops are thinned, not slowed)."""
    max_mb: float = 20.0
    """Disk budget per rank, all files together."""
    sentinel: bool = True
    """Start a watcher process that records when the rank disappears (a kernel OOM kill
    leaves no trace in the process itself)."""
    snapshot_every_s: float = 30.0
    """A later OOM (after a caught one) replaces the snapshot only this long after the last."""

    @property
    def budget_bytes(self) -> int:
        return max(1, int(self.max_mb * MIB))

    @property
    def snapshot_budget(self) -> int:
        """The snapshot's share of the budget: what remains after the series and events."""
        return max(256 * 1024, self.budget_bytes - self.series_budget - self.events_budget)

    @property
    def series_budget(self) -> int:
        return max(64 * 1024, self.budget_bytes * 3 // 10)

    @property
    def events_budget(self) -> int:
        return max(64 * 1024, self.budget_bytes // 10)


_ENV = {
    "directory": "OOMLENS_CAPTURE_DIR",
    "run": "OOMLENS_CAPTURE_RUN",
    "history": "OOMLENS_CAPTURE_HISTORY",
    "max_entries": "OOMLENS_CAPTURE_MAX_ENTRIES",
    "stacks_at": "OOMLENS_CAPTURE_STACKS_AT",
    "rising_steps": "OOMLENS_CAPTURE_RISING_STEPS",
    "interval": "OOMLENS_CAPTURE_INTERVAL",
    "step_interval": "OOMLENS_CAPTURE_STEP_INTERVAL",
    "max_mb": "OOMLENS_CAPTURE_MAX_MB",
    "sentinel": "OOMLENS_CAPTURE_SENTINEL",
    "snapshot_every_s": "OOMLENS_CAPTURE_SNAPSHOT_EVERY_S",
}
"""The environment variable of each setting (what a launcher passes to every rank)."""
ENVIRONMENT: Mapping[str, str] = _ENV

ENABLED_ENV = "OOMLENS_CAPTURE"
"""``0`` turns the capture off entirely (``install()`` does nothing)."""


class SettingsError(ValueError):
    """A setting with a value of the wrong kind; the message names it."""


def _convert(name: str, kind: object, raw: object) -> object:
    if kind in (bool, "bool"):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name} must be 0 or 1, got {raw!r}")
    if kind in (int, "int"):
        try:
            value = int(str(raw))
        except ValueError:
            raise SettingsError(f"{name} must be a whole number, got {raw!r}") from None
        if value < 0:
            raise SettingsError(f"{name} must not be negative, got {raw!r}")
        return value
    if kind in (float, "float"):
        try:
            number = float(str(raw))
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
        if not number >= 0:  # also refuses NaN
            raise SettingsError(f"{name} must be a number >= 0, got {raw!r}")
        return number
    text = str(raw)
    if kind in ("str | None",) and text == "":
        return None
    return text


def resolve(
    overrides: Mapping[str, object] | None = None, env: Mapping[str, str] | None = None
) -> CaptureSettings:
    """Defaults, then the environment, then ``overrides``.  Raises ``SettingsError`` for an
    unknown name or a value of the wrong kind."""
    env = os.environ if env is None else env
    settings = CaptureSettings()
    kinds = {f.name: f.type for f in fields(CaptureSettings)}
    changes: dict[str, object] = {}
    for name, var in _ENV.items():
        raw = env.get(var)
        if raw is not None and raw != "":
            changes[name] = _convert(var, kinds[name], raw)
    for name, given in (overrides or {}).items():
        if name not in kinds:
            raise SettingsError(f"unknown capture setting {name!r}; known: {', '.join(kinds)}")
        if given is not None:
            changes[name] = _convert(name, kinds[name], given)
    return replace(settings, **changes)  # type: ignore[arg-type]


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(ENABLED_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def environment_of(settings: CaptureSettings) -> dict[str, str]:
    """The environment that gives ``settings`` to a child process that installs capture."""
    out: dict[str, str] = {}
    for name, var in _ENV.items():
        value = getattr(settings, name)
        if value is None:
            continue
        out[var] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out
