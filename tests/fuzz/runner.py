"""Run fuzz cases: each in a forked child of a warm process, with limits, measured.

``warm_up()`` imports once what every case needs (oomlens, its renderers, DeepSpeed's config
models); each case then costs a fork.  ``run_case`` writes the case's files into a fresh
folder, forks, runs ``oomlens.cli.main(argv)`` in the child (its own process group, standard
output and error to files, its address space capped so that a blow-up cannot take the machine
down), and waits up to the time limit, killing the group past it.  The memory measured is the
child's peak resident size (``ru_maxrss``, its own descendants included) above what the
parent held when it forked.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.fuzz.cases import Case
from tests.fuzz.oracles import (
    MEMORY_LIMIT,
    OUTPUT_LIMIT,
    TIME_LIMIT,
    direction,
    findings,
    verdict_of,
)

KILL_AFTER = TIME_LIMIT + 10.0
"""A case still running this long is killed (it is a finding from TIME_LIMIT on)."""
ADDRESS_SPACE_HEADROOM = 2 * MEMORY_LIMIT
"""The child's address space may grow this much past the parent's before allocations fail."""


def warm_up() -> None:
    """Import now what every case would import, so that forked children start warm."""
    import importlib

    from oomlens.session import preload

    preload()
    for name in (
        "oomlens.cli",
        "oomlens.render.markdown",
        "oomlens.render.text",
        "oomlens.triage.engine",
        "oomlens.triage.outputs",
        "deepspeed.runtime.config",
        "deepspeed.runtime.zero.config",
        "deepspeed.runtime.precision_config",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _write(folder: Path, files: dict[str, str | bytes] | dict[str, bytes]) -> None:
    for name, data in files.items():
        path = folder / name  # a name with surrogates is written as the bytes they stand for
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            shutil.copyfile(data, path)
        else:
            path.write_bytes(data)


def materialize(case: Case, folder: Path) -> None:
    _write(folder, case.files)
    for name, what in case.special:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if what == "fifo":
                os.mkfifo(path)
            elif what == "socket":
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.bind(str(path))
            elif what.startswith("symlink:"):
                os.symlink(what.split(":", 1)[1], path)
            elif what.startswith("deep:"):
                deep = path.joinpath(*["d"] * int(what.split(":")[1]))
                deep.mkdir(parents=True)
                (deep / "train.log").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
            elif what.startswith("many:"):
                path.mkdir(parents=True)
                for n in range(int(what.split(":")[1])):
                    (path / f"rank{n}.log").write_text(f"[rank{n}]: step {n}\n")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _vsize() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(argv: list[str], folder: Path, cap: int) -> None:
    """In the forked child: never returns."""
    code = 98
    try:
        os.setpgid(0, 0)
        os.chdir(folder)
        for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
            out = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        # new streams on the two descriptors (a test runner may have replaced sys.stdout)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from oomlens.cli import main

        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 97
    except BaseException:  # noqa: BLE001 - the harness' own failure, told by its code
        code = 99
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


_BASELINES: dict[str, tuple[str, float] | None] = {}
"""The verdict each baseline (an untransformed seed) gets, computed once per process."""


def baseline_verdict(case: Case, kill_after: float = KILL_AFTER) -> tuple[str, float] | None:
    """The verdict ``case``'s untransformed inputs get (``Case.baseline``), cached by key."""
    if case.baseline_key not in _BASELINES:
        original = Case(case.kind, case.number, case.seed, "baseline",
                        argv=case.baseline_argv, stdout_format="json")  # fmt: skip
        folder = Path(tempfile.mkdtemp(prefix="fzb", dir="/tmp"))
        try:
            _write(folder, case.baseline)
            result = _fork_and_wait(original, folder, kill_after)
            result["stdout"] = _text(folder / "stdout.txt")
            _BASELINES[case.baseline_key] = verdict_of(result)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return _BASELINES[case.baseline_key]


def _fork_and_wait(case: Case, folder: Path, kill_after: float) -> dict[str, Any]:
    sys.stdout.flush()
    sys.stderr.flush()
    cap = _vsize() + ADDRESS_SPACE_HEADROOM
    pid = os.fork()
    if pid == 0:
        _child(case.argv, folder, cap)
    started = time.monotonic()
    while True:
        done, status, _ = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - started > kill_after:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _, status, _ = os.wait4(pid, 0)
            break
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return {"exit_code": os.waitstatus_to_exitcode(status)}


def run_case(
    case: Case, keep: Path | None = None, *, clock: str = "wall", kill_after: float = KILL_AFTER
) -> dict[str, Any]:
    """Run ``case``; returns what happened and its findings.  With ``keep``, the case's folder
    is copied there when it has a finding (its files, its command line, what it printed).
    ``clock`` is what the time limit is judged on (``wall`` or ``cpu``: the case's own CPU
    time, for a machine whose other work stretches wall time); past ``kill_after`` seconds of
    wall time the case is killed and is a hang whatever the clock."""
    folder = Path(tempfile.mkdtemp(prefix="fz", dir="/tmp"))
    try:
        materialize(case, folder)
        sys.stdout.flush()
        sys.stderr.flush()
        baseline = _rss()
        cap = _vsize() + ADDRESS_SPACE_HEADROOM
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(case.argv, folder, cap)
        timed_out = False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > kill_after:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                break
            time.sleep(0.01)
        seconds = time.monotonic() - started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what the command left running
        result: dict[str, Any] = {
            "kind": case.kind,
            "number": case.number,
            "seed": case.seed,
            "description": case.description,
            "argv": case.argv,
            "exit_code": os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "seconds": round(seconds, 3),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
            "clock": clock,
            "memory": max(0, usage.ru_maxrss * 1024 - baseline),
            "stdout": _text(folder / "stdout.txt"),
            "stdout_utf8": _is_utf8(folder / "stdout.txt"),
            "stdout_bytes": _size(folder / "stdout.txt"),
            "stderr": _text(folder / "stderr.txt"),
        }
        found = findings(case.argv, case.stdout_format, case.outputs, folder, result, case.marker)
        if case.expect and not timed_out:
            before = baseline_verdict(case, kill_after) if case.baseline_key else None
            result["baseline"] = before
            result["verdict"] = verdict_of(result)
            found += direction(case.expect, before, result)
        result["findings"] = [(f.kind, f.detail) for f in found]
        result["stdout"] = result["stdout"][-2000:]
        result["stderr"] = result["stderr"][-2000:]
        if found and keep is not None:
            target = keep / f"{case.kind}-{case.number}"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(folder, target, symlinks=True, ignore_dangling_symlinks=True,
                            ignore=_specials)  # fmt: skip
            for big in target.iterdir():
                if big.is_file() and big.stat().st_size > OUTPUT_LIMIT:
                    big.write_bytes(b"")  # an oversized output: its size is in the finding
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _specials(directory: str, names: list[str]) -> list[str]:
    import stat

    skipped = []
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                skipped.append(name)
    return skipped


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _is_utf8(path: Path) -> bool:
    if _size(path) > OUTPUT_LIMIT:
        return True  # judged by its size (``output_size``)
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    except OSError:
        pass
    return True


def _text(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(4 * 1024 * 1024)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")
