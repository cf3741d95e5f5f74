"""Access to the real crash corpus in ``fixtures/crash_logs`` for tests.

Each case folder holds what a real run left behind plus ``case.json`` (see the corpus README).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "crash_logs"

VERDICTS = {"gpu_oom", "host_oom", "config_error", "other_failure", "no_failure", "unknown"}
DIAGNOSES = {
    "fragmentation",
    "prefetch_overshoot",
    "pinned_memory_exhaustion",
    "accumulation_mismatch",
    "activation_memory",
    "model_states_too_large",
    "memory_leak",
    "other_process",
    "eval_or_generation",
    "checkpoint_save_gather",
    "host_oom_killed",
    "not_oom",
}


def case_names() -> list[str]:
    """Every case in the corpus, sorted (folders starting with ``_`` hold the generators)."""
    return sorted(p.name for p in CORPUS_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))


def case_dir(name: str) -> Path:
    return CORPUS_DIR / name


def manifest(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((CORPUS_DIR / name / "case.json").read_text())
    return result


# The scenario model (fixtures/crash_logs/_scenarios/model.py, GPTConfig.named and num_params):
# name -> (d_model, n_layer); vocabulary 32000; lm_head and tok_emb are the largest layers.
SCENARIO_SIZES = {
    "125m": (768, 12),
    "350m": (1024, 24),
    "760m": (1536, 24),
    "1.3b": (2048, 24),
    "2.7b": (2560, 32),
    "3.5b": (3072, 29),
}
SCENARIO_VOCAB = 32000


def check_arguments(name: str) -> dict[str, Any]:
    """What ``oomlens check`` is told about a DeepSpeed case, from its manifest: the model's
    size, the GPU count, the emulated card and the host's cgroup cap (``check_config``'s keywords
    except ``validator``)."""
    m = manifest(name)
    command = m["command"]
    model = re.search(r"--model (\S+)", command)
    assert model is not None
    seq = re.search(r"--seq-len (\d+)", command)
    seq_len = int(seq.group(1)) if seq else 1024  # train_zero3.py's default
    gpus = re.search(r"--num_gpus (\d+)", command)
    assert gpus is not None
    hidden, layers = SCENARIO_SIZES[model.group(1)]
    vocab = SCENARIO_VOCAB
    params = layers * (12 * hidden**2 + 13 * hidden) + 2 * vocab * hidden + seq_len * hidden
    gpu_gib = m["environment"].get("EMULATE_GPU_MEMORY_GIB")
    cap = m["measured"].get("cgroup", {}).get("memory.max", "max")
    return {
        "config_path": str(case_dir(name) / "ds_config.json"),
        "params": params,
        "largest_layer": vocab * hidden,
        "hidden_size": hidden,
        "gpus": int(gpus.group(1)),
        "gpu_memory": int(float(gpu_gib) * 2**30) if gpu_gib else None,
        "host_memory": None if cap == "max" else int(cap),
        "seq_len": seq_len,
        "layers": layers,
        "vocab_size": vocab,
    }
