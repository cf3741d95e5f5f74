"""Command-line entry point; one module per command. Domain errors are caught here, once."""

from __future__ import annotations

import errno
import os
import sys
from typing import NoReturn

import click

from oomlens import __version__
from oomlens.cli.analyze import analyze_command
from oomlens.cli.capture import capture_command
from oomlens.cli.check import check
from oomlens.cli.epilog import epilog
from oomlens.cli.fix import fix_command
from oomlens.cli.triage import triage_command
from oomlens.cli.whatif import whatif_command
from oomlens.errors import ExitCode, OomlensError
from oomlens.untrusted import one_line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="oomlens")
def cli() -> None:
    """Post-mortem analyzer for GPU out-of-memory crashes in PyTorch and DeepSpeed training."""


cli.add_command(analyze_command)
cli.add_command(capture_command)
cli.add_command(check)
cli.add_command(epilog)
cli.add_command(fix_command)
cli.add_command(triage_command, "triage")
cli.add_command(whatif_command)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; turn every oomlens error into one line on stderr and its exit code."""
    defaults = _one_blas_thread()
    try:
        code = cli.main(args=argv, prog_name="oomlens", standalone_mode=False, obj=defaults)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("oomlens: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE)
    except OomlensError as exc:
        click.echo(f"oomlens: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # The reader went away (``oomlens analyze ... | head``): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.OK)
    except OSError as exc:
        if not _output_failed(exc):
            _internal_error(exc)
        # Standard output could not take the report (a full disk, a read-only file): the
        # output's fault, not a bug; the report is lost, so the line says so.
        click.echo(
            f"oomlens: standard output: cannot write the report ({exc.strerror or exc}); "
            "write it to a file with -o",
            err=True,
        )
        sys.exit(ExitCode.USAGE)
    except Exception as exc:  # noqa: BLE001 - never a traceback: one line and a documented code
        _internal_error(exc)
    sys.exit(code if isinstance(code, int) else ExitCode.OK)


def _one_blas_thread() -> dict[str, str]:
    """numpy's OpenBLAS, unless told otherwise, starts a thread per core when numpy is first
    imported (the commands import it later, not ``oomlens.cli``), and they spin for a while:
    2.3 s of CPU on a 16-core node for an import and a second's sleep, 0.42 s with one.  No
    command does linear algebra, and the SLURM epilog runs on nodes of 128 cores that must not
    pay for it.  A setting of the user's own is kept; children (triage's workers) inherit it.
    Returns the variables set here (``oomlens capture`` takes them back: the training it runs
    keeps the environment it was given)."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return {}
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    return {"OPENBLAS_NUM_THREADS": "1"}


_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
"""What a write to a full, read-only or failing output gives; the commands read their inputs
through readers that report such errors per input, so one that reaches ``main`` is the
output's."""


def _output_failed(exc: OSError) -> bool:
    return exc.errno in _WRITE_ERRORS


def _internal_error(exc: BaseException) -> NoReturn:
    click.echo(
        f"oomlens: internal error: {type(exc).__name__}: {one_line(str(exc))} "
        "(a bug in oomlens; please report it with the command line)",
        err=True,
    )
    sys.exit(ExitCode.INTERNAL)
