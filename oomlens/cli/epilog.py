"""``oomlens epilog``: the SLURM Epilog mode (see docs/epilog.md).

Meant to be run by ``contrib/slurm/oomlens-epilog.sh`` from ``slurm.conf``'s ``Epilog=`` or
``EpilogSlurmctld=``.  It reads the job from the environment and always exits 0: a failing
Epilog drains the node.  ``--check`` is for admins: it validates the settings file, prints the
effective settings, and exits 2 when they are invalid.  ``--sweep`` is for cron: it finishes
the analyses the Epilog deferred or cut short (:mod:`oomlens.epilog.sweep`); it exits 0 when
it ran, whatever became of the jobs, and 2 for a bad settings file, option or spool.
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
    help="Validate the settings file, print the effective settings, check that the spool takes "
    "files and that job users can run oomlens; exit 2 if anything is wrong.",
)
@click.option(
    "--as-user",
    default=None,
    metavar="USER",
    help="--check: the unprivileged user to try oomlens as  [default: nobody]",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Instead, analyze the jobs whose Epilog deferred a big snapshot or stopped at its "
    "budget (for cron, as root); exits 0 when it ran, 2 for a bad settings file or spool.",
)
@click.option(
    "--budget-per-job",
    default=None,
    metavar="SECONDS",
    help="--sweep: seconds each job's analysis may take  [default: 300]",
)
@click.option(
    "--max-jobs", default=None, metavar="N", help="--sweep: take at most N jobs this run."
)
@click.option(
    "--max-memory",
    default=None,
    metavar="SIZE",
    help="--sweep: address-space cap of each analysis, e.g. '32 GiB' (0: none)  "
    "[default: the settings' max_memory_bytes]",
)
def epilog(
    settings_path: str,
    spool: str | None,
    hard_limit: str | None,
    check: bool,
    as_user: str | None,
    sweep: bool,
    budget_per_job: str | None,
    max_jobs: str | None,
    max_memory: str | None,
) -> None:
    """Analyze the job that just ended, from a SLURM Epilog. Always exits 0.

    With --sweep, finish the analyses the Epilog deferred (see docs/epilog.md, "Sweeper").
    """
    if sweep:
        _sweep(settings_path, spool, hard_limit, check, budget_per_job, max_jobs, max_memory)
        return
    if check:
        _check(settings_path, spool, as_user)
        return
    try:
        from oomlens.epilog.runner import run_epilog

        outcome = run_epilog(
            os.environ,
            settings_path=settings_path,
            spool_override=spool,
            hard_limit=hard_limit,
            started=_STARTED,
        )
        click.echo(outcome.summary_line(), err=True)
    except BaseException:  # noqa: BLE001, S110 - the Epilog must exit 0, whatever happened
        pass


def _sweep(
    settings_path: str,
    spool: str | None,
    hard_limit: str | None,
    check: bool,
    budget_per_job: str | None,
    max_jobs: str | None,
    max_memory: str | None,
) -> None:
    """Run the sweeper; raises UsageError (exit 2) for bad options, settings or spool."""

    from oomlens.epilog.settings import load_settings, with_spool
    from oomlens.epilog.sweep import DEFAULT_BUDGET_PER_JOB, SweepOutcome, sweep_spool
    from oomlens.errors import UsageError
    from oomlens.units import parse_size

    if check or hard_limit is not None:
        raise UsageError("--sweep takes neither --check nor --hard-limit (they are the Epilog's)")
    budget = DEFAULT_BUDGET_PER_JOB
    if budget_per_job is not None:
        try:
            budget = float(budget_per_job)
        except ValueError:
            budget = -1.0
        if not 1.0 <= budget <= 86400.0:
            raise UsageError(
                f"--budget-per-job {budget_per_job!r}: give a number of seconds from 1 to 86400"
            )
    jobs: int | None = None
    if max_jobs is not None:
        if not (max_jobs.isascii() and max_jobs.isdigit()) or int(max_jobs) < 1:
            raise UsageError(f"--max-jobs {max_jobs!r}: give a whole number of jobs, at least 1")
        jobs = int(max_jobs)
    memory: int | None = None
    if max_memory is not None:
        try:
            memory = parse_size(max_memory)
        except ValueError:
            memory = -1
        if memory < 0:
            raise UsageError(f"--max-memory {max_memory!r}: give a size such as '32 GiB', or 0")
    settings = load_settings(settings_path)
    if spool is not None:
        settings = with_spool(settings, spool)

    def report(outcome: SweepOutcome) -> None:
        click.echo(outcome.summary_line(), err=True)

    run = sweep_spool(
        settings, budget_per_job=budget, max_jobs=jobs, max_memory_bytes=memory, report=report
    )
    if run.left:
        click.echo(
            f"oomlens sweep: {run.left} pending job(s) left for the next sweep (--max-jobs)",
            err=True,
        )


def _check(settings_path: str, spool: str | None, as_user: str | None) -> None:
    from pathlib import Path

    from oomlens.epilog.preflight import check_runs_as_user, check_spool
    from oomlens.epilog.settings import load_settings, with_spool
    from oomlens.errors import UsageError

    try:
        settings = load_settings(settings_path)
        if spool is not None:
            settings = with_spool(settings, spool)
    except UsageError as exc:
        click.echo(f"oomlens: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    if not Path(settings_path).exists():
        click.echo(f"# {settings_path} does not exist: these are the defaults", err=True)
    for key, value in settings.describe().items():
        click.echo(f"{key} = {_toml_value(value)}")
    findings = [check_spool(settings), check_runs_as_user(as_user)]
    for finding in findings:
        click.echo(f"# {'ok' if finding.ok else 'PROBLEM'}: {finding.what}", err=not finding.ok)
    if not all(finding.ok for finding in findings):
        sys.exit(2)


def _toml_value(value: object) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(item) for item in value) + "]"
    return json.dumps(value)
