"""``oomlens fix INPUT... --write DIR``: the top fix of the analysis, written as files the run
can use (``oomlens.applyfix``), and the run's command with it applied.

Exit status: 0 when the fix was written; 2 for a bad option or no fix to write; 3 for inputs
that cannot be read (as ``analyze``).
"""

from __future__ import annotations

import click

from oomlens.untrusted import one_line


@click.command("fix")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--config", type=click.Path(), default=None, help="The ds_config the run used.")
@click.option(
    "--command",
    "run_command",
    default=None,
    metavar="CMD",
    help="The run's command line: its arguments are rewritten with the fix's values "
    "(an argument it does not have is not added).",
)
@click.option(
    "--one-run",
    is_flag=True,
    default=False,
    help="Read a directory as one run even when it holds several (as analyze).",
)
@click.option(
    "--write",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for the patched ds_config.json, fix.env, command.txt and fix.json (created).",
)
def fix_command(
    inputs: tuple[str, ...],
    config: str | None,
    run_command: str | None,
    one_run: bool,
    out_dir: str,
) -> None:
    """Write the top fix for the run as files, and print the changed command line."""
    from oomlens.applyfix import apply_fix
    from oomlens.cli.analyze import refuse_several_runs
    from oomlens.ingest.files import spooled_streams
    from oomlens.session import analyze

    # the inputs as analyze reads them: a stream read once, a folder of several runs refused
    with spooled_streams(list(inputs)) as (paths, _):
        if not one_run:
            for path in paths:
                refuse_several_runs(path)
        report = analyze(paths, config=config)
    applied = apply_fix(report, out_dir, run_command)
    click.echo(f"fix for {applied.diagnosis.id}: {one_line(applied.fix.summary)}")
    for path in applied.written:
        click.echo(f"  wrote {one_line(path)}")
    if applied.command is not None:
        click.echo(f"  command: {one_line(applied.command)}")
    for note in applied.notes:
        click.echo(f"  note: {one_line(note)}")
