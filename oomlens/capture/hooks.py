"""Run code right after a module is imported by the training script, without importing it
ourselves (importing torch early would freeze ``CUDA_VISIBLE_DEVICES`` or allocator settings
the script sets before its own ``import torch``).

``when_imported(name, callback)`` calls ``callback(module)`` once ``name`` has been imported
(at once when it already is).  A callback that raises is ignored: the import always succeeds.
The module's ``__spec__.loader`` and ``__loader__`` are the original loader's afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_callbacks: dict[str, list[Callback]] = {}
_finder: _PostImportFinder | None = None


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception:  # noqa: BLE001 - a capture bug must never break the import
            pass


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and runs the callbacks after the module executed."""

    def __init__(self, name: str, loader: Any) -> None:
        self._name = name
        self._loader = loader

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
        _run(self._name, module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        with _lock:
            if fullname not in _callbacks or fullname in self._busy:
                return None
            self._busy.add(fullname)
        spec: importlib.machinery.ModuleSpec | None = None
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            with _lock:
                self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(fullname, spec.loader)
        return spec


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` after ``name`` is imported (now, if it already is)."""
    global _finder
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        module = None  # being imported right now: let the loader call us when done
    if module is not None:
        try:
            callback(module)
        except Exception:  # noqa: BLE001
            pass
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)


def wrap_after(owner: Any, attribute: str, after: Callable[..., None]) -> bool:
    """Replace ``owner.attribute`` (a function) by one that calls the original, then
    ``after(result, *args, **kwargs)`` (whose exceptions are swallowed).  Once per attribute."""
    original = getattr(owner, attribute, None)
    if original is None or getattr(original, "__oomlens_wrapped__", False):
        return False

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            after(result, *args, **kwargs)
        except Exception:  # noqa: BLE001
            pass
        return result

    _copy_names(wrapper, original)
    setattr(owner, attribute, wrapper)
    return True


def wrap_around(
    owner: Any, attribute: str, before: Callable[..., None], after: Callable[..., None]
) -> bool:
    """Like ``wrap_after`` with ``before(*args, **kwargs)`` called first (also swallowed)."""
    original = getattr(owner, attribute, None)
    if original is None or getattr(original, "__oomlens_wrapped__", False):
        return False

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            before(*args, **kwargs)
        except Exception:  # noqa: BLE001
            pass
        result = original(*args, **kwargs)
        try:
            after(result, *args, **kwargs)
        except Exception:  # noqa: BLE001
            pass
        return result

    _copy_names(wrapper, original)
    setattr(owner, attribute, wrapper)
    return True


def _copy_names(wrapper: Any, original: Any) -> None:
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    try:
        wrapper.__dict__.update(getattr(original, "__dict__", {}))
    except (AttributeError, TypeError):
        pass
    wrapper.__wrapped__ = original
    wrapper.__oomlens_wrapped__ = True
