"""The watcher: a small process that outlives a rank to record how it disappeared.

A rank killed by the kernel's OOM killer (SIGKILL) records nothing itself.  Its watcher, started
by the capture (``python -m oomlens.capture.sentinel --pid P ...``), detaches (double fork, its
own session, so launchers that kill a rank's process tree leave it alone), polls the rank twice a
second, and when the rank is gone appends one ``gone`` record to the rank's events file: the
time, the cgroup's ``memory.events`` before and after (``oom_kill`` rising means the kernel
killed a process of the job for memory), and, when the kernel log is readable (``/dev/kmsg``),
the kernel's lines about the rank's pid written to ``rank<R>.kernel.log`` in ``dmesg`` format.
Then it exits.  Standard library only; it never signals anyone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

POLL_SECONDS = 0.5
KMSG_MAX_RECORDS = 200_000


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            return None
        return fields[19]
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, ticks: str | None) -> bool:
    now = _start_ticks(pid)
    if ticks is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return now == ticks


def _events(cgroup: str | None, version: int) -> dict[str, int]:
    if not cgroup:
        return {}
    name = "memory.events" if version == 2 else "memory.oom_control"
    out: dict[str, int] = {}
    try:
        with open(os.path.join(cgroup, name), encoding="ascii", errors="replace") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def parse_kmsg(raw: bytes) -> tuple[int, str] | None:
    """One ``/dev/kmsg`` record (``prio,seq,usec,flags[,...];message``) as ``(microseconds
    since boot, first message line)``; None when it is not one."""
    head, sep, message = raw.decode("utf-8", "replace").partition(";")
    parts = head.split(",")
    if not sep or len(parts) < 3:
        return None
    try:
        usec = int(parts[2])
    except ValueError:
        return None
    lines = message.splitlines()
    return (usec, lines[0]) if lines else None


def dmesg_line(usec: int, message: str) -> str:
    """``[  794.430837] message``, as ``dmesg`` prints a record."""
    return f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] {message}"


def kernel_lines(pid: int, since_uptime: float) -> list[str] | None:
    """The kernel log records about ``pid`` since ``since_uptime`` seconds after boot, in
    ``dmesg`` format (``[  794.430837] message``); None when the kernel log is unreadable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    wanted = (f"process {pid} (", f"pid={pid},", f"pid={pid} ", f"PID: {pid} ")
    kept: list[str] = []
    context: list[str] = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:
                continue  # EPIPE: the record was overwritten while reading; go on
            if not raw:
                break
            record = parse_kmsg(raw)
            if record is None or record[0] / 1e6 < since_uptime:
                continue
            usec, message = record
            line = dmesg_line(usec, message)
            if "invoked oom-killer" in message:
                context = [line]
            elif any(w in message for w in wanted):
                kept.extend(context)
                context = []
                kept.append(line)
    finally:
        os.close(fd)
    return kept


def _uptime() -> float:
    try:
        with open("/proc/uptime", encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def watch(pid: int, events_path: str, kernel_path: str, cgroup: str | None, version: int) -> None:
    ticks = _start_ticks(pid)
    started = _uptime()
    before = _events(cgroup, version)
    while _alive(pid, ticks):
        time.sleep(POLL_SECONDS)
    gone = time.time()
    after = _events(cgroup, version)
    record: dict[str, object] = {
        "t": round(gone, 3),
        "kind": "gone",
        "pid": pid,
        "watched_from_uptime": round(started, 3),
        "memory_events_before": before,
        "memory_events_after": after,
    }
    lines = kernel_lines(pid, max(0.0, started - 5.0))
    if lines is None:
        record["kernel_log"] = "unreadable"
    else:
        record["kernel_lines"] = len(lines)
        if lines:
            tmp = f"{kernel_path}.tmp{os.getpid()}"
            try:
                with open(tmp, "w", encoding="utf-8") as handle:
                    handle.write("\n".join(lines) + "\n")
                os.replace(tmp, kernel_path)
                record["kernel_file"] = os.path.basename(kernel_path)
            except OSError:
                pass
    try:
        with open(events_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m oomlens.capture.sentinel")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--cgroup")
    parser.add_argument("--cgroup-version", type=int, default=2)
    parser.add_argument("--foreground", action="store_true", help="do not detach (tests)")
    args = parser.parse_args(argv)
    if not args.foreground:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    try:
        watch(args.pid, args.events, args.kernel, args.cgroup, args.cgroup_version)
    except Exception:  # noqa: BLE001 - a watcher has no one to report to
        pass
    if not args.foreground:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
