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
from types import TracebackType

USAGE = (
    "usage: python -m oomlens.capture [--dir DIR] [--run NAME] [--max-mb MB] [--max-entries N]\n"
    "                                 [--stacks-at FRACTION] [--interval S] [--no-history]\n"
    "                                 [--no-sentinel] SCRIPT [ARGS...] | -m MODULE [ARGS...]"
)
_OPTIONS = {
    "--dir": "directory",
    "--run": "run",
    "--max-mb": "max_mb",
    "--max-entries": "max_entries",
    "--stacks-at": "stacks_at",
    "--interval": "interval",
    "--step-interval": "step_interval",
}
_FLAGS = {"--no-history": ("history", False), "--no-sentinel": ("sentinel", False)}


class UsageError(Exception):
    pass


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
        if name in _OPTIONS:
            if not eq:
                index += 1
                if index >= len(argv):
                    raise UsageError(f"{name} needs a value")
                value = argv[index]
            settings[_OPTIONS[name]] = value
        elif arg in _FLAGS:
            key, flag = _FLAGS[arg]
            settings[key] = flag
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
            raise UsageError("")
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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings, passthrough, module, target = parse(args)
    except UsageError as exc:
        if str(exc):
            sys.stderr.write(f"oomlens capture: {exc}\n")
        sys.stderr.write(USAGE + "\n")
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
