"""``oomlens epilog --check``: what an admin must know before putting the Epilog in slurm.conf.

Two things fail silently later, on every job, when they are wrong at install time:

* the spool: it must exist (or be creatable), belong to root (or this user), not be writable by
  others, and take a new file;
* the installation itself: the Epilog analyses each job *as the job's user*, and admins analyse
  by hand with ``runuser -u alice -- oomlens analyze ...``.  A venv built from an interpreter
  under ``/root`` (pyenv, conda) works for root and for nobody else.  The check runs this very
  interpreter as an unprivileged user and, when that fails, names the first directory on the
  way that the user cannot enter.

Each check gives one :class:`Finding`; none raises.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from oomlens.epilog.settings import EpilogSettings
from oomlens.epilog.spool import SpoolError, open_spool

_PROBE_TIMEOUT_S = 30.0
_PROBE = "import oomlens.cli, oomlens.session; print('ok')"


@dataclass(frozen=True, slots=True)
class Finding:
    ok: bool
    what: str
    """One line: what was checked and what was found (and, when not ok, what to do)."""


def check_spool(settings: EpilogSettings) -> Finding:
    """The spool directory exists (created when missing), is safe, and takes a new file."""
    spool = settings.spool_dir
    try:
        fd = open_spool(spool)
    except SpoolError as exc:
        return Finding(False, f"spool: {exc}")
    try:
        probe = f".oomlens-check.{os.getpid()}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            created = os.open(probe, flags, 0o600, dir_fd=fd)
            os.close(created)
            os.unlink(probe, dir_fd=fd)
        except OSError as exc:
            reason = exc.strerror or exc
            return Finding(
                False, f"spool: {spool}: cannot create a file in it ({reason}); fix its permissions"
            )
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return Finding(
        True,
        f"spool: {spool} is writable (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})",
    )


def check_runs_as_user(user: str | None = None) -> Finding:
    """This interpreter and oomlens run for an unprivileged user (``nobody`` by default).

    As root the interpreter is really started as that user; otherwise (nobody to switch to)
    the path's permission bits for others are read instead.
    """
    executable = os.path.realpath(sys.executable)
    blocked = first_blocked_path([executable, *_package_dirs()])
    if os.geteuid() != 0:
        if blocked:
            return Finding(False, _blocked_message(blocked, user or "other users"))
        return Finding(True, f"install: {executable} and oomlens are readable by other users")
    name = user or "nobody"
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        return Finding(False, f"install: no user {name!r} to test with; give --as-user USER")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=[],
        )
    except subprocess.TimeoutExpired:
        return Finding(
            False, f"install: oomlens did not start as {name} within {_PROBE_TIMEOUT_S:.0f} s"
        )
    except OSError as exc:
        reason = exc.strerror or exc
        advice = _blocked_message(blocked, name)
        return Finding(
            False, f"install: cannot start {sys.executable} as {name} ({reason}); {advice}"
        )
    if done.returncode == 0 and done.stdout.strip() == "ok":
        return Finding(True, f"install: {sys.executable} runs oomlens as {name}")
    detail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    advice = _blocked_message(blocked, name) if blocked else "reinstall oomlens readable by all"
    return Finding(False, f"install: oomlens fails as {name} ({detail}); {advice}")


def first_blocked_path(paths: list[str]) -> str | None:
    """The first directory on the way to any of ``paths`` (or the file itself) that others
    cannot enter or read; None when every one is open to them."""
    for target in paths:
        walked = Path("/")
        for part in Path(target).parts[1:]:
            walked = walked / part
            try:
                mode = os.stat(walked).st_mode
            except OSError:
                break
            needed = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
            if not mode & needed:
                return str(walked)
    return None


def _package_dirs() -> list[str]:
    import oomlens

    return [os.path.realpath(os.path.dirname(oomlens.__file__))]


def _blocked_message(blocked: str | None, who: str) -> str:
    if not blocked:
        return "install it with a system interpreter into a directory all users can read"
    return (
        f"{blocked} is not open to {who}: install with a system interpreter "
        "(e.g. /usr/bin/python3 -m venv /opt/oomlens), not one under /root (pyenv, conda)"
    )
