"""``oomlens capture [OPTIONS] SCRIPT [ARGS...]``: ``python -m oomlens.capture`` as a command
of the CLI.

The arguments go, untouched, to the capture's own parser (``oomlens.capture.__main__``): the
options, their meaning and ``--help`` are the same by construction, and everything from the
script on (``--help`` included) is the script's, as with ``python SCRIPT ARGS``.  The script
runs in this process, so it sees exactly the environment it was given (see ``main``: the CLI's
own settings for its analyses are not applied to it).
"""

from __future__ import annotations

import os

import click

from oomlens.capture import __main__ as capture_main


@click.command(
    "capture",
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": [],
    },
    # the options are the capture parser's: its help lists them (oomlens capture --help)
    add_help_option=False,
    short_help="Run a training script with capture on (python -m oomlens.capture).",
)
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def capture_command(cli_defaults: dict[str, str] | None, arguments: tuple[str, ...]) -> None:
    """Run a training script with oomlens capture on, exactly as python runs it; the next
    crash leaves what oomlens analyze needs. Options: oomlens capture --help."""
    for name, value in (cli_defaults or {}).items():
        # set by oomlens.cli.main for its own analyses, not by the user: not the training's
        if os.environ.get(name) == value:
            del os.environ[name]
    capture_main.main(list(arguments), prog="oomlens capture")
