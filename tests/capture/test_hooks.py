"""Post-import hooks: code runs right after the training script imports a module, the import
itself is never disturbed, and wrapped methods behave as the originals."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from oomlens.capture import hooks


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "oomlens_hook_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "config.py").write_text(
        "class Config:\n"
        "    def __init__(self, n):\n"
        "        self.n = n\n"
        "    def step(self, k):\n"
        "        return self.n + k\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n.startswith("oomlens_hook_pkg")]:
        del sys.modules[name]


def test_callback_runs_after_the_import_and_the_loader_is_restored(module_dir: Path) -> None:
    seen: list[ModuleType] = []
    hooks.when_imported("oomlens_hook_pkg.config", seen.append)
    assert not seen
    module = importlib.import_module("oomlens_hook_pkg.config")
    assert seen == [module]
    assert hasattr(module, "Config")  # the callback saw the executed module
    assert type(module.__spec__.loader).__name__ == "SourceFileLoader"
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    importlib.reload(module)
    assert seen == [module]  # once


def test_a_failing_callback_never_breaks_the_import(module_dir: Path) -> None:
    def broken(module: ModuleType) -> None:
        raise RuntimeError("capture bug")

    hooks.when_imported("oomlens_hook_pkg", broken)
    module = importlib.import_module("oomlens_hook_pkg")
    assert module.VALUE == 1


def test_an_imported_module_calls_back_at_once(module_dir: Path) -> None:
    module = importlib.import_module("oomlens_hook_pkg")
    seen: list[ModuleType] = []
    hooks.when_imported("oomlens_hook_pkg", seen.append)
    assert seen == [module]


def test_wrapped_methods_return_what_the_originals_return(module_dir: Path) -> None:
    from oomlens_hook_pkg.config import Config  # type: ignore[import-not-found]

    calls: list[tuple[str, object]] = []

    def after_init(result: object, instance: object, n: int) -> None:
        calls.append(("init", n))
        raise ValueError("ignored")

    assert hooks.wrap_after(Config, "__init__", after_init)
    assert not hooks.wrap_after(Config, "__init__", after_init)  # once
    assert hooks.wrap_around(
        Config,
        "step",
        lambda instance, k: calls.append(("before", k)),
        lambda result, instance, k: calls.append(("after", result)),
    )
    config = Config(2)
    assert config.n == 2 and config.step(5) == 7
    assert calls == [("init", 2), ("before", 5), ("after", 7)]
    assert Config.step.__name__ == "step" and Config.step.__wrapped__ is not None


def test_the_original_exception_of_a_wrapped_method_propagates(module_dir: Path) -> None:
    from oomlens_hook_pkg.config import Config

    after: list[object] = []
    hooks.wrap_after(Config, "step", lambda *a, **k: after.append(a))
    with pytest.raises(TypeError):
        Config(1).step("x")
    assert after == []
