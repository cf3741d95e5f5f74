"""``oomlens triage``: one table of every run under a tree; ``oomlens triage merge``."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from oomlens.cli.params import output_width
from oomlens.errors import NoUsableInputError, UsageError
from oomlens.triage.pool import default_jobs
from oomlens.triage.shard import Shard
from oomlens.units import parse_size
from oomlens.untrusted import one_line

# The engine, pandas and the analysis are imported inside the commands: every other oomlens
# command imports this module too, and must start fast.

DEFAULT_STORE = "oomlens-triage.sqlite"


def default_store(outputs: tuple[str, ...], shard: Shard | None) -> str:
    """Where results are kept when ``--store`` is not given: beside the first ``-o`` output,
    else in the user's cache directory (``$XDG_CACHE_HOME/oomlens``, ``~/.cache/oomlens``),
    never unasked in the current directory.  Shards get a store each."""
    name = DEFAULT_STORE
    if shard is not None:
        name = f"oomlens-triage.shard-{shard.index}-of-{shard.count}.sqlite"
    if outputs:
        return os.path.join(os.path.dirname(os.path.abspath(outputs[0])), name)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "oomlens")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, name)


class _TriageGroup(click.Group):
    """``oomlens triage DIR...`` runs the ``run`` subcommand; ``oomlens triage merge`` merges."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_TriageGroup, context_settings={"help_option_names": ["-h", "--help"]})
def triage_command() -> None:
    """One table of every run under a tree: which died of what, grouped, newest first.

    oomlens triage DIR... triages (the same as oomlens triage run DIR...; see its --help);
    oomlens triage merge TABLE... joins the tables of a job array's shards.
    """


class _Bar:
    """The progress bar on stderr, shown only when stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None

    def start(self, phase: str, total: int) -> None:
        self.finish()
        if self._enabled and total:
            self._bar = click.progressbar(
                length=total, label=phase.ljust(9), file=sys.stderr, show_pos=True, show_eta=True
            )
            self._bar.__enter__()

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _shard(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Shard | None:
    try:
        return None if value is None else Shard.parse(value)
    except UsageError as exc:
        raise click.BadParameter(exc.message) from exc


def _size(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@triage_command.command("run")
@click.argument("directories", metavar="DIR...", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    "outputs",
    multiple=True,
    metavar="FILE",
    help="Write the table here; the extension picks the format: .csv, .jsonl, .parquet, "
    ".sqlite, .html (an index linking each run's report). Repeatable.",
)
@click.option(
    "--reports",
    "reports_dir",
    metavar="DIR",
    help="Write each run's HTML report into DIR (the HTML index links to them).",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=default_jobs,
    show_default="the number of cores",
    help="Runs analyzed at once, each in its own process.",
)
@click.option(
    "--store",
    metavar="FILE",
    help=f"The SQLite store of results that makes re-runs incremental [default: {DEFAULT_STORE}"
    " beside the first -o output, else in ~/.cache/oomlens; one per shard].",
)
@click.option(
    "--no-store", is_flag=True, help="Keep no results: analyze everything, store nothing."
)
@click.option(
    "--shard",
    metavar="K/N",
    callback=_shard,
    help="Take run K of N's deterministic share of the runs (a SLURM array: "
    "--array=1-N with --shard $SLURM_ARRAY_TASK_ID/N).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Stop a run's analysis after this long; it becomes a row with the error.",
)
@click.option(
    "--max-memory",
    callback=_size,
    metavar="SIZE",
    help="Limit each worker process' address space (e.g. 8GiB).",
)
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="Analyze every run with this ds_config instead of its own.",
)
@click.option("--retry-errors", is_flag=True, help="Analyze again the runs that failed last time.")
@click.option(
    "--deepspeed/--no-deepspeed",
    default=False,
    show_default=True,
    help="Validate configs with DeepSpeed's own models when it is installed (imports torch: "
    "seconds and gigabytes more; oomlens' own checks stand in by default).",
)
@click.option(
    "--title", default="oomlens triage", show_default=True, help="The HTML index's title."
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def run_command(
    directories: tuple[str, ...],
    outputs: tuple[str, ...],
    reports_dir: str | None,
    jobs: int,
    store: str | None,
    no_store: bool,
    shard: Shard | None,
    timeout: float,
    max_memory: int | None,
    config: str | None,
    retry_errors: bool,
    deepspeed: bool,
    title: str,
    quiet: bool,
) -> None:
    """Find the runs under DIR... (any folder holding a training log, with its snapshots,
    configs and per-rank logs), analyze them in parallel, and make one table: run, path, time,
    verdict, top diagnosis, confidence, first failed rank, the key numbers, and the error of
    runs that could not be read.  Results are kept in a SQLite store, so the next run analyzes
    only what is new or changed.

    Combine the tables of a job array's shards with: oomlens triage merge TABLE... -o FILE
    """
    from oomlens.triage.engine import TriageOptions, triage
    from oomlens.triage.outputs import check_outputs, write_table
    from oomlens.triage.summary import render_summary
    from oomlens.untrusted import shown

    check_outputs(outputs)
    if store is not None and no_store:
        raise UsageError("--store and --no-store contradict each other; give one")
    if no_store:
        store_path = None
    elif store is not None:
        store_path = store
    else:
        store_path = default_store(tuple(outputs), shard)
    options = TriageOptions(
        jobs=jobs,
        timeout=timeout,
        store=store_path,
        shard=shard,
        reports_dir=reports_dir,
        config=config,
        retry_errors=retry_errors,
        memory_limit=max_memory,
        deepspeed=deepspeed,
    )
    result = triage(directories, options, progress=_Bar(not quiet))
    for warning in result.warnings:
        click.echo(f"oomlens: warning: {shown(warning)}", err=True)
    if result.found == 0:
        skipped = (
            f"; {len(result.warnings)} skipped, see the warnings above" if result.warnings else ""
        )
        raise NoUsableInputError(
            f"no runs found under {', '.join(directories)}: no directory there holds a training"
            f" log (a .log, .out or .err file, or text with a training-log marker){skipped}"
        )
    for output in outputs:
        write_table(result.table, output, title=title)
    if not quiet:
        click.echo(render_summary(result.table, width=output_width(None)), nl=False)
        share = f" (shard {shard.index}/{shard.count} of {result.found})" if shard else ""
        click.echo(
            f"oomlens: {len(result.table)} run{'' if len(result.table) == 1 else 's'}{share}: "
            f"{result.analyzed} analyzed,"
            f" {result.reused} unchanged, in {result.seconds:.1f} s"
            + (f"; wrote {', '.join(map(one_line, outputs))}" if outputs else ""),
            err=True,
        )


@triage_command.command("merge")
@click.argument("tables", metavar="TABLE...", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    "outputs",
    multiple=True,
    metavar="FILE",
    help="Write the merged table here (.csv, .jsonl, .parquet, .sqlite, .html). Repeatable.",
)
@click.option(
    "--title", default="oomlens triage", show_default=True, help="The HTML index's title."
)
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
def merge_command(
    tables: tuple[str, ...], outputs: tuple[str, ...], title: str, quiet: bool
) -> None:
    """Merge the tables written by the shards of a job array (oomlens triage --shard K/N -o
    TABLE) into one, as a single run over the whole tree would have made it."""
    from oomlens.triage.merge import merge_runs
    from oomlens.triage.outputs import check_outputs, write_table
    from oomlens.triage.summary import render_summary
    from oomlens.untrusted import shown

    check_outputs(outputs)
    merged = merge_runs(tables)
    if not merged.repeated.empty:
        first = merged.repeated.iloc[0]
        count = len(merged.repeated)
        click.echo(
            f"oomlens: warning: {count} row{'s' if count != 1 else ''} left out: the same run"
            f" (run and path) as a newer row, first {shown(str(first['run']))}"
            f" at {shown(str(first['path']))}",
            err=True,
        )
    for output in outputs:
        write_table(merged.table, output, title=title)
    if not quiet:
        click.echo(render_summary(merged.table, width=output_width(None)), nl=False)
