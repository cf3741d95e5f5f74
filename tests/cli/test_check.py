"""``oomlens check``: output and exit codes a launch script can rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oomlens.cli import main
from oomlens.units import parse_count
from tests._corpus import CORPUS_DIR as CORPUS
from tests.cli._terminal import on_terminal

ASSETS = Path(__file__).parents[1] / "assets" / "ds_configs"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["check", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def write(tmp_path: Path, config: dict | str, name: str = "ds_config.json") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config, indent=2))
    return str(path)


ZERO3 = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 3},
}


def test_valid_config_that_fits_exits_0_with_a_budget(capsys, tmp_path: Path) -> None:
    code, out, err = run(
        capsys,
        write(tmp_path, ZERO3),
        "--params",
        "7B",
        "--largest-layer",
        "131072000",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--host-memory",
        "512GiB",
    )
    assert code == 0, err
    assert "Memory per GPU: 7B params, 8 GPU(s), bf16, ZeRO stage 3" in out
    assert "optimizer states" in out and "6.52 GiB" in out
    assert "left for activations and workspace" in out
    assert "Memory per host: 8 rank(s) per host" in out
    assert "estimate_zero3_model_states_mem_needs" in out
    assert out.rstrip().endswith("Verdict: OK: valid and fits")


def test_config_that_cannot_fit_exits_4_and_names_the_overflow(capsys, tmp_path: Path) -> None:
    code, out, err = run(
        capsys,
        write(tmp_path, ZERO3),
        "--params",
        "7e9",
        "--gpus",
        "8",
        "--gpu-memory",
        "12GiB",
    )
    assert code == 4
    assert "OVERFLOW by" in out and "'optimizer states' during first optimizer step" in out
    assert "Changes that would help" in out and '"offload_optimizer": {"device": "cpu"}' in out
    assert "CANNOT FIT (gpu short by" in err


def test_invalid_config_exits_4_with_file_and_line(capsys) -> None:
    code, out, err = run(capsys, str(ASSETS / "dse_megatron_zero3.json"))
    assert code == 4
    path = ASSETS / "dse_megatron_zero3.json"
    assert (
        f"{path}:10: zero_optimization.stage3_param_persitence_threshold: Extra inputs are not "
        "permitted" in out
    )
    assert "INVALID (1 problem(s))" in err


def test_batch_mismatch_exits_4_with_corrected_triples(capsys, tmp_path: Path) -> None:
    config = {
        **ZERO3,
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
    }
    code, out, _ = run(capsys, write(tmp_path, config), "--gpus", "8")
    assert code == 4
    assert "32 != 4 * 2 * 8" in out
    assert (
        "fix (keeps train_batch_size; same global batch): micro 4 x gas 1 x 8 = 32  "
        '{"gradient_accumulation_steps": 1}' in out
    )


def test_bad_json_exits_4_with_line_and_column(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,, }\n}')
    code, out, err = run(capsys, path, "--validator", "oomlens")
    assert code == 4
    assert out == ""
    assert err.startswith(f"oomlens: {path}: ") and "line 3, column 28" in err


def test_hjson_syntax_deepspeed_accepts_is_accepted(capsys, tmp_path: Path) -> None:
    pytest.importorskip("hjson")
    path = write(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 8\n  "fp16": {enabled: true}\n}')
    code, out, _ = run(capsys, path, "--validator", "oomlens")
    assert code == 0
    assert "hjson ds_config" in out and ", fp16," in out


@pytest.mark.parametrize(
    "args",
    [
        ["--params", "seven"],
        ["--gpu-memory", "lots"],
        ["--gpus", "0"],
        ["--precision", "fp8"],
    ],
)
def test_bad_options_exit_2(capsys, tmp_path: Path, args: list[str]) -> None:
    code, _, _ = run(capsys, write(tmp_path, ZERO3), *args)
    assert code == 2


def test_missing_config_file_is_a_usage_error(capsys, tmp_path: Path) -> None:
    code, _, _ = run(capsys, str(tmp_path / "nope.json"))
    assert code == 2


def test_auto_config_under_hf_and_directly(capsys) -> None:
    path = str(ASSETS / "hf_transformers_ds_config_zero3.json")
    # Under the HF Trainer: "auto" is expected, the batch keys are its business
    code, out, _ = run(
        capsys, path, "--integration", "hf", "--hidden-size", "4096", "--precision", "fp16"
    )
    assert code == 0
    assert "ZeRO stage 3 (user), fp16, offload: optimizer=cpu (pinned), params=cpu (pinned)" in out
    # Sent to DeepSpeed directly: the batch keys fail with TypeError and the autos are a hazard
    code, out, _ = run(capsys, path, "--integration", "deepspeed")
    assert code == 4
    assert "batch_type_error" in out and "[high]" in out and "fp32" in out


def test_misspelled_zero_key_is_a_hazard_but_valid(capsys, tmp_path: Path) -> None:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimisation": {"stage": 3},
        "bf16": {"enabled": True},
    }
    code, out, _ = run(capsys, write(tmp_path, config))
    assert code == 0
    assert (
        "[high] top-level key 'zero_optimisation' looks like a misspelled 'zero_optimization'"
        in out
    )
    assert "ZeRO stage 0 (default)" in out


def test_both_validators_give_the_same_exit(capsys) -> None:
    for validator in ("oomlens", "deepspeed"):
        if validator == "deepspeed":
            pytest.importorskip("deepspeed")
        code, out, _ = run(
            capsys, str(ASSETS / "dse_megatron_zero_offload_10B.json"), "--validator", validator
        )
        assert code == 4
        assert "zero_optimization.comm_overlap: Extra inputs are not permitted" in out


def test_json_output_is_machine_readable(capsys, tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        write(tmp_path, ZERO3),
        "--params",
        "7e9",
        "--gpus",
        "8",
        "--gpu-memory",
        "12GiB",
        "--format",
        "json",
    )
    assert code == 4
    payload = json.loads(out)
    assert payload["failed"] is True and payload["valid"] is True
    (gpu,) = payload["verdicts"]
    assert (
        gpu["overflow_component"] == "optimizer_states"
        and gpu["overflow_bytes"] == 20_250_000_000 - 12 * 2**30
    )
    assert payload["effective"]["zero.stage"] == 3
    assert {c["code"] for c in payload["budget"]["components"]} >= {
        "param_partition",
        "optimizer_states",
    }
    assert payload["patches"] and all(p["gpu_bytes_saved"] > 0 for p in payload["patches"])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7e9", 7_000_000_000),
        ("7B", 7_000_000_000),
        ("350M", 350_000_000),
        ("1,300,000", 1_300_000),
        ("1.5t", 1_500_000_000_000),
    ],
)
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text) == value


def test_parse_count_rejects_garbage() -> None:
    for text in ("", "7 GB", "-5", "0.1"):
        with pytest.raises(ValueError):
            parse_count(text)


def test_activation_estimate_from_the_command_line(capsys, tmp_path: Path) -> None:
    # GIVEN a config whose micro batch DeepSpeed derives (train 64 // 2 GPUs // gas 2 = 16)
    config = {**ZERO3, "train_batch_size": 64, "gradient_accumulation_steps": 2}
    del config["train_micro_batch_size_per_gpu"]
    args = [write(tmp_path, config), "--params", "350M", "--gpus", "2", "--gpu-memory", "12GiB"]
    code, out, _ = run(capsys, *args)
    assert code == 0  # without a shape there is no activation estimate: it fits
    assert "[medium] train_micro_batch_size_per_gpu is not set: DeepSpeed derives 16 per GPU" in out
    # WHEN the shape is given, the derived micro batch's activations are counted
    code, out, _ = run(
        capsys, *args, "--seq-len", "1024", "--layers", "24", "--hidden-size", "1024"
    )
    assert code == 4
    assert "activations (estimate)" in out and "b 16" in out
    assert "OVERFLOW by" in out and "'activations (estimate)'" in out
    code, out, _ = run(capsys, *args, "--seq-len", "1024", "--layers", "24")
    assert (
        code == 0
        and "activation estimate skipped: it needs --seq-len, --layers and --hidden-size" in out
    )


def test_host_baseline_option(capsys, tmp_path: Path) -> None:
    config = {**ZERO3, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    path = write(tmp_path, config)
    args = [path, "--params", "1B", "--gpus", "2", "--host-memory", "64GiB", "--format", "json"]
    code, out, _ = run(capsys, *args, "--host-baseline", "0")
    assert code == 0
    base = json.loads(out)["budget"]["host_peak_bytes"]
    code, out, _ = run(capsys, *args, "--host-baseline", "4GiB")
    assert json.loads(out)["budget"]["host_peak_bytes"] == base + 2 * 4 * 2**30
    assert code == 0


@pytest.mark.parametrize("validator", ["oomlens", "deepspeed"])
def test_a_value_of_4301_digits_is_invalid_and_named(capsys, tmp_path: Path, validator) -> None:
    if validator == "deepspeed":
        pytest.importorskip("deepspeed")
    config = {**ZERO3, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "9" * 4301}}
    code, out, err = run(capsys, write(tmp_path, config), "--validator", validator)
    assert code == 4, err
    assert "zero_optimization.stage3_prefetch_bucket_size" in out
    assert "internal error" not in err


@pytest.mark.parametrize("gas", [2_000_000_000, 2**63])
@pytest.mark.parametrize("command", ["check", "analyze"])
def test_a_text_micro_batch_is_refused_without_being_repeated(
    capsys, tmp_path: Path, gas: int, command: str
) -> None:
    # DeepSpeed computes micro * gas * world_size whatever the types: "A" * 2e9 is a 2 GB
    # string (and "A" * 2**63 an OverflowError) before its assertion fails.
    import tracemalloc

    config = write(
        tmp_path, {"train_micro_batch_size_per_gpu": "A", "gradient_accumulation_steps": gas}
    )
    log = tmp_path / "train.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n")
    args = [config, "--gpus", "2"] if command == "check" else [str(log), config, "--format", "json"]
    tracemalloc.start()
    try:
        with pytest.raises(SystemExit) as info:
            main([command, *args])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out, err = capsys.readouterr()
    assert "internal error" not in err
    assert peak < 200 * 2**20
    if command == "check":
        assert info.value.code == 4
        assert "train_micro_batch_size_per_gpu: TypeError" in out
    else:
        assert info.value.code == 0
        assert json.loads(out)["verdict"] == "gpu_oom"


def test_persistence_above_the_model_keeps_it_whole_on_every_gpu_and_cannot_fit(
    capsys, tmp_path: Path
) -> None:
    # 7B in bf16 (14 GB) kept whole on every GPU does not fit 24 GiB beside the rest
    zero = {"stage": 3, "stage3_param_persistence_threshold": 1e10}
    config = {**ZERO3, "zero_optimization": zero}
    code, out, err = run(
        capsys, write(tmp_path, config), "--params", "7B", "--gpus", "8", "--gpu-memory", "24GiB"
    )
    assert code == 4, out + err
    assert "parameters never partitioned (persistence threshold)" in out
    assert "13.04 GiB" in out
    assert "partition the parameters the persistence threshold keeps whole" in out
    default = {**ZERO3}
    code, out, _ = run(
        capsys, write(tmp_path, default), "--params", "7B", "--gpus", "8", "--gpu-memory", "24GiB"
    )
    assert code == 0 and "never partitioned" not in out


def test_a_removed_mics_setting_is_invalid_not_modelled(capsys, tmp_path: Path) -> None:
    config = {**ZERO3, "zero_optimization": {"stage": 3, "mics_shard_size": 2}}
    code, out, _ = run(capsys, write(tmp_path, config), "--validator", "oomlens")
    assert code == 4 and "mics_shard_size" in out and "removed" in out


def test_knobs_far_above_the_defaults_are_a_hazard_even_without_params(capsys) -> None:
    # the config of the real prefetch_overshoot crash: valid, but its working-set knobs are
    # 10-200x DeepSpeed's defaults; without --params there is no budget, yet a note is due
    from tests._corpus import case_dir

    code, out, _ = run(capsys, str(case_dir("prefetch_overshoot") / "ds_config.json"))
    assert code == 0
    hazards = out[out.index("Hazards:") :]
    for key, times in (
        ("stage3_prefetch_bucket_size", "200x"),
        ("stage3_max_live_parameters", "10x"),
        ("stage3_max_reuse_distance", "10x"),
    ):
        assert key in hazards and times in hazards, key
    assert "--params" in hazards
    code, out, _ = run(capsys, str(case_dir("prefetch_fits") / "ds_config.json"))
    assert code == 0 and "far above" not in out


def test_budget_labels_are_never_cut(capsys, tmp_path: Path) -> None:
    code, out, _ = run(capsys, write(tmp_path, ZERO3), "--params", "7B", "--gpus", "8")
    assert code == 0
    assert "gathered parameters (prefetch / live / reuse) " in out
    assert "process baseline (Python, torch/CUDA libraries, page cache) " in out
    assert "fp32 gradients of one optimizer sub-group " in out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_hostile_keys_reach_neither_terminal_nor_json(capsys, tmp_path: Path, fmt: str) -> None:
    # found by the fuzzer: a key holding an escape sequence or a bidi override went to stdout
    from oomlens.untrusted import CONTROL_CHARACTERS

    zero = {"stage": 3, "\x1b]0;title\x07": 1, "\u202eevil\u202c": 2}
    config = write(tmp_path, {**ZERO3, "zero_optimization": zero})
    code, out, err = run(capsys, config, "--format", fmt, "--validator", "oomlens")
    assert code == 4 and "title" in out and "evil" in out
    assert not CONTROL_CHARACTERS.search(out + err)


@pytest.mark.parametrize("validator", ["oomlens", "deepspeed"])
def test_an_integer_past_float_range_is_no_internal_error(
    capsys, tmp_path: Path, validator: str
) -> None:
    # found by the fuzzer: 10**400 elements (401 digits, a valid JSON integer) reached float()
    if validator == "deepspeed":
        pytest.importorskip("deepspeed")
    zero = {"stage": 3, "stage3_max_live_parameters": 10**400, "stage3_max_reuse_distance": 1e8}
    config = write(tmp_path, {**ZERO3, "zero_optimization": zero})
    code, out, err = run(
        capsys, config, "--params", "1.3B", "--gpus", "2", "--validator", validator
    )
    assert "internal error" not in err and code in (0, 4), err
    assert "gathered parameters (prefetch / live / reuse)" in out


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (
            Path(__file__).parents[2] / "fixtures/crash_logs/fragmentation/snapshot_rank0.pickle",
            "a Python pickle",
        ),
        (b"\x1f\x8b\x08\x00" + bytes(range(256)), "gzip-compressed data"),
        (b"PK\x03\x04" + bytes(range(256)), "a zip archive"),
        (b"{\x00\x00\x00\x00\x00\x00\x00}", "binary data"),
    ],
)
def test_a_file_that_is_no_config_is_said_to_be_none(
    capsys, tmp_path: Path, data: Path | bytes, what: str
) -> None:
    # issue 12: a snapshot pickle given to check was told to "save the config as UTF-8"
    path = tmp_path / "ds_config.json"
    path.write_bytes(data.read_bytes() if isinstance(data, Path) else data)
    code, out, err = run(capsys, str(path))
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and "not a DeepSpeed config" in err and what in err, err
    assert "save the config as UTF-8" not in err


def test_a_train_batch_of_401_digits_is_checked_in_bounded_time(capsys, tmp_path: Path) -> None:
    # found by the fuzzer: with no micro batch written, check looked for divisors of
    # train_batch_size / world size by trying every number below it (10**400 / 8)
    import time

    config = write(tmp_path, {**ZERO3, "train_batch_size": 10**400})
    del_micro = json.loads(Path(config).read_text())
    del del_micro["train_micro_batch_size_per_gpu"], del_micro["gradient_accumulation_steps"]
    Path(config).write_text(json.dumps(del_micro))
    started = time.process_time()
    code, out, err = run(capsys, config, "--params", "1.3B", "--gpus", "8")
    assert time.process_time() - started < 10.0
    assert "internal error" not in err and code in (0, 4), err


def test_check_text_wraps_to_the_terminal_and_never_into_a_pipe() -> None:
    arguments = ["check", str(CORPUS / "prefetch_overshoot_captured" / "ds_config.json")]
    arguments += ["--params", "1.3e9", "--gpus", "2", "--gpu-memory", "20GiB"]
    arguments += ["--host-memory", "18GiB"]
    code, shown = on_terminal(arguments, 100)
    assert code == 4  # it cannot fit: the exit status is the same wrapped
    assert max(len(line) for line in shown.splitlines()) <= 100
    lines = shown.splitlines()
    hazard = next(i for i, line in enumerate(lines) if line.startswith("  [high] offload pins"))
    assert lines[hazard + 1].startswith(" " * 9 + "cannot")  # under the hazard's text
    piped = subprocess.run(
        [sys.executable, "-m", "oomlens", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
    )
    assert max(len(line) for line in piped.stdout.splitlines()) > 200  # one line per item
    wrapped = subprocess.run(
        [sys.executable, "-m", "oomlens", *arguments, "--width", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrapped.stdout == shown.split("oomlens: check failed")[0]
