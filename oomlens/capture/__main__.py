"""``python -m oomlens.capture [OPTIONS] SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``): run a
training script with the capture on, exactly as ``python SCRIPT ARGS`` would run it.

Works as the program of every launcher: ``torchrun ... -m oomlens.capture train.py``,
``deepspeed --module oomlens.capture train.py`` (its ``--local_rank=N``, which the DeepSpeed
launcher puts before the script, is handed to the script), ``accelerate launch -m
oomlens.capture train.py``.

The script sees ``sys.argv`` as ``[SCRIPT, ARGS...]``, its own directory first on
``sys.path`` and ``__name__ == "__main__"``.  Its exceptions are printed as Python would print
them (without this wrapper's frames) and exit with status 1; ``sys.exit`` codes pass through.
"""

from __future__ import annotations

import os
import runpy
import sys
import textwrap
from dataclasses import dataclass
from types import TracebackType

from oomlens.capture.settings import ENVIRONMENT, CaptureSettings


@dataclass(frozen=True, slots=True)
class _Option:
    flag: str
    setting: str
    metavar: str
    help: str
    value: object = None
    """For a flag without a value: the setting it sets."""


OPTIONS: tuple[_Option, ...] = (
    _Option("--dir", "directory", "DIR", "parent of the per-run capture directory"),
    _Option(
        "--run",
        "run",
        "NAME",
        "the run directory's name, by default slurm-<job id>, torchrun-<run id> or the "
        "launcher's start time and pid",
    ),
    _Option("--max-mb", "max_mb", "MB", "disk budget per rank, all files together"),
    _Option("--max-entries", "max_entries", "N", "allocator trace entries kept, the newest"),
    _Option(
        "--stacks-at",
        "stacks_at",
        "FRACTION",
        "record Python stacks once peak reserved memory reaches this fraction of the limit, "
        "0 from the start, 1 never",
    ),
    _Option("--interval", "interval", "S", "seconds between host memory samples"),
    _Option("--step-interval", "step_interval", "S", "at most one step sample per S seconds"),
    _Option(
        "--no-history",
        "history",
        "",
        "do not record the allocator's history: the snapshot then has no trace",
        False,
    ),
    _Option(
        "--no-sentinel",
        "sentinel",
        "",
        "start no watcher process: a kernel OOM kill then leaves no record",
        False,
    ),
)
"""The options, their settings (``oomlens.capture.settings.CaptureSettings``) and their help:
one table for the parser and both help texts (``python -m oomlens.capture`` and ``oomlens
capture``, which hands its arguments to ``main``)."""
_BY_FLAG = {option.flag: option for option in OPTIONS}

PROGRAM = "python -m oomlens.capture"
_HELP_WIDTH = 88


def usage(prog: str = PROGRAM) -> str:
    """The usage line(s), every option named."""
    head = f"usage: {prog} "
    words = [f"[{o.flag} {o.metavar}]" if o.metavar else f"[{o.flag}]" for o in OPTIONS]
    words += ["SCRIPT [ARGS...] | -m MODULE [ARGS...]"]
    lines = [head]
    for word in words:
        if len(lines[-1]) + len(word) > 95 and lines[-1].strip():
            lines.append(" " * len(head))
        lines[-1] += word + " "
    return "\n".join(line.rstrip() for line in lines)


def _described(option: _Option) -> str:
    """The option's help with its default and its environment variable, from ``settings``
    (the one place they are defined)."""
    variable = ENVIRONMENT[option.setting]
    if not option.metavar:
        return f"{option.help} ({variable}={int(bool(option.value))})"
    default = getattr(CaptureSettings(), option.setting)
    if default is None:
        return f"{option.help} ({variable})"
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{option.help} (default {shown}; {variable})"


def help_text(prog: str = PROGRAM) -> str:
    """``--help``: what the command does, its arguments and every option."""
    rows = [(f"{o.flag} {o.metavar}".strip(), _described(o)) for o in OPTIONS]
    rows.append(("-h, --help", "show this help and exit"))
    width = max(len(name) for name, _ in rows) + 2
    options = "\n".join(
        textwrap.fill(
            text,
            _HELP_WIDTH,
            initial_indent=f"  {name.ljust(width)}",
            subsequent_indent=" " * (width + 2),
            break_on_hyphens=False,
        )
        for name, text in rows
    )
    return (
        f"{usage(prog)}\n\n"
        "Run a training script (or, with -m, a module) with oomlens capture on, exactly as\n"
        "python would run it: same argv, exceptions and exit status. Each rank writes its\n"
        "events, memory series, an allocator snapshot at the OOM and, when it is killed, the\n"
        "kernel's lines, into DIR/<run>/; after a crash: oomlens analyze DIR/<run>.\n"
        "As a launcher's program: torchrun ... -m oomlens.capture train.py ARGS,\n"
        "deepspeed --module oomlens.capture train.py ARGS (its --local_rank is handed to the\n"
        "script), accelerate launch -m oomlens.capture train.py ARGS.\n\n"
        "arguments:\n"
        "  SCRIPT [ARGS...]    the training script and its arguments (the first argument that is\n"
        "                      not an option; -- ends the options)\n"
        "  -m MODULE [ARGS...] run a module as python -m does\n\n"
        f"options (each also an environment variable, which every rank inherits):\n{options}\n\n"
        "OOMLENS_CAPTURE=0 turns the capture off; the script then runs alone.\n"
    )


class UsageError(Exception):
    """A bad command line; the message says what (empty: none, only the usage)."""


class HelpRequested(Exception):
    """``-h``/``--help`` before the script: print the help, exit 0."""


def parse(argv: list[str]) -> tuple[dict[str, object], list[str], str | None, list[str]]:
    """``(settings, passthrough, module, target_args)``: our options, the launcher's
    ``--local_rank`` arguments to give the script, ``-m``'s module (or None), and
    ``[SCRIPT, ARGS...]`` / ``[ARGS...]``."""
    settings: dict[str, object] = {}
    passthrough: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, eq, value = arg.partition("=")
        option = _BY_FLAG.get(name)
        if option is not None and option.metavar:
            if not eq:
                index += 1
                if index >= len(argv):
                    raise UsageError(f"{name} needs a value")
                value = argv[index]
            settings[option.setting] = value
        elif option is not None and not eq:
            settings[option.setting] = option.value
        elif name in ("--local_rank", "--local-rank"):
            if not eq:
                index += 1
                if index >= len(argv):
                    raise UsageError(f"{name} needs a value")
                arg = f"{name}={argv[index]}"
            passthrough.append(arg)
        elif arg == "-m":
            if index + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return settings, passthrough, argv[index + 1], argv[index + 2 :]
        elif arg in ("-h", "--help"):
            raise HelpRequested
        elif arg == "--":
            index += 1
            break
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg}")
        else:
            break
        index += 1
    target = argv[index:]
    if not target:
        raise UsageError("no script given")
    return settings, passthrough, None, target


def _strip_own_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on (this wrapper's and runpy's dropped)."""
    here = os.path.dirname(os.path.abspath(__file__))
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if (
            os.path.dirname(filename) == here
            or filename.endswith((os.sep + "runpy.py", "<frozen runpy>"))
            or tb.tb_frame.f_code.co_filename == "<frozen runpy>"
        ):
            tb = tb.tb_next
            continue
        break
    return tb


def main(argv: list[str] | None = None, prog: str = PROGRAM) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the script under capture; ``prog``
    names the command in the usage and help (``oomlens capture`` when run from the CLI).
    A bad command line exits 2 (the usage on stderr), ``--help`` 0 (the help on stdout);
    otherwise the script's own status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings, passthrough, module, target = parse(args)
    except HelpRequested:
        sys.stdout.write(help_text(prog))
        sys.stdout.flush()
        sys.exit(0)
    except UsageError as exc:
        if str(exc):
            sys.stderr.write(f"oomlens capture: {exc}\n")
        sys.stderr.write(usage(prog) + f"\n(more: {prog} --help)\n")
        sys.exit(2)

    if module is None and not os.path.isfile(target[0]):
        sys.stderr.write(f"oomlens capture: can't open file {target[0]!r}: no such file\n")
        sys.exit(2)

    if module is not None:
        sys.argv = [module, *passthrough, *target]
    else:
        script = target[0]
        sys.argv = [script, *passthrough, *target[1:]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))

    from oomlens.capture.recorder import start

    recorder = start(None, settings)
    code: int | None = 0
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(sys.argv[0]), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if recorder is not None:
            recorder.end(code)
        raise
    except KeyboardInterrupt as exc:
        if recorder is not None:
            recorder.record_exception(exc.with_traceback(_strip_own_frames(exc.__traceback__)))
        raise
    except BaseException as exc:  # noqa: BLE001 - printed as Python would, then status 1
        tb = _strip_own_frames(exc.__traceback__)
        exc = exc.with_traceback(tb)
        if recorder is not None:
            recorder.record_exception(exc)
        sys.excepthook(type(exc), exc, tb)
        if recorder is not None:
            recorder.end(1)
        sys.exit(1)
    if recorder is not None:
        recorder.end(0)


if __name__ == "__main__":
    main()
