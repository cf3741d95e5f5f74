"""Build hook: compile the log reader's C scan (``oomlens/ingest/log/_scan.c``) into the wheel.

A platform wheel where a C compiler and Python's headers are found; a pure wheel with a warning
where not (oomlens then scans in Python: the same facts, several times slower; see
``oomlens/ingest/log/native.py``).  An editable install puts the module next to its source.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("oomlens") / "ingest" / "log" / "_scan.c"


def compile_scan(root: Path, out_dir: Path) -> tuple[Path | None, str]:
    """The compiled module in ``out_dir``, or None and why not."""
    if os.name == "nt":
        return None, "no build recipe for Windows"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = out_dir / f"_scan{suffix}"
    linker = shlex.split(os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED") or "")
    if not linker:
        linker = [os.environ.get("CC", "cc"), "-shared"]
    include = sysconfig.get_paths()["include"]
    command = [*linker, "-O2", "-fPIC", "-I", include, str(root / SOURCE), "-o", str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"{command[0]}: {error}"
    if done.returncode != 0:
        return None, (done.stderr or done.stdout).strip()[-2000:]
    return target, ""


class ScanExtensionHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if version == "editable":
            built, why = compile_scan(root, root / SOURCE.parent)
        else:
            self._scratch = tempfile.TemporaryDirectory()
            built, why = compile_scan(root, Path(self._scratch.name))
            if built is not None:
                build_data["force_include"][str(built)] = str(SOURCE.parent / built.name)
        if built is None:
            self.app.display_warning(
                f"oomlens: the C log scan was not built, logs are scanned in Python ({why})"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            scratch.cleanup()
