"""The analysis process: a forked child that drops to the job's user and has a hard deadline.

The parent (root, in slurmd's Epilog or in the sweeper's cron job) never opens a path the user
controls.  :func:`run_in_child` is the one child runner the Epilog and the sweeper share.  The
child:

1. closes what it inherited, imports the analysis, then drops every privilege to the job's
   uid, gid and groups (as root; it refuses to go on as root for a job whose user is
   unknown), and arranges to die with its parent;
2. caps its address space (``max_memory_bytes``);
3. runs the caller's work as that user (the Epilog's: find and bound the job's inputs with
   :mod:`.inputs`, analyze them with :mod:`.analysis`, and, when the site allows, write the
   reports into the work directory);
4. sends JSON documents back through a pipe and exits with ``os._exit``.

The parent reads that pipe until the deadline, then SIGKILLs the child: a hang, a loop or a
crash in the analysis ends as a recorded status, never as a late Epilog.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import pwd
import resource
import select
import signal
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from oomlens.epilog.analysis import EpilogAnalysis, prepare_analysis
from oomlens.epilog.environment import JobEnvironment
from oomlens.epilog.inputs import plan_inputs, short_hostname
from oomlens.epilog.settings import EpilogSettings
from oomlens.epilog.spool import write_all
from oomlens.errors import NoUsableInputError

Analyzer = Callable[..., EpilogAnalysis]
"""``analyzer(paths, config=..., max_snapshot_bytes=...) -> EpilogAnalysis`` (the adapter,
or a test's double)."""
Send = Callable[[dict[str, Any]], None]
"""Sends one JSON object to the parent; each adds to (overrides keys of) the previous ones."""
ChildWork = Callable[[dict[str, Any], Send], None]
"""``work(payload, send)``: what the child does once it is the job's user.  It fills
``payload`` (JSON-ready values; ``status`` last, a :class:`WorkerStatus`), and may ``send`` it
early so that the parent keeps what was found even if the work never ends.  What it raises
becomes ``analysis_failed``."""

MAX_RESULT_BYTES = 64 * 1024**2
"""A larger answer from the child is cut off and recorded as a failure."""
_PR_SET_PDEATHSIG = 1
_REAP_SECONDS = 0.5
_MAX_FD = 65536


class WorkerStatus:
    """What became of the analysis process (strings, as written to ``epilog.json``)."""

    ANALYZED = "analyzed"
    NO_INPUT = "no_input"
    REFUSED = "refused"
    ANALYSIS_FAILED = "analysis_failed"
    TIMED_OUT = "timed_out"
    CRASHED = "crashed"


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """The analysis process' answer, or what the parent saw when none came."""

    status: str
    payload: dict[str, Any] = field(default_factory=dict)
    """What the child sent: inputs, deferred, notes, analysis, report, html, workdir_copies."""
    detail: str = ""
    seconds: float = 0.0


class RunAs(Protocol):
    """Whose files the child reads: the job's user (a ``JobEnvironment``, a ``PendingJob``)."""

    @property
    def user(self) -> str | None: ...

    @property
    def uid(self) -> int | None: ...

    @property
    def gid(self) -> int | None: ...


class _Refused(Exception):
    """The child will not read the job's files (it would have to do so as root)."""


def run_analysis_process(
    job: JobEnvironment,
    settings: EpilogSettings,
    *,
    deadline: float,
    scratch_dir: str | None,
    analyzer: Analyzer,
) -> WorkerResult:
    """The Epilog's analysis: find the job's inputs within the settings' bounds, analyze them,
    copy the reports into the work directory when the site allows; in a child process, as the
    job's user, until ``deadline`` (monotonic).  See :func:`run_in_child` for what it raises."""

    def work(payload: dict[str, Any], send: Send) -> None:
        _epilog_work(job, settings, scratch_dir, analyzer, payload, send)

    return run_in_child(
        work, run_as=job, deadline=deadline, max_memory_bytes=settings.max_memory_bytes
    )


def run_in_child(
    work: ChildWork,
    *,
    run_as: RunAs,
    deadline: float,
    max_memory_bytes: int,
) -> WorkerResult:
    """Run ``work`` in a forked child that becomes ``run_as``'s user (when this process is
    root) with its address space capped at ``max_memory_bytes`` (0: no cap), and wait for it
    until ``deadline`` (``time.monotonic()``), when it is SIGKILLed.

    Returns the child's merged messages and status: the one the work set, ``refused`` (root,
    and the user is unknown), ``analysis_failed`` (the work raised, or sent more than
    ``MAX_RESULT_BYTES``), ``timed_out`` or ``crashed`` (no answer).  Never raises for anything
    the child does; raises OSError only when no process or pipe can be created at all.
    """
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    parent_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child; its behaviour is tested end to end
        os.close(read_fd)
        _child(work, run_as, max_memory_bytes, write_fd, parent_pid)
    os.close(write_fd)
    try:
        data, finished, overflow = _read_until(read_fd, deadline)
    finally:
        os.close(read_fd)
    if not finished or overflow:
        os.kill(pid, signal.SIGKILL)
    wait_status = _reap(pid)
    seconds = time.monotonic() - started
    if overflow:
        return WorkerResult(
            WorkerStatus.ANALYSIS_FAILED,
            detail=f"the analysis sent more than {MAX_RESULT_BYTES} bytes; discarded",
            seconds=seconds,
        )
    payload = _merge_messages(data)
    if not finished:
        return WorkerResult(
            WorkerStatus.TIMED_OUT,
            payload,
            detail=f"the analysis was stopped (SIGKILL) after {seconds:.1f} s, at the budget",
            seconds=seconds,
        )
    if "status" not in payload:
        return WorkerResult(
            WorkerStatus.CRASHED,
            payload,
            detail=f"the analysis process ended without an answer ({_describe(wait_status)})",
            seconds=seconds,
        )
    return WorkerResult(str(payload["status"]), payload, str(payload.get("error") or ""), seconds)


def _merge_messages(data: bytes) -> dict[str, Any]:
    """The child's messages (one JSON object per line, each adding to the previous ones)
    merged; a line cut off by the deadline or a crash is ignored."""
    merged: dict[str, Any] = {}
    for line in data.split(b"\n"):
        try:
            message = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(message, dict):
            merged.update(message)
    return merged


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool, bool]:
    """Read ``fd`` to EOF or ``deadline``: (data, reached EOF, more than the cap was sent)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), False, False
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1024 * 1024)
        if not chunk:
            return b"".join(chunks), True, False
        total += len(chunk)
        if total > MAX_RESULT_BYTES:
            return b"", True, True
        chunks.append(chunk)


def _reap(pid: int) -> int | None:
    """Collect the child's status, waiting at most a moment (a process stuck in the kernel
    on a dead file server may never die; the Epilog does not wait for it)."""
    give_up = time.monotonic() + _REAP_SECONDS
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() > give_up:
            os.kill(pid, signal.SIGKILL)
            return None
        time.sleep(0.01)


def _describe(wait_status: int | None) -> str:
    if wait_status is None:
        return "status unknown"
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = str(number)
        return f"killed by {name}"
    return f"exit status {os.WEXITSTATUS(wait_status)}"


# ------------------------------------------------------------------------------ child side


def _child(  # pragma: no cover - runs in the forked child
    work: ChildWork,
    run_as: RunAs,
    max_memory_bytes: int,
    write_fd: int,
    parent_pid: int,
) -> None:
    """The child's whole life; always ends in ``os._exit(0)``."""
    try:
        payload: dict[str, Any] = {}

        def send(message: dict[str, Any]) -> None:
            write_all(write_fd, json.dumps(message, default=str).encode("utf-8", "replace") + b"\n")

        try:
            _silence(keep=write_fd)
            _close_inherited_descriptors(keep=write_fd)
            os.chdir("/")
            prepare_analysis()
            payload["identity"] = drop_privileges(run_as)
            _die_with_parent(parent_pid)
            notes: list[str] = []
            payload["notes"] = notes
            memory_note = _limit_memory(max_memory_bytes)
            if memory_note:
                notes.append(memory_note)
            work(payload, send)
        except _Refused as exc:
            payload.update(status=WorkerStatus.REFUSED, error=str(exc))
        except BaseException as exc:  # noqa: BLE001 - any failure becomes a recorded status
            payload.update(
                status=WorkerStatus.ANALYSIS_FAILED,
                error=f"{type(exc).__name__}: {str(exc)[:2000]}",
            )
        try:
            send(payload)
        except BaseException as exc:  # noqa: BLE001
            send({"status": WorkerStatus.ANALYSIS_FAILED, "error": f"unserializable result: {exc}"})
    finally:
        os._exit(0)


def _epilog_work(
    job: JobEnvironment,
    settings: EpilogSettings,
    scratch_dir: str | None,
    analyzer: Analyzer,
    payload: dict[str, Any],
    send: Send,
) -> None:
    """The Epilog's work, as the job's user: the input plan is sent at once, so that the
    parent has it even if the analysis never ends."""
    notes: list[str] = payload["notes"]
    plan = plan_inputs(
        job, settings, now=time.time(), scratch_dir=scratch_dir, hostname=short_hostname()
    )
    notes.extend(plan.notes)
    payload["inputs"] = [item.as_dict() for item in plan.inputs]
    payload["deferred"] = [item.as_dict() for item in plan.deferred]
    send(payload)
    if not plan.inputs:
        payload["status"] = WorkerStatus.NO_INPUT
        payload["error"] = "none of the job's files could be found or read"
        return
    analysis = analyze_into(
        payload, analyzer, plan.analysis_paths, max_snapshot_bytes=settings.max_snapshot_bytes
    )
    if analysis is None:
        return
    if settings.copy_to_workdir:
        mode = workdir_copy_mode([item.path for item in plan.inputs], job.uid)
        payload["workdir_copies"] = copy_to_workdir(job, analysis, notes, mode=mode)
    payload["status"] = WorkerStatus.ANALYZED


def analyze_into(
    payload: dict[str, Any],
    analyzer: Analyzer,
    paths: Sequence[str],
    *,
    max_snapshot_bytes: int | None,
) -> EpilogAnalysis | None:
    """Run ``analyzer`` on ``paths`` and put its result into ``payload`` (``analysis``,
    ``report``, ``html``, ``analysis_seconds``, its notes); returns it.  When nothing among
    the paths could be read, sets the ``no_input`` status and returns None.  Anything else the
    analyzer raises propagates (the child records it)."""
    started = time.monotonic()
    try:
        analysis = analyzer(paths, config=None, max_snapshot_bytes=max_snapshot_bytes)
    except NoUsableInputError as exc:
        payload["status"] = WorkerStatus.NO_INPUT
        payload["error"] = exc.message
        return None
    payload["analysis_seconds"] = round(time.monotonic() - started, 3)
    payload.setdefault("notes", []).extend(analysis.notes)
    payload["analysis"] = {
        key: value for key, value in asdict(analysis).items() if key not in ("report", "html")
    }
    payload["report"] = analysis.report
    payload["html"] = analysis.html
    return analysis


def _close_inherited_descriptors(keep: int) -> None:
    """Close what the Epilog had open (its spool directories among them) but the pipe."""
    os.closerange(3, keep)
    os.closerange(keep + 1, _MAX_FD)


def _silence(keep: int) -> None:
    """Nothing the analysis prints (or a crash dump) reaches slurmd's pipe or a terminal."""
    faulthandler.disable()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != keep:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)


def drop_privileges(job: RunAs) -> dict[str, Any]:
    """Become the job's user when running as root; describe who the process is afterwards.

    Raises ``_Refused`` when running as root for a job whose user is unknown: the job's files
    are then not read at all (root would follow the user's symbolic links).
    """
    if os.geteuid() != 0:
        return {"uid": os.geteuid(), "dropped": False}
    uid, gid, user = job.uid, job.gid, job.user
    if uid is None and user:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise _Refused(f"user {user!r} is unknown on this host; not reading as root") from None
        uid, gid = entry.pw_uid, gid if gid is not None else entry.pw_gid
    if uid is None:
        raise _Refused("the job's user is not in the environment; not reading its files as root")
    if uid == 0:
        return {"uid": 0, "dropped": False}
    if gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            raise _Refused(f"uid {uid} has no group; not reading as root") from None
    try:
        if user:
            os.initgroups(user, gid)
        else:
            os.setgroups([])
    except OSError:
        os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() != uid or os.getuid() != uid:
        raise _Refused(f"could not become uid {uid}")
    return {"uid": uid, "gid": gid, "dropped": True}


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when the Epilog dies (set after the uid change,
    which clears it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(0)


def _limit_memory(limit: int) -> str | None:
    if limit <= 0:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError) as exc:
        return f"could not limit the analysis' memory ({exc})"
    return None


PRIVATE_COPY_MODE = 0o600


def workdir_copy_mode(job_files: Sequence[str], uid: int | None) -> int:
    """The mode for the reports copied into the work directory: that of the job's own files.

    The Epilog cannot see the job's umask, but the files the job made (its output, first)
    were created under it: a user with ``umask 077`` has a 0600 ``.err``, and the reports,
    which quote that log, must not be more readable than it.  The first regular file of
    ``job_files`` owned by ``uid`` decides (read/write bits only); none: 0600.
    """
    for path in job_files:
        try:
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and uid is not None and info.st_uid == uid:
            return stat.S_IMODE(info.st_mode) & 0o666 | stat.S_IRUSR | stat.S_IWUSR
    return PRIVATE_COPY_MODE


def copy_to_workdir(
    job: JobEnvironment,
    analysis: EpilogAnalysis,
    notes: list[str],
    *,
    mode: int = PRIVATE_COPY_MODE,
) -> list[str]:
    """Write ``oomlens-<job>.json`` (and ``.html``) into the work directory, as the job's user,
    with ``mode`` (:func:`workdir_copy_mode`).

    Only when this process is the job's user: root never writes into a directory a user
    controls.  Each file is written under a temporary name and renamed into place.  Returns
    the paths written; every problem becomes a note.
    """
    return write_workdir_copies(
        job.work_dir, job.spool_key, job.uid, analysis.report, analysis.html, notes, mode=mode
    )


def write_workdir_copies(
    work_dir: str | None,
    key: str | None,
    uid: int | None,
    report: dict[str, Any],
    html: str | None,
    notes: list[str],
    *,
    mode: int = PRIVATE_COPY_MODE,
) -> list[str]:
    """:func:`copy_to_workdir` for a job known by its work directory, spool key and uid."""
    if not work_dir or key is None:
        notes.append("copy_to_workdir: the job's work directory is unknown")
        return []
    if uid is None or os.geteuid() != uid:
        notes.append(
            f"copy_to_workdir: this process runs as uid {os.geteuid()}, not as the job's user; "
            "no copy in the work directory"
        )
        return []
    files = [(f"oomlens-{key}.json", json.dumps(report, indent=2).encode())]
    if html is not None:
        files.append((f"oomlens-{key}.html", html.encode("utf-8", "replace")))
    written: list[str] = []
    try:
        dir_fd = os.open(work_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        notes.append(f"copy_to_workdir: cannot open {work_dir} ({exc.strerror or exc})")
        return []
    try:
        for name, data in files:
            temporary = f".{name}.{os.getpid()}.tmp"
            try:
                fd = os.open(
                    temporary,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    PRIVATE_COPY_MODE,
                    dir_fd=dir_fd,
                )
                try:
                    # Exactly the job's mode, whatever this process' own umask would make of it.
                    os.fchmod(fd, mode)
                    write_all(fd, data)
                finally:
                    os.close(fd)
                os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                notes.append(f"copy_to_workdir: {name}: {exc.strerror or exc}")
                _unlink_quietly(temporary, dir_fd)
                continue
            written.append(os.path.join(work_dir, name))
    finally:
        os.close(dir_fd)
    return written


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
