"""``oomlens analyze INPUT...``: what killed the run, on which rank, with the evidence and
the fix."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from oomlens.cli.params import COUNT, JOBS, SIZE, WIDTH_HELP, Progress, output_width
from oomlens.errors import OomlensError, UsageError
from oomlens.ingest.files import NamedStream, spooled_streams
from oomlens.render.registry import Format
from oomlens.rules.thresholds import load_thresholds
from oomlens.untrusted import one_line

if TYPE_CHECKING:
    from oomlens.report import Report
    from oomlens.triage.walk import RunSpec


def write_output(path: str, text: str) -> None:
    """Write a report as triage writes its tables (``oomlens.render.output``): never left
    half-written, and a device or FIFO (``/dev/null``) written in place, never replaced."""
    from oomlens.render.output import write_text

    write_text(path, text)


def refuse_several_runs(path: str) -> None:
    """Raise ``UsageError`` when ``path`` is a directory that holds more than one run, as
    ``oomlens triage`` tells runs apart: read as one, their logs, snapshots and configs would
    be mixed into one confident answer that is neither run's."""
    if not os.path.isdir(path):
        return
    from oomlens.triage.adapter import is_training_log
    from oomlens.triage.walk import FileEntry, find_runs, log_by_name

    def is_log(entry: FileEntry) -> bool:
        by_name = log_by_name(os.path.basename(entry.path))
        if by_name is not None:
            return by_name
        try:
            return is_training_log(entry.path)
        except (OomlensError, OSError):
            return False

    try:
        runs = find_runs([path], is_log=is_log).runs
    except OomlensError:
        return  # the analysis reports what is wrong with the directory
    if len(runs) < 2:
        return
    names = [one_line(run.name) for run in runs]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise UsageError(
        f"{one_line(path)}: holds {len(runs)} runs ({shown}); analyze one of them "
        f"({one_run_command(path, runs)}), all of them with oomlens triage "
        f"{shlex.quote(one_line(path))}, or, if they are parts of one job, pass --one-run"
    )


def one_run_command(path: str, runs: Sequence[RunSpec]) -> str:
    """``oomlens analyze ...`` for one of ``runs`` (found under ``path``): the inputs triage
    hands the analysis for it (``RunSpec.inputs``: the run's directory, or its files and
    run-free sub-directories when other runs are nested in it), shown as under ``path``.  Not
    the run's root: a run at ``path`` itself holds the others.  The run with the fewest
    inputs gives the shortest command."""
    run = min(runs, key=lambda r: (len(r.inputs), r.name))
    top = os.path.abspath(path)
    shown = [
        os.path.normpath(os.path.join(path, os.path.relpath(item, top))) for item in run.inputs
    ]
    return "oomlens analyze " + " ".join(shlex.quote(one_line(item)) for item in shown)


def shown_as_named(report: Report, streams: Sequence[NamedStream]) -> Report:
    """``report`` with the file each stream was read from named as the user named the
    stream (``<stdin>`` for ``-``), wherever the report says it."""
    if not streams:
        return report
    from oomlens.render.redact import replace_strings

    def rename(text: str) -> str:
        for stream in streams:
            text = text.replace(stream.path, stream.shown)
        return text

    return replace_strings(report, rename)


@click.command("analyze")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--config",
    "config",
    type=click.Path(),
    default=None,
    help="The ds_config.json the run used (found automatically in run directories).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice([f.value for f in Format]),
    default=None,
    help="Output format (default: from -o's extension, else text).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    default=None,
    help="Write the report to this file instead of standard output.",
)
@click.option(
    "--html",
    "html_output",
    type=click.Path(),
    default=None,
    help="Also write the self-contained HTML report to this file.",
)
@click.option(
    "--redact",
    is_flag=True,
    default=False,
    help="Replace user names, home paths, host names and IP addresses (consistently) in "
    "every output, for reports that leave the organisation.",
)
@click.option(
    "--params",
    type=COUNT,
    default=None,
    help="The model's parameter count (1.3B, 7e9) when the inputs do not say it.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="World size (number of GPUs) when the inputs do not say it.",
)
@click.option("--gpu-memory", type=SIZE, default=None, help="Memory of one GPU (80GiB).")
@click.option("--host-memory", type=SIZE, default=None, help="Memory of one host (512GiB).")
@click.option(
    "--thresholds",
    "thresholds_file",
    type=click.Path(),
    default=None,
    help="TOML file with a [thresholds] table overriding the rules' thresholds.",
)
@click.option(
    "-j",
    "--jobs",
    "jobs",
    type=JOBS,
    default="auto",
    show_default=True,
    help="Processes that scan a large training log (auto: one per core, up to 8). The report "
    "is the same whatever the number.",
)
@click.option(
    "--one-run",
    is_flag=True,
    default=False,
    help="Read a directory as one run even when it holds several (one log per node in "
    "sub-directories, say); without it such a directory is refused.",
)
@click.option(
    "--color/--no-color",
    "colour",
    default=None,
    help="Colour the terminal summary (default: only on a terminal).",
)
@click.option("--width", type=click.IntRange(min=0), default=None, metavar="N", help=WIDTH_HELP)
def analyze_command(
    inputs: tuple[str, ...],
    config: str | None,
    fmt: str | None,
    output: str | None,
    html_output: str | None,
    redact: bool,
    params: int | None,
    gpus: int | None,
    gpu_memory: int | None,
    host_memory: int | None,
    thresholds_file: str | None,
    jobs: int,
    one_run: bool,
    colour: bool | None,
    width: int | None,
) -> None:
    """Analyze what a crashed run left behind: logs (plain or compressed, one per rank or
    combined), snapshot pickles, ds_config files, kernel logs, torchelastic error files, or
    the run's directory. Prints the verdict, the diagnoses with their evidence, and the fix."""
    # Renderers and the analysis are imported when used: `oomlens epilog` and `--help` start
    # without loading them.
    from oomlens.render.output import write_rendered
    from oomlens.render.registry import RenderOptions, render
    from oomlens.session import AnalysisOptions, analyze

    chosen = Format.choose(fmt, output)
    options = AnalysisOptions(
        thresholds=load_thresholds(thresholds_file),
        params=params,
        gpus=gpus,
        gpu_memory=gpu_memory,
        host_memory=host_memory,
        log_jobs=jobs,
        progress=Progress() if sys.stderr.isatty() else None,
    )
    # a stream named (-, /dev/stdin, <(cmd)) is read once, into a file removed after reading
    with spooled_streams(list(inputs)) as (paths, streams):
        if not one_run:
            for path in paths:
                refuse_several_runs(path)
        report = analyze(paths, config=config, options=options)
    report = shown_as_named(report, streams)
    if redact:
        from oomlens.render.redact import redact_report

        report = redact_report(report)
    summary = f"oomlens: {report.verdict.value}{': ' + report.top.id if report.top else ''}"
    # A file is wrapped only when asked (--width): it is read with grep and diff.
    to_file = RenderOptions(redacted=redact, width=width or 0)
    if html_output is not None:
        write_rendered(html_output, report, Format.HTML, to_file)
        click.echo(f"{summary}; HTML report written to {one_line(html_output)}", err=True)
    if output is not None:
        write_rendered(output, report, chosen, to_file)
        click.echo(f"{summary}; report written to {one_line(output)}", err=True)
        return
    use_colour = sys.stdout.isatty() if colour is None else colour
    shown = RenderOptions(colour=use_colour, redacted=redact, width=output_width(width))
    click.echo(render(report, chosen, shown), nl=False)
