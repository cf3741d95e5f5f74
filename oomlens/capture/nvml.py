"""What NVML says about a device: every compute process on it with its memory, and the
device's used/total memory.  Optional: ``nvidia-ml-py`` (module ``pynvml``) where installed.

NVML numbers devices physically; torch numbers them after ``CUDA_VISIBLE_DEVICES``.  A torch
device is matched to its NVML handle by UUID (``get_device_properties(i).uuid``), else through
the ``CUDA_VISIBLE_DEVICES`` list, else by index.
"""

from __future__ import annotations

import os
from typing import Any


class Nvml:
    """A lazily initialised NVML session; every method returns None on any failure."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self.error: str | None = None

    def start(self) -> bool:
        if self._nvml is not None:
            return True
        try:
            import pynvml  # type: ignore[import-not-found, unused-ignore]

            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - not installed, no driver: no NVML facts
            self.error = f"{type(exc).__name__}: {exc}"[:300]
            return False
        self._nvml = pynvml
        return True

    def _handle(self, torch: Any, device: int) -> Any:
        if device in self._handles:
            return self._handles[device]
        nvml = self._nvml
        handle = None
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            handle = nvml.nvmlDeviceGetHandleByUUID(name)
        except Exception:  # noqa: BLE001 - fall back to the index mapping
            handle = None
        if handle is None:
            try:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                index = device
                if visible:
                    entries = [v.strip() for v in visible.split(",") if v.strip()]
                    if device < len(entries) and entries[device].isdigit():
                        index = int(entries[device])
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:  # noqa: BLE001
                handle = None
        self._handles[device] = handle
        return handle

    def device_report(self, torch: Any, device: int) -> dict[str, Any] | None:
        """``{"processes": [{"pid", "bytes"}], "used", "total", "self_pid"}`` for ``device``."""
        if self._nvml is None and not self.start():
            return None
        nvml = self._nvml
        handle = self._handle(torch, device)
        if handle is None:
            return None
        out: dict[str, Any] = {"self_pid": os.getpid()}
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out["processes"] = [
                {
                    "pid": int(p.pid),
                    "bytes": int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                }
                for p in processes[:64]
            ]
        except Exception as exc:  # noqa: BLE001
            out["processes_error"] = f"{type(exc).__name__}: {exc}"[:300]
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            out["used"], out["total"] = int(info.used), int(info.total)
        except Exception:  # noqa: BLE001
            pass
        return out
