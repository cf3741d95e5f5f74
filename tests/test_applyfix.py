"""``oomlens.applyfix``: a report's top fix applied to the run's own files and command."""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from oomlens.applyfix import apply_fix, merge_patch, rewrite_command, top_fix
from oomlens.errors import UsageError
from oomlens.report import Report
from oomlens.session import analyze
from tests._corpus import case_dir, manifest


@functools.cache
def _report(name: str) -> Report:
    return analyze([case_dir(name)])


def _command(name: str) -> str:
    """The case's recorded command, without the emulation's variable (not the run's own)."""
    words = shlex.split(manifest(name)["command"])
    return shlex.join(w for w in words if not w.startswith("EMULATE_GPU_MEMORY_GIB="))


# -- RFC 7396 ------------------------------------------------------------------------------------

# RFC 7396, Appendix A: every example (target, patch, result)
_RFC_7396_EXAMPLES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), _RFC_7396_EXAMPLES)
def test_merge_patch_is_rfc_7396(target: Any, patch: Any, result: Any) -> None:
    before = json.dumps(target)
    assert merge_patch(target, patch) == result
    assert json.dumps(target) == before  # the target is not changed


# -- the command ---------------------------------------------------------------------------------


def test_an_alias_of_the_same_setting_is_set() -> None:
    # activation_memory's own command: --micro-batch 8; the fix names HF's flag
    command = _command("activation_memory")
    new, notes = rewrite_command(
        command, {"--per_device_train_batch_size": "2", "--gradient_accumulation_steps": "4"}, {}
    )
    words = shlex.split(new)
    assert words[words.index("--micro-batch") + 1] == "2"
    assert "--per_device_train_batch_size" not in words
    # the command has no accumulation flag: nothing is added, a note says so
    assert "--gradient_accumulation_steps" not in words
    assert len(notes) == 1 and "--gradient_accumulation_steps 4" in notes[0]
    assert "not added" in notes[0]
    # everything else is as it was
    before = shlex.split(command)
    before[before.index("--micro-batch") + 1] = "2"
    assert words == before


def test_the_flag_equals_value_form_and_every_occurrence() -> None:
    command = "python train.py --batch_size=16 --lr 1e-4 --batch_size 32"
    new, notes = rewrite_command(command, {"--per_device_train_batch_size": "4"}, {})
    assert new == "python train.py --batch_size=4 --lr 1e-4 --batch_size 4"
    assert notes == []


def test_another_setting_of_a_similar_name_is_left_alone() -> None:
    # DeepSpeed's train_batch_size is the global batch; eval batch is another setting
    command = "python train.py --train_batch_size 64 --per_device_eval_batch_size 8"
    new, notes = rewrite_command(command, {"--per_device_train_batch_size": "4"}, {})
    assert new == command
    assert len(notes) == 1


def test_a_switch_or_a_last_word_without_value_is_not_clobbered() -> None:
    command = "python train.py --gradient_accumulation_steps --bf16 --micro-batch"
    new, notes = rewrite_command(
        command, {"--gradient_accumulation_steps": "4", "--per_device_train_batch_size": "2"}, {}
    )
    assert new == command
    assert len(notes) == 2 and all("has no value" in n for n in notes)


def test_a_negative_number_is_a_value_not_a_flag() -> None:
    command = "python train.py --max_steps -1 --micro_batch_size 8"
    new, _ = rewrite_command(command, {"--micro_batch_size": "2"}, {})
    assert new == "python train.py --max_steps -1 --micro_batch_size 2"


def test_the_config_path_is_replaced_in_either_form(tmp_path: Path) -> None:
    old = str(case_dir("model_states_too_large") / "ds_config.json")
    new_path = str(tmp_path / "ds_config.json")
    for command in (
        f"deepspeed train.py --deepspeed_config {old}",
        f"deepspeed train.py --deepspeed={old}",
    ):
        new, notes = rewrite_command(command, {}, {old: new_path})
        assert old not in new and new_path in new
        assert notes == []
    # the recorded command names the config by a path relative to the run's own folder: the
    # same file name is taken for it, and the note says so
    recorded = _command("model_states_too_large")
    new, notes = rewrite_command(recorded, {}, {old: new_path})
    assert new_path in new and "runs/model_states_too_large/ds_config.json" not in new
    assert len(notes) == 1 and "same file name" in notes[0]
    # another file name is not taken for it
    other = recorded.replace("ds_config.json", "other.json")
    new, notes = rewrite_command(other, {}, {old: new_path})
    assert new == other and len(notes) == 1 and new_path in notes[0]


# -- the report's top fix written as files -------------------------------------------------------


def test_a_config_patch_is_merged_into_the_config_the_run_used(tmp_path: Path) -> None:
    report = _report("model_states_too_large")
    _, fix = top_fix(report)
    assert fix.config_patch
    config = case_dir("model_states_too_large") / "ds_config.json"
    command = f"deepspeed --num_gpus 2 train_zero3.py --deepspeed_config {config} --model 2.7b"
    applied = apply_fix(report, str(tmp_path / "out"), command)
    written = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    original = json.loads(config.read_text())
    assert written == merge_patch(original, fix.config_patch)
    assert written != original
    # the command now runs the patched config
    assert applied.command is not None
    assert str(tmp_path / "out" / "ds_config.json") in applied.command
    assert str(config) not in applied.command
    record = json.loads((tmp_path / "out" / "fix.json").read_text())
    assert record["diagnosis"] == applied.diagnosis.id == report.top.id  # type: ignore[union-attr]
    assert record["config_patch"] == fix.config_patch
    assert sorted(record["written"]) == sorted(
        str(tmp_path / "out" / n) for n in ("ds_config.json", "command.txt")
    )


def test_an_environment_fix_prefixes_the_command_and_is_written_as_a_file(tmp_path: Path) -> None:
    report = _report("fragmentation")
    _, fix = top_fix(report)
    assert dict(fix.environment) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    applied = apply_fix(report, str(tmp_path), _command("fragmentation"))
    assert applied.command == (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + _command("fragmentation")
    )
    assert (tmp_path / "fix.env").read_text() == (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
    )
    assert (tmp_path / "command.txt").read_text() == applied.command + "\n"


def test_computed_arguments_rewrite_the_runs_own_command(tmp_path: Path) -> None:
    report = _report("compiled_activation")
    _, fix = top_fix(report)
    assert fix.arguments and fix.predicted_peak_bytes is not None
    applied = apply_fix(report, str(tmp_path), _command("compiled_activation"))
    assert applied.command is not None
    words = shlex.split(applied.command)
    batch = next(v for k, v in fix.arguments.items() if "batch" in k)
    assert words[words.index("--batch-size") + 1] == batch
    record = json.loads((tmp_path / "fix.json").read_text())
    assert record["predicted_peak_bytes"] == fix.predicted_peak_bytes


def test_without_the_command_its_arguments_are_only_recorded(tmp_path: Path) -> None:
    report = _report("compiled_activation")
    applied = apply_fix(report, str(tmp_path))
    assert applied.command is None
    assert any("--command" in n for n in applied.notes)
    assert not (tmp_path / "command.txt").exists()


def test_no_fix_is_a_usage_error(tmp_path: Path) -> None:
    report = _report("fragmentation_fixed")  # completed: nothing to fix
    with pytest.raises(UsageError) as info:
        apply_fix(report, str(tmp_path / "out"))
    assert "no fix" in info.value.message
    assert not (tmp_path / "out").exists()


def test_an_unwritable_folder_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UsageError) as info:
        apply_fix(_report("fragmentation"), str(blocker / "out"))
    assert str(blocker) in info.value.message


def test_a_config_patch_without_a_config_is_written_as_the_fixs_keys(tmp_path: Path) -> None:
    # Lightning built the DeepSpeed config itself: none is among the inputs; the file holds
    # only the fix's keys (DeepSpeedStrategy(config=...) adds batch, accumulation, precision)
    report = _report("lightning_deepspeed_states")
    assert report.facts.config is None
    applied = apply_fix(report, str(tmp_path), _command("lightning_deepspeed_states"))
    written = json.loads((tmp_path / "ds_config.json").read_text())
    assert written == applied.fix.config_patch
    assert "gradient_accumulation_steps" not in written  # Lightning refuses it in a config
    assert any("holds only the fix's keys" in note for note in applied.notes)


ACCELERATE = Path(__file__).parent / "assets" / "accelerate" / "cogview4_ds2.yaml"


@pytest.mark.parametrize("crlf", [False, True])
def test_an_accelerate_config_that_pins_the_accumulation_is_patched_too(
    tmp_path: Path, crlf: bool
) -> None:
    # diffusers' published accelerate config pins gradient_accumulation_steps: 1 for the
    # DeepSpeed plugin; a fix that multiplies the accumulation must change it there as well,
    # or transformers refuses the run for the mismatch
    config = tmp_path / "accelerate_ds2.yaml"
    text = ACCELERATE.read_text()
    config.write_bytes((text.replace("\n", "\r\n") if crlf else text).encode())
    report = _report("activation_memory")
    _, fix = top_fix(report)
    assert "--gradient_accumulation_steps" in fix.arguments
    wanted = fix.arguments["--gradient_accumulation_steps"]
    command = (
        f"accelerate launch --config_file={config} train.py --micro-batch 8 "
        "--gradient_accumulation_steps 1"
    )
    applied = apply_fix(report, str(tmp_path / "out"), command)
    written = tmp_path / "out" / "accelerate_config.yaml"
    patched = written.read_bytes().decode()
    assert f"  gradient_accumulation_steps: {wanted}" in patched
    assert ("\r\n" in patched) is crlf
    # every other line as it was
    before = [line for line in text.splitlines() if "gradient_accumulation_steps" not in line]
    after = [line for line in patched.splitlines() if "gradient_accumulation_steps" not in line]
    assert before == after
    assert applied.command is not None
    assert f"--config_file={written}" in applied.command
    assert f"--gradient_accumulation_steps {wanted}" in applied.command
    assert any("pins what the fix changes" in note for note in applied.notes)


def test_a_plain_command_names_no_accelerate_config() -> None:
    from oomlens.applyfix import accelerate_config_of

    assert accelerate_config_of("torchrun --nproc_per_node 2 train.py --config_file x") is None
    launched = "python -m accelerate.commands.launch --config_file c.yaml t.py"
    assert accelerate_config_of(launched) == "c.yaml"
