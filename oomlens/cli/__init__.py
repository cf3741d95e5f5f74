"""Command-line entry point; one module per command. Domain errors are caught here, once."""

from __future__ import annotations

import sys

import click

from oomlens import __version__
from oomlens.cli.check import check
from oomlens.errors import ExitCode, OomlensError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="oomlens")
def cli() -> None:
    """Post-mortem analyzer for GPU out-of-memory crashes in PyTorch and DeepSpeed training."""


cli.add_command(check)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; turn every oomlens error into one line on stderr and its exit code."""
    try:
        cli.main(args=argv, prog_name="oomlens", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("oomlens: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE)
    except OomlensError as exc:
        click.echo(f"oomlens: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(ExitCode.OK)
