"""Writing what the renderers made: a report or table file is never left half-written.

``write_atomically(path, data)`` writes through a temporary file in the same directory and
renames it over ``path`` (a device or FIFO such as ``/dev/null`` is written in place, never
replaced); ``write_rendered(path, document, fmt, options)`` renders ``document`` and writes it
so, raising ``UsageError`` (one line, naming the file) when it cannot be written.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from oomlens.errors import UsageError
from oomlens.ingest.files import is_special_target
from oomlens.render.registry import Format, RenderOptions, render
from oomlens.untrusted import without_surrogates

if TYPE_CHECKING:
    from oomlens.render.registry import Document


def current_umask() -> int:
    """This process' umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str, data: bytes) -> None:
    """Write ``path`` so that it holds either its old content or all of ``data``, never a part
    (a device or FIFO such as ``/dev/null`` is written in place, never replaced).

    Raises ``OSError`` when the directory cannot be written.
    """
    if is_special_target(path):
        with open(path, "wb") as out:
            out.write(data)
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".oomlens-", suffix=".tmp", dir=directory)
    try:
        # mkstemp makes 0600; an output is a normal file, readable as the user's umask says.
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, its surrogates escaped: ``without_surrogates``) to ``path``
    atomically; ``UsageError`` when it cannot be."""
    try:
        write_atomically(path, without_surrogates(text).encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the report ({exc.strerror or exc})") from exc


def write_rendered(path: str, document: Document, fmt: Format, options: RenderOptions) -> None:
    """``document`` rendered in ``fmt`` with ``options``, written to ``path`` atomically."""
    write_text(path, render(document, fmt, options))
