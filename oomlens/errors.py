"""One error hierarchy for the whole package; the CLI catches it once and exits with its code.

Every message names the file (when there is one), what is wrong, and what to do about it, in
one line, because it is printed as the only output of a failed command.
"""

from __future__ import annotations

from enum import IntEnum

from oomlens.untrusted import one_line


class ExitCode(IntEnum):
    """Documented process exit codes (see README, "Exit codes")."""

    OK = 0
    """The analysis finished, whatever the verdict."""
    INTERNAL = 1
    """A bug in oomlens: an unexpected exception (reported without a traceback)."""
    USAGE = 2
    """Bad command line: unknown option, missing argument, unreadable option value."""
    NO_INPUT = 3
    """None of the inputs could be read or recognised: nothing to analyze."""
    CHECK_FAILED = 4
    """``oomlens check``: the config is invalid or cannot fit in the memory given."""
    INTERRUPTED = 130
    """Interrupted by the user (SIGINT)."""


class OomlensError(Exception):
    """Base of every error oomlens raises on purpose; carries the exit code to use."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        """The one line to show: without the control characters, tabs and line feeds that a
        file's name or an input's text put in it (an exception's text about a hostile pickle
        quotes its bytes)."""
        return one_line(str(self.args[0])) if self.args else self.__class__.__name__


class UsageError(OomlensError):
    """The command line or a settings file is wrong."""

    exit_code = ExitCode.USAGE


class InputError(OomlensError):
    """One input file cannot be read or parsed.

    Raised by parsers; the caller records it against that input and goes on with the others.
    The message must start with the file's path.
    """

    exit_code = ExitCode.NO_INPUT

    def __init__(self, path: str, problem: str, hint: str = "") -> None:
        text = f"{path}: {problem}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)
        self.path = path
        self.problem = problem
        self.hint = hint


class NoUsableInputError(OomlensError):
    """Nothing among the inputs could be read or recognised."""

    exit_code = ExitCode.NO_INPUT


class ResourceLimitError(InputError):
    """An input would need more memory or time than the configured limit allows."""
