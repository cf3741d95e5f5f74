"""Render every golden output of the crash corpus through the command line, normalised.

Each output is what ``oomlens analyze`` or ``oomlens check`` prints, as a user runs it:

* ``analyze/<case>/all.<ext>``: ``oomlens analyze <case dir> --format <fmt>``;
* ``analyze/<case>/logs.<ext>``: the same over the case's logs alone (``train.log`` and the
  per-rank logs), as the corpus tests analyze them;
* ``check/<case>.<ext>``: ``oomlens check <case>/ds_config.json`` with the model, GPU count and
  memory from the case's manifest, text and JSON, with the exit code.

Inputs are named relative to the repository (``fixtures/crash_logs/<case>``, the command run
from the repository's root), so that reports do not depend on where the checkout is: long
paths are cut in places.  Normalised: the package version becomes ``<version>``, and the HTML
page's inline stylesheet and script (templates, the same for every case) their SHA-256, so that
each file shows what differs from case to case.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner

from oomlens import __version__
from oomlens.cli import cli
from oomlens.errors import OomlensError
from tests._corpus import case_dir, case_names, check_arguments, checkable, manifest

GOLDEN_DIR = Path(__file__).resolve().parent
ROOT = GOLDEN_DIR.parents[1]
FORMATS = {"text": "txt", "json": "json", "markdown": "md", "html": "html"}
CHECK_FORMATS = {"text": "txt", "json": "json"}

_INLINE = re.compile(r"(<(style|script)\b[^>]*>)(.*?)(</\2>)", re.DOTALL)


def normalise(text: str) -> str:
    text = text.replace(f'"oomlens_version": "{__version__}"', '"oomlens_version": "<version>"')
    text = text.replace(f"oomlens {__version__}", "oomlens <version>")

    def digest(match: re.Match[str]) -> str:
        body = hashlib.sha256(match.group(3).encode("utf-8")).hexdigest()[:16]
        return f"{match.group(1)}/* sha256 {body} */{match.group(4)}"

    return _INLINE.sub(digest, text)


@contextmanager
def in_root() -> Iterator[None]:
    """The checkout's root as the working directory, as a user in it names the inputs."""
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def _relative(path: Path | str) -> str:
    return os.path.relpath(path, ROOT)


def _run(args: list[str]) -> tuple[int, str]:
    with in_root():
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
    code = result.exit_code
    stderr = ""
    if isinstance(result.exception, OomlensError):
        code, stderr = int(result.exception.exit_code), f"oomlens: {result.exception.message}\n"
    elif result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return code, result.stdout + stderr


def log_inputs(name: str) -> list[Path]:
    """The logs of a case, as ``tests/rules/test_corpus_diagnoses`` analyzes them alone."""
    m = manifest(name)
    logs = [case_dir(name) / "train.log"]
    logs += [case_dir(name) / p for p in m["files"].get("rank_logs", []) if p.endswith(".log")]
    return logs


def _check_args(name: str, fmt: str) -> list[str]:
    kwargs = check_arguments(name)
    args = ["check", _relative(kwargs.pop("config_path")), "--format", fmt]
    for key, value in kwargs.items():
        if value is not None:
            args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def golden_outputs(case: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """``(relative golden path, producer)`` for every output of one case."""
    for inputs, paths in (("all", [case_dir(case)]), ("logs", log_inputs(case))):
        for fmt, ext in FORMATS.items():

            def produce(paths: list[Path] = paths, fmt: str = fmt) -> str:
                code, out = _run(["analyze", *map(_relative, paths), "--format", fmt])
                return normalise(out if code == 0 else f"exit code {code}\n{out}")

            yield f"analyze/{case}/{inputs}.{ext}", produce
    if checkable(case):
        for fmt, ext in CHECK_FORMATS.items():

            def produce_check(fmt: str = fmt) -> str:
                code, out = _run(_check_args(case, fmt))
                return normalise(f"exit code {code}\n{out}")

            yield f"check/{case}.{ext}", produce_check


def cases() -> list[str]:
    return case_names()


def stored_files() -> set[str]:
    return {
        p.relative_to(GOLDEN_DIR).as_posix()
        for folder in ("analyze", "check")
        for p in (GOLDEN_DIR / folder).rglob("*")
        if p.is_file()
    }
