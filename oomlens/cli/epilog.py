"""``oomlens epilog``: the SLURM Epilog mode (see docs/epilog.md).

Meant to be run by ``contrib/slurm/oomlens-epilog.sh`` from ``slurm.conf``'s ``Epilog=`` or
``EpilogSlurmctld=``.  It reads the job from the environment and always exits 0: a failing
Epilog drains the node.  ``--check`` is for admins: it validates the settings file, prints the
effective settings, and exits 2 when they are invalid.
"""

from __future__ import annotations

import os
import sys
import time

import click


def _process_started() -> float:
    """When this process was exec'd, on the ``time.monotonic()`` clock (the budget counts from
    there, interpreter start-up included); now, when /proc cannot tell."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of stat(5), counted after the command name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 600 else now


_STARTED = _process_started()


@click.command("epilog")
@click.option(
    "--settings",
    "settings_path",
    default="/etc/oomlens/epilog.toml",
    show_default=True,
    metavar="FILE",
    help="The site's Epilog settings (TOML); a missing file means the defaults.",
)
@click.option("--spool", default=None, metavar="DIR", help="Spool directory (overrides spool_dir).")
@click.option(
    "--hard-limit",
    default=None,
    metavar="SECONDS",
    help="When the caller kills this process; oomlens plans to be done 2 s earlier.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Validate the settings file, print the effective settings, exit 2 if invalid.",
)
def epilog(settings_path: str, spool: str | None, hard_limit: str | None, check: bool) -> None:
    """Analyze the job that just ended, from a SLURM Epilog. Always exits 0."""
    if check:
        _check(settings_path, spool)
        return
    try:
        from oomlens.epilog.runner import run_epilog

        limit: float | None = None
        if hard_limit is not None:
            try:
                limit = float(hard_limit)
            except ValueError:
                limit = None
        outcome = run_epilog(
            os.environ,
            settings_path=settings_path,
            spool_override=spool,
            hard_limit=limit,
            started=_STARTED,
        )
        click.echo(outcome.summary_line(), err=True)
    except BaseException:  # noqa: BLE001, S110 - the Epilog must exit 0, whatever happened
        pass


def _check(settings_path: str, spool: str | None) -> None:
    from dataclasses import replace
    from pathlib import Path

    from oomlens.epilog.settings import load_settings
    from oomlens.errors import UsageError

    try:
        settings = load_settings(settings_path)
    except UsageError as exc:
        click.echo(f"oomlens: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    if spool is not None:
        settings = replace(settings, spool_dir=Path(spool))
    if not Path(settings_path).exists():
        click.echo(f"# {settings_path} does not exist: these are the defaults", err=True)
    for key, value in settings.describe().items():
        click.echo(f"{key} = {_toml_value(value)}")


def _toml_value(value: object) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(item) for item in value) + "]"
    return json.dumps(value)
