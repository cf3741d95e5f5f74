"""A traceback frame's role, read from ``library_frames.json``.

``frame_role(filename, function)`` finds the library file a frame's path ends with (the longest
package-relative path in the data that the frame's path ends with, on a ``/`` boundary: the
site-packages prefix, a checkout's folder or a Windows drive in front of it does not matter)
and the function's role there; for a library file or function the data lacks (an older or newer
release moved it), the function's role in the rest of that library when the name is
distinctive there (defined in few files, all with that role).
``None`` otherwise (user code, a helper, a getter, a name with two roles); the caller then reads
the frame by its module and name.  ``phase_of_role`` is the training phase a role places an
event in, ``None`` for roles that happen in several phases (a ZeRO gather runs in forward, in
backward and in a save; a collective anywhere; a config check at start).

The data is loaded once, on first use.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from oomlens.facts.log import Phase

DATA = "library_frames.json"

_PHASES: dict[str, Phase | None] = {
    "model_init": Phase.MODEL_INIT,
    "model_load": Phase.MODEL_INIT,
    "checkpoint_load": Phase.MODEL_INIT,
    "checkpoint_save": Phase.CHECKPOINT_SAVE,
    "data_loading": Phase.DATA_LOADING,
    "forward": Phase.FORWARD,
    "activation_checkpoint": Phase.FORWARD,
    "backward": Phase.BACKWARD,
    "grad_reduce": Phase.BACKWARD,
    "optimizer_step": Phase.OPTIMIZER_STEP,
    "evaluation": Phase.EVALUATION,
    "generation": Phase.GENERATION,
    "kv_cache": Phase.GENERATION,
    "config_check": None,
    "param_gather": None,
    "param_partition": None,
    "pinning": None,
    "collective": None,
    "training_loop": None,
}
"""Loading a checkpoint counts as building the model (it happens before training, or on resume
before the step); a gradient reduction runs inside backward's hooks; activation checkpointing
wraps the forward (its recomputation frames are ``backward``'s); the KV cache is an inference
engine's, sized for generation."""


@dataclass(frozen=True, slots=True)
class FrameRole:
    """A frame's role in the data, and where the data says so."""

    role: str
    file: str
    """The package-relative file matched (``deepspeed/runtime/config.py``)."""
    library: str
    checks: tuple[str, ...] = ()
    """A config check's asserted conditions, as written in the source."""


@dataclass(frozen=True, slots=True)
class _Data:
    files: dict[str, dict[str, str]]
    """Path -> role -> the functions with that role, space-separated, as stored."""
    checks: dict[str, dict[str, list[str]]]
    libraries: dict[str, str]
    covers: tuple[dict[str, str], ...]
    not_read: re.Pattern[str] | None
    """The library paths the generator did not read (tests, compiler internals...)."""
    distinctive: dict[str, dict[str, str]]
    """Package -> role -> functions, for the names few files of the package define."""


@cache
def _data() -> _Data:
    raw = json.loads((Path(__file__).parent / DATA).read_text(encoding="utf-8"))
    not_read = raw.get("not_read")
    return _Data(
        raw["files"],
        raw.get("checks", {}),
        dict(raw.get("libraries", ())),
        tuple(raw.get("covers", ())),
        re.compile(not_read) if not_read else None,
        raw.get("distinctive", {}),
    )


@lru_cache(maxsize=1024)
def _roles(file: str) -> dict[str, str]:
    """Function -> role in one file of the data (expanded when a frame first asks)."""
    return {name: role for role, names in _data().files[file].items() for name in names.split()}


@cache
def _by_package() -> dict[str, dict[str, str]]:
    """Package root -> function name -> its role wherever the package defines it, for the
    names few files of the package define (the data's ``distinctive``): a common name says
    little about a file the data does not hold."""
    return {
        package: {name: role for role, names in by_role.items() for name in names.split()}
        for package, by_role in _data().distinctive.items()
    }


def covers() -> tuple[dict[str, str], ...]:
    """The libraries, versions and commits the data was generated from."""
    return _data().covers


@lru_cache(maxsize=4096)
def library_file(filename: str) -> str | None:
    """The data's file that ``filename`` (a frame's path) is, or None."""
    path = filename.replace("\\", "/")
    files = _data().files
    start = 0
    while True:
        candidate = path[start:]
        if candidate in files:
            return candidate
        slash = path.find("/", start)
        if slash < 0:
            return None
        start = slash + 1


def frame_role(filename: str, function: str) -> FrameRole | None:
    """The role of ``function`` in the library file ``filename`` ends with; see the module
    docstring.  IPython's qualified names (``Trainer.train``) are read by their last part."""
    data = _data()
    name = function.rsplit(".", 1)[-1]
    file = library_file(filename)
    if file is not None and name in _roles(file):
        top = file.split("/", 1)[0]
        return FrameRole(
            _roles(file)[name],
            file,
            data.libraries.get(top, top),
            tuple(data.checks.get(file, {}).get(name, ())),
        )
    package = package_of(filename)
    if package is None:
        return None
    path = filename.replace("\\", "/")
    inside = path[path.rfind("/" + package + "/") + 1 :]
    if data.not_read is not None and data.not_read.search(inside):
        return None
    role = _by_package().get(package, {}).get(name)
    if role is None:
        return None
    # a version the data does not hold moved or renamed the file: the function's role in
    # the rest of the library, when every file that has it agrees
    return FrameRole(role, f"{package}/", data.libraries.get(package, package))


def package_of(filename: str) -> str | None:
    """The library package ``filename`` lies in (``deepspeed``): the innermost folder of its
    path named as a package of the data, with a file below it; None for user code."""
    parts = filename.replace("\\", "/").split("/")
    packages = _data().libraries
    return next((part for part in reversed(parts[:-1]) if part in packages), None)


def phase_of_role(role: str) -> Phase | None:
    """The training phase ``role`` places an event in; None for roles of several phases."""
    return _PHASES.get(role)
