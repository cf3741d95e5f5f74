"""Derive every snapshot layout torch has written from the real torch 2.11 snapshots beside it.

The ``snapshot_t211_*.pickle`` files here are real (torch 2.11.0+cu130 on an H200; see
``../shared/samples/README.md`` and ``torch-memory-reference.md`` §3): stacks='all' dumped in
an OOM observer (twice: ``_snapshot()`` with and without the final ``snapshot`` marker),
stacks='python' with expandable segments, and enabled='state'.  The other layouts are made from
them by code, following the format differences documented in ``torch-memory-reference.md``
§3.9 and torch's own legacy readers (``_memory_viz._block_extra_legacy``, MemoryViz.js):

* :func:`redump` - the same data at pickle protocol 2..5 (``_dump_snapshot`` uses the default
  protocol: 4 up to Python 3.13, 5 from 3.14), optionally gzip'd;
* :func:`to_torch20` - torch 2.0: blocks lose ``address``/``frames``/``requested_size`` in
  favour of ``history=[{'addr', 'real_size', 'frames'}]`` (allocated blocks only), segments lose
  ``frames``/``is_expandable``, trace entries lose ``time_us``/``compile_context``/
  ``user_metadata``, no ``allocator_settings``/``external_annotations``;
* :func:`to_segment_list` - ``torch.cuda.memory_snapshot()``: the bare ``segments`` list;
* :func:`to_torch113` - torch 1.13 ``_snapshot()``: a bare list of 2.0-style segments;
* :func:`merge_devices` - several devices: the second snapshot's segments and trace become
  device 1.

Run it to write all variants to a folder: ``python tests/assets/snapshots/make_variants.py OUT``.
The tests call these functions and write to a temporary folder instead.
"""

from __future__ import annotations

import copy
import gzip
import pickle
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REAL = {
    "stacks_all": HERE / "snapshot_t211_stacks_all_oom.pickle",
    "observer": HERE / "snapshot_t211_dumped_in_oom_observer.pickle",
    "python_expandable": HERE / "snapshot_t211_stacks_python_expandable_oom.pickle",
    "state": HERE / "snapshot_t211_enabled_state.pickle",
}


def load_real(name: str) -> Any:
    """A real snapshot, read through oomlens' restricted loader (never plain pickle.load)."""
    sys.path.insert(0, str(HERE.parents[2]))
    from oomlens.ingest.snapshot.unpickler import restricted_load

    return restricted_load(REAL[name]).data


def redump(data: Any, path: Path, *, protocol: int, compress: bool = False) -> Path:
    payload = pickle.dumps(data, protocol=protocol)
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def _block_to_torch20(block: dict[str, Any]) -> dict[str, Any]:
    legacy: dict[str, Any] = {
        "size": block["size"],
        "requested_size": block["requested_size"],
        "state": block["state"],
    }
    if block["state"] != "inactive":
        legacy["history"] = [
            {
                "addr": block["address"],
                "real_size": block["requested_size"],
                "frames": block["frames"],
            }
        ]
    return legacy


def to_torch20(data: dict[str, Any]) -> dict[str, Any]:
    """The torch 2.0 ``_snapshot()`` dict (``MODCPP@003ce81``)."""
    segments = []
    for segment in data["segments"]:
        legacy = {
            key: segment[key]
            for key in (
                "device",
                "address",
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
                "stream",
                "segment_type",
                "segment_pool_id",
            )
        }
        legacy["blocks"] = [_block_to_torch20(block) for block in segment["blocks"]]
        segments.append(legacy)
    traces = []
    for trace in data["device_traces"]:
        entries = []
        for entry in trace:
            if entry["action"] not in (
                "alloc",
                "free_requested",
                "free_completed",
                "segment_alloc",
                "segment_free",
                "oom",
                "snapshot",
            ):
                continue
            legacy = {
                key: value
                for key, value in entry.items()
                if key not in ("time_us", "compile_context", "user_metadata")
            }
            legacy.setdefault("frames", [])
            entries.append(legacy)
        traces.append(entries)
    return {"segments": segments, "device_traces": traces}


def to_segment_list(data: dict[str, Any]) -> list[Any]:
    """What ``torch.cuda.memory_snapshot()`` returns: the segments alone."""
    return list(data["segments"])


def to_torch113(data: dict[str, Any]) -> list[Any]:
    """torch 1.13: a list of segments whose blocks carry ``history`` and no ``requested_size``."""
    segments = to_torch20(data)["segments"]
    for segment in segments:
        for block in segment["blocks"]:
            del block["requested_size"]
    return segments


def merge_devices(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One snapshot of two devices: ``second``'s device-0 data becomes device 1."""
    merged = copy.deepcopy(first)
    moved = copy.deepcopy(second)
    for segment in moved["segments"]:
        segment["device"] = 1
    merged["segments"] = sorted(
        merged["segments"] + moved["segments"], key=lambda segment: segment["address"]
    )
    merged["device_traces"] = [first["device_traces"][0], moved["device_traces"][0]]
    for record in moved.get("external_annotations", []):
        record["device"] = 1
    merged["external_annotations"] = merged.get("external_annotations", []) + moved.get(
        "external_annotations", []
    )
    return merged


def write_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in REAL:
        data = load_real(name)
        written.extend(
            redump(data, out / f"{name}_p{protocol}.pickle", protocol=protocol)
            for protocol in (2, 3, 4, 5)
        )
        written.append(redump(data, out / f"{name}.pickle.gz", protocol=4, compress=True))
        written.append(redump(to_torch20(data), out / f"{name}_torch20.pickle", protocol=2))
        written.append(
            redump(to_segment_list(data), out / f"{name}_segment_list.pickle", protocol=4)
        )
        written.append(redump(to_torch113(data), out / f"{name}_torch113.pickle", protocol=2))
    written.append(
        redump(
            merge_devices(load_real("stacks_all"), load_real("python_expandable")),
            out / "two_devices.pickle",
            protocol=4,
        )
    )
    return written


if __name__ == "__main__":
    for written_path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "snapshot_variants")):
        print(written_path)
