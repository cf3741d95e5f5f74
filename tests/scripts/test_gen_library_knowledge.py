"""The knowledge generator: a library's functions classified by what their code does.

The generator is run end to end on a tiny git repository made here (a package laid out as a
library's, committed under a tag), and its rules on real function bodies of the torch and
DeepSpeed installed beside oomlens (read from their files, not copied here), when installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_library_knowledge", ROOT / "scripts" / "gen_library_knowledge.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load()

CONFIG = """
class Config:
    def __init__(self, param_dict):
        self._configure_train_batch_size()

    def _batch_assertion(self):
        train_batch = self.train_batch_size
        micro_batch = self.train_micro_batch_size_per_gpu
        assert train_batch == micro_batch * self.gas * self.world_size, "batch"

    def _configure_train_batch_size(self):
        self._set_batch_related_parameters()
        self._batch_assertion()

    @property
    def world_size(self):
        return self._world_size
"""

OPTIMIZER = """
import torch
from torch.optim import Optimizer


class Adamish(Optimizer):
    def __init__(self, params, lr=1e-3):
        super().__init__(params, dict(lr=lr))

    def step(self, closure=None):
        for group in self.param_groups:
            _update(group)

    def save_states(self, path):
        torch.save(self.state, path)


def _update(group):
    for p in group["params"]:
        state = group["state"][p]
        state["exp_avg_sq"].mul_(0.9).addcmul_(p.grad, p.grad)
        p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt())
"""

STAGING = """
import torch


class Staging:
    def __init__(self, numel):
        self.numel = numel

    def make_buffer(self):
        return torch.empty(self.numel, pin_memory=True)

    def grab(self, t):
        return t.pin_memory()
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """A bare-readable git repository ``acme+lib`` with package ``src/lib`` tagged v1.0."""
    repo = tmp_path / "mirror" / "acme+lib"
    (repo / "src" / "lib" / "runtime").mkdir(parents=True)
    (repo / "src" / "lib" / "tests").mkdir()
    (repo / "src" / "lib" / "runtime" / "config.py").write_text(CONFIG)
    (repo / "src" / "lib" / "optim").mkdir()
    (repo / "src" / "lib" / "optim" / "adamish.py").write_text(OPTIMIZER)
    (repo / "src" / "lib" / "runtime" / "staging.py").write_text(STAGING)
    (repo / "src" / "lib" / "tests" / "test_x.py").write_text("def save_model():\n    pass\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "x")
    _git(repo, "tag", "v1.0")
    return repo


def test_generated_from_a_tagged_repository(library: Path) -> None:
    source = gen.Source("lib", "acme/lib", ("v1.0",), (("src/lib", "lib"),))
    data = gen.generate(library.parent, None, None, (source,))
    files = data["files"]
    roles = {
        path: {name: role for role, names in by_role.items() for name in names.split()}
        for path, by_role in files.items()
    }
    config = roles["lib/runtime/config.py"]
    assert config["_batch_assertion"] == "config_check"
    # the function that calls the check makes it too, with the check's condition
    assert config["_configure_train_batch_size"] == "config_check"
    checks = data["checks"]["lib/runtime/config.py"]
    assert "train_batch == micro_batch * self.gas * self.world_size" in checks["_batch_assertion"]
    assert "world_size" not in config  # a getter does nothing of its own
    optim = roles["lib/optim/adamish.py"]
    assert optim["step"] == "optimizer_step"
    assert optim["_update"] == "optimizer_step"  # touches exp_avg_sq: optimizer states
    assert optim["save_states"] == "checkpoint_save"
    staging = roles["lib/runtime/staging.py"]
    assert staging["make_buffer"] == "pinning" and staging["grab"] == "pinning"
    assert not any(path.startswith("lib/tests/") for path in files)  # not code a job runs
    # names few files define place a frame of a file another release moved
    distinctive = data["distinctive"]["lib"]
    assert "_update" in distinctive["optimizer_step"].split()
    assert "__init__" not in " ".join(distinctive.values()).split()
    (cover,) = data["covers"]
    assert cover["library"] == "lib" and cover["version"] == "v1.0"
    assert cover["from"].startswith("github.com/acme/lib@") and len(cover["from"]) == 20 + 40
    json.dumps(data)


def _real(module: str, relative: str) -> tuple[str, str]:
    """The source of an installed library's file, and its package-relative path."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module} is not installed")
    base = Path(spec.origin).parent
    path = base / relative
    if not path.exists():
        pytest.skip(f"{path} is not in this version")
    return f"{module}/{relative}", path.read_text()


@pytest.mark.parametrize(
    ("module", "relative", "function", "role"),
    [
        # https://github.com/pytorch/pytorch/blob/main/torch/optim/adam.py
        ("torch", "optim/adam.py", "_single_tensor_adam", "optimizer_step"),
        ("torch", "optim/adam.py", "_multi_tensor_adam", "optimizer_step"),
        # https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/module.py
        ("torch", "nn/modules/module.py", "state_dict", "checkpoint_save"),
        ("torch", "nn/modules/module.py", "load_state_dict", "checkpoint_load"),
        ("torch", "nn/modules/module.py", "_call_impl", "forward"),
        ("torch", "nn/modules/module.py", "to", "model_init"),
        # https://github.com/pytorch/pytorch/blob/main/torch/utils/checkpoint.py
        ("torch", "utils/checkpoint.py", "checkpoint", "activation_checkpoint"),
        ("torch", "utils/checkpoint.py", "unpack_hook", "backward"),
        # https://github.com/pytorch/pytorch/blob/main/torch/utils/data/_utils/pin_memory.py
        ("torch", "utils/data/_utils/pin_memory.py", "pin_memory", "pinning"),
        ("torch", "utils/data/dataloader.py", "_next_data", "data_loading"),
        # https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/config.py
        ("deepspeed", "runtime/config.py", "_batch_assertion", "config_check"),
        ("deepspeed", "runtime/config.py", "_configure_train_batch_size", "config_check"),
        # https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/engine.py
        ("deepspeed", "runtime/engine.py", "save_checkpoint", "checkpoint_save"),
        ("deepspeed", "runtime/engine.py", "_configure_zero_optimizer", "model_init"),
        # https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/zero/stage3.py
        ("deepspeed", "runtime/zero/stage3.py", "step", "optimizer_step"),
        (
            "deepspeed",
            "runtime/zero/stage3.py",
            "reduce_independent_p_g_buckets_and_remove_grads",
            "grad_reduce",
        ),
        (
            "deepspeed",
            "runtime/zero/partition_parameters.py",
            "_post_init_method",
            "model_init",
        ),
    ],
)
def test_real_functions(module: str, relative: str, function: str, role: str) -> None:
    path, text = _real(module, relative)
    assert gen.functions(path, text)[function][0] == role


def test_batch_assertion_records_its_condition() -> None:
    path, text = _real("deepspeed", "runtime/config.py")
    _, checks = gen.functions(path, text)["_batch_assertion"]
    assert any("micro_batch * grad_acc" in check for check in checks)
