"""Cheap reads of memory counters: the caching allocator's (``memory_stats``), this process'
(``/proc/self/status``), its cgroup's (``memory.current``, ``memory.max``, ``memory.events``,
cgroup v2 or v1) and the node's (``/proc/meminfo``).

None of these synchronises the GPU or creates a CUDA context: the allocator's counters are read
only once CUDA is initialised (by the training itself), for a device index given explicitly.
Every function returns None (or an empty dict) rather than raise.
"""

from __future__ import annotations

import os
from typing import Any

GPU_KEYS = (
    ("alloc", ("allocated_bytes", "all", "current")),
    ("alloc_peak", ("allocated_bytes", "all", "peak")),
    ("reserved", ("reserved_bytes", "all", "current")),
    ("reserved_peak", ("reserved_bytes", "all", "peak")),
    ("active", ("active_bytes", "all", "current")),
    ("inactive_split", ("inactive_split_bytes", "all", "current")),
    ("segments", ("segment", "all", "current")),
)
GPU_SCALARS = (
    ("retries", "num_alloc_retries"),
    ("ooms", "num_ooms"),
    ("device_allocs", "num_device_alloc"),
    ("device_frees", "num_device_free"),
)


def gpu_counters(torch: Any, device: int) -> dict[str, int] | None:
    """The allocator counters of ``device`` (bytes, counts), or None before CUDA is up."""
    try:
        if not torch.cuda.is_initialized():
            return None
        nested = torch._C._cuda_memoryStats(device)
    except Exception:  # noqa: BLE001 - a CPU build, an odd build: no GPU counters
        return None
    out: dict[str, int] = {"dev": device}
    for name, (group, pool, field) in GPU_KEYS:
        try:
            out[name] = int(nested[group][pool][field])
        except (KeyError, TypeError, ValueError):
            continue
    for name, key in GPU_SCALARS:
        value = nested.get(key)
        if isinstance(value, int):
            out[name] = value
    return out


def busiest_device(torch: Any) -> int | None:
    """The visible device on which this process reserved the most (its own, in practice)."""
    try:
        if not torch.cuda.is_initialized():
            return None
        count = int(torch._C._cuda_getDeviceCount())
        best, best_bytes = None, -1
        for device in range(min(count, 64)):
            nested = torch._C._cuda_memoryStats(device)
            reserved = int(nested["reserved_bytes"]["all"]["current"])
            if reserved > best_bytes:
                best, best_bytes = device, reserved
        return best
    except Exception:  # noqa: BLE001
        return None


def pinned_bytes(torch: Any) -> int | None:
    """Bytes held by torch's pinned (page-locked) host allocator."""
    try:
        if not torch.cuda.is_initialized():
            return None
        stats = torch._C._cuda_hostMemoryStats()
        return int(stats["allocated_bytes"]["current"])
    except Exception:  # noqa: BLE001 - older torch has no such counter
        return None


_STATUS_KEYS = {
    b"VmRSS:": "rss",
    b"VmHWM:": "rss_peak",
    b"RssAnon:": "rss_anon",
    b"RssFile:": "rss_file",
    b"RssShmem:": "rss_shmem",
    b"VmLck:": "locked",
}


def process_memory(pid: int | str = "self") -> dict[str, int]:
    """Resident memory of a process in bytes: total, peak, anonymous, file, shared (where the
    kernel counts CUDA's pinned buffers) and locked."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                key = line.split(maxsplit=1)[0] if line else b""
                name = _STATUS_KEYS.get(key)
                if name is not None:
                    parts = line.split()
                    out[name] = int(parts[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def node_memory() -> dict[str, int]:
    """The node's MemTotal and MemAvailable, in bytes."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith((b"MemTotal:", b"MemAvailable:")):
                    parts = line.split()
                    name = "mem_total" if parts[0] == b"MemTotal:" else "mem_available"
                    out[name] = int(parts[1]) * 1024
                    if len(out) == 2:
                        break
    except (OSError, ValueError, IndexError):
        pass
    return out


class Cgroup:
    """This process' memory cgroup: v2 (``memory.current`` / ``memory.max`` /
    ``memory.events``) or v1 (``memory.usage_in_bytes`` / ``memory.limit_in_bytes`` /
    ``memory.oom_control`` and ``memory.failcnt``)."""

    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def of(cls, pid: int | str = "self", root: str = "/sys/fs/cgroup") -> Cgroup | None:
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
                entries = [line.rstrip("\n").split(":", 2) for line in handle if line.strip()]
        except OSError:
            return None
        for entry in entries:
            if len(entry) == 3 and "memory" in entry[1].split(","):
                path = os.path.join(root, "memory", entry[2].lstrip("/"))
                if os.path.exists(os.path.join(path, "memory.usage_in_bytes")):
                    return cls(path, 1)
        for entry in entries:
            if len(entry) == 3 and entry[0] == "0":
                path = os.path.join(root, entry[2].lstrip("/"))
                if os.path.exists(os.path.join(path, "memory.current")):
                    return cls(path, 2)
        return None

    def _read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.path, name), encoding="ascii", errors="replace") as f:
                return f.read(4096)
        except OSError:
            return None

    def current(self) -> int | None:
        text = self._read("memory.current" if self.version == 2 else "memory.usage_in_bytes")
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    def limit(self) -> int | None:
        """The memory limit in bytes; None when unlimited or unreadable."""
        text = self._read("memory.max" if self.version == 2 else "memory.limit_in_bytes")
        if text is None or text.strip() == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            return None
        return value if value < 2**62 else None

    def events(self) -> dict[str, int]:
        """``memory.events`` counters (v2: low, high, max, oom, oom_kill...); on v1 the
        ``oom_kill`` and ``under_oom`` of ``memory.oom_control`` and ``failcnt``."""
        out: dict[str, int] = {}
        if self.version == 2:
            text = self._read("memory.events") or ""
        else:
            text = self._read("memory.oom_control") or ""
            failcnt = self._read("memory.failcnt")
            if failcnt is not None:
                text += f"\nfailcnt {failcnt.strip()}"
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    out[parts[0]] = int(parts[1])
                except ValueError:
                    continue
        return out
