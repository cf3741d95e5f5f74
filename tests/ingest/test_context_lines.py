"""``oomlens.ingest.context_lines``: the settings a log states, read from real lines of the
crash corpus (our runs) and the field corpus (users' pastes), each cited by file and line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from oomlens.facts import SourceRef
from oomlens.facts.context import Certainty, ContextKey, ContextValue
from oomlens.ingest.context_lines import (
    HEAD_BYTES,
    MAX_LINE_CHARS,
    model_size_params,
    read_context,
    values_in_line,
)
from tests._corpus import CORPUS_DIR

K = ContextKey
FIELD = CORPUS_DIR.parent / "field_logs"


def _line(path: Path, number: int) -> str:
    """Line ``number`` (1-based) of a corpus file, as it is."""
    with open(path, encoding="utf-8", errors="replace") as text:
        for i, line in enumerate(text, 1):
            if i == number:
                return line.rstrip("\n")
    raise AssertionError(f"{path} has no line {number}")


def _values(path: Path, number: int) -> list[ContextValue]:
    return list(values_in_line(_line(path, number), SourceRef(str(path), number)))


def _first(values: list[ContextValue]) -> dict[ContextKey, ContextValue]:
    found: dict[ContextKey, ContextValue] = {}
    for value in values:
        found.setdefault(value.key, value)
    return found


# -- command lines ---------------------------------------------------------------------------


def test_deepspeed_spawned_command_list_gives_the_sequence_length_not_a_bare_size() -> None:
    # launch.py: "process 5496 spawned with command: ['...', '--model', '1.3b', '--seq-len',
    # '512', ...]": the Python list's quoted form
    path = CORPUS_DIR / "prefetch_overshoot" / "train.log"
    line = _line(path, 17)
    assert "spawned with command: [" in line
    found = _first(_values(path, 17))
    assert found[K.SEQ_LEN].value == 512
    assert found[K.SEQ_LEN].certainty is Certainty.STATED
    assert "--seq-len" in found[K.SEQ_LEN].text
    # '--model', '1.3b' names a size, not a model id: no model name, no parameter count
    assert K.MODEL_NAME not in found
    assert model_size_params("1.3b") is None


def test_sigkill_handler_command_list_of_a_field_paste() -> None:
    # DeepSpeed-Chat's step 2 as DeepSpeed's launcher printed it when a rank died
    path = FIELD / "deepspeedexamples-380" / "paste.txt"
    found = _first(_values(path, 2))
    assert found[K.MICRO_BATCH].value == 8
    assert found[K.EVAL_BATCH].value == 8
    assert found[K.SEQ_LEN].value == 512
    assert found[K.GRAD_ACCUM].value == 1
    assert found[K.ZERO_STAGE].value == 0
    assert found[K.MODEL_NAME].value == "facebook/opt-350m"
    assert model_size_params("facebook/opt-350m") == 350_000_000
    for key in (K.MICRO_BATCH, K.SEQ_LEN, K.ZERO_STAGE):
        assert found[key].certainty is Certainty.STATED


def test_runner_cmd_line_with_space_separated_flags() -> None:
    path = FIELD / "deepspeed-4002" / "paste.txt"
    found = _first(_values(path, 3))
    assert (found[K.MICRO_BATCH].value, found[K.GRAD_ACCUM].value) == (8, 1)
    assert (found[K.SEQ_LEN].value, found[K.ZERO_STAGE].value) == (512, 2)
    assert found[K.MODEL_NAME].value == "facebook/opt-1.3b"
    assert found[K.MICRO_BATCH].text.startswith("--per_device_train_batch_size")


# -- argument dumps and banners --------------------------------------------------------------


def _training_arguments_dump(**fields: object) -> str:
    """A ``TrainingArguments`` as transformers prints it: ``TrainingArguments.__str__`` in
    src/transformers/training_args.py, ``attrs_as_str = [f"{k}={v},\\n" for k, v in
    sorted(self_as_dict.items())]`` then ``f"{self.__class__.__name__}(\\n{''.join(...)})"``.
    The field names are TrainingArguments' own (transformers is not installed here)."""
    return "TrainingArguments(\n" + "".join(f"{k}={v},\n" for k, v in sorted(fields.items())) + ")"


def test_training_arguments_dump_reads_each_field_once_and_no_neighbour(tmp_path: Path) -> None:
    dump = _training_arguments_dump(
        _n_gpu=1,
        auto_find_batch_size=False,
        bf16=True,
        eval_accumulation_steps=None,
        fp16=False,
        gradient_accumulation_steps=4,
        gradient_checkpointing=True,
        optim="adamw_torch",
        optim_args=None,
        per_device_eval_batch_size=16,
        per_device_train_batch_size=8,
        per_gpu_eval_batch_size=None,
        per_gpu_train_batch_size=None,
        torch_compile=False,
        hub_model_id=None,
    )
    log = tmp_path / "train.log"
    log.write_text("[INFO|trainer.py] Training/evaluation parameters " + dump + "\n")
    found = {v.key: v for v in read_context(log)}
    assert found[K.MICRO_BATCH].value == 8
    assert found[K.MICRO_BATCH].text.startswith("per_device_train_batch_size")
    assert found[K.EVAL_BATCH].value == 16
    assert found[K.GRAD_ACCUM].value == 4
    assert found[K.PRECISION].value == "bf16"
    assert found[K.OPTIMIZER].value == "adam"
    assert found[K.GRADIENT_CHECKPOINTING].value is True
    # eval_accumulation_steps=None states nothing
    assert K.EVAL_ACCUMULATION_STEPS not in found
    assert all(v.certainty is Certainty.STATED for v in found.values())
    # the value's line is the dump's own line for it
    source = found[K.MICRO_BATCH].source
    assert source is not None and source.line is not None
    assert _line(log, source.line) == "per_device_train_batch_size=8,"


def test_hf_trainer_banner_per_device_batch_is_the_micro_batch_the_total_is_not() -> None:
    # trainer.py's "***** Running training *****" banner
    path = FIELD / "transformers-14541" / "paste.txt"
    assert "Instantaneous batch size per device = 8" in _line(path, 5)
    assert [(v.key, v.value) for v in _values(path, 5)][0] == (K.MICRO_BATCH, 8)
    total = _line(path, 6)
    assert "Total train batch size (w. parallel, distributed & accumulation) = 64" in total
    assert _values(path, 6) == []


def test_unsloth_banner_total_batch_size_is_the_global_batch() -> None:
    path = FIELD / "unsloth-465" / "paste.txt"
    per_device = _first(_values(path, 3))
    assert per_device[K.MICRO_BATCH].value == 2
    assert per_device[K.GRAD_ACCUM].value == 4
    assert "Total batch size = 8" in _line(path, 4)
    assert K.MICRO_BATCH not in _first(_values(path, 4))


def test_deepspeed_config_print_with_dots() -> None:
    # DeepSpeedConfig.print: "  {} {} {}".format(arg, "." * (29 - len(arg)), value)
    path = CORPUS_DIR / "accumulation_derived_micro" / "train.log"
    lines = {
        "gradient_accumulation_steps .. 2": (K.GRAD_ACCUM, 2),
        "train_micro_batch_size_per_gpu  16": (K.MICRO_BATCH, 16),
        "zero_optimization_stage ...... 3": (K.ZERO_STAGE, 3),
        "optimizer_name ............... adamw": (K.OPTIMIZER, "adam"),
    }
    text = path.read_text()
    for wanted, (key, value) in lines.items():
        number = next(i for i, line in enumerate(text.splitlines(), 1) if line.endswith(wanted))
        found = _first(_values(path, number))
        assert found[key].value == value, wanted
    # "train_batch_size ............. 64" is DeepSpeed's global batch: not a micro batch
    number = next(
        i
        for i, line in enumerate(text.splitlines(), 1)
        if line.endswith("train_batch_size ............. 64")
    )
    assert _values(path, number) == []


# -- identifiers are names, not tails ----------------------------------------------------------


def test_identifiers_are_not_split_into_a_known_tail() -> None:
    # DeepSpeed's JSON dump of its autotuning section (accumulation_derived_micro:75-78)
    path = CORPUS_DIR / "accumulation_derived_micro" / "train.log"
    for number, name in (
        (74, "max_train_batch_size"),
        (75, "min_train_batch_size"),
        (76, "max_train_micro_batch_size_per_gpu"),
        (77, "min_train_micro_batch_size_per_gpu"),
    ):
        assert f'"{name}"' in _line(path, number)
        assert _values(path, number) == [], name
    # transformers' mismatch report: "ds train_batch_size=32 vs hf train_batch_size
    # (calculated)=4": prose words, then an identifier that is no setting of ours
    field = FIELD / "trlx-376" / "paste.txt"
    assert "ds train_batch_size=32" in _line(field, 13)
    assert _values(field, 13) == []


def test_prose_with_leading_words_keeps_its_setting() -> None:
    # train_zero3.py's own summary, and accelerate's find_executable_batch_size retries
    path = CORPUS_DIR / "accumulation_derived_micro" / "train.log"
    number = next(
        i
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if line.startswith("micro batch 16, gradient accumulation 2")
    )
    found = _first(_values(path, number))
    assert (found[K.MICRO_BATCH].value, found[K.GRAD_ACCUM].value) == (16, 2)
    retry = CORPUS_DIR / "oom_caught_and_retried" / "train.log"
    found = _first(_values(retry, 2))
    assert found[K.MICRO_BATCH].value == 16
    assert found[K.MICRO_BATCH].certainty is Certainty.INFERRED  # "batch size" is loose


def test_batch_by_tokens_and_generation_summaries() -> None:
    act = _first(_values(CORPUS_DIR / "activation_memory" / "train.log", 5))
    assert (act[K.MICRO_BATCH].value, act[K.SEQ_LEN].value) == (8, 4096)
    gen = _first(_values(CORPUS_DIR / "generation_oom" / "train.log", 10))
    assert (gen[K.NEW_TOKENS].value, gen[K.PROMPTS].value) == (2048, 128)


# -- model names and cards ---------------------------------------------------------------------


def test_model_names_with_sizes() -> None:
    assert model_size_params("meta-llama/Llama-2-13b-hf") == 13_000_000_000
    assert model_size_params("Qwen2-72B") == 72_000_000_000
    assert model_size_params("bigscience/bloom-560m") == 560_000_000
    assert model_size_params("facebook/opt-6.7b") == 6_700_000_000
    path = FIELD / "deepspeed-4000" / "paste.txt"
    found = _first(_values(path, 5))
    assert found[K.MODEL_NAME].value == "THUDM/chatglm2-6b"
    assert found[K.MODEL_NAME].certainty is Certainty.STATED


def test_a_script_named_after_a_size_is_not_the_model() -> None:
    path = FIELD / "transformers-28872" / "paste.txt"
    assert "deepspeed_7b_finetune.py" in _line(path, 2)
    assert K.MODEL_NAME not in _first(_values(path, 2))


def test_gpu_names_from_nvidia_smi_and_device_lists() -> None:
    smi = _first(_values(FIELD / "deepspeed-192" / "paste.txt", 9))
    assert smi[K.GPU_NAME].value == "V100-SXM2"
    listed = _first(_values(FIELD / "diffusers-10191" / "paste.txt", 4))
    assert listed[K.GPU_NAME].value == "RTX A6000"


def test_a_log_states_nothing_it_does_not_show() -> None:
    # the fragmentation scenario's log states no micro batch, precision or optimizer
    found = {v.key for v in read_context(CORPUS_DIR / "fragmentation" / "train.log")}
    assert not found & {K.MICRO_BATCH, K.PRECISION, K.OPTIMIZER, K.ZERO_STAGE, K.SEQ_LEN}


def test_read_context_keeps_the_first_statement_of_each_key() -> None:
    path = CORPUS_DIR / "lightning_batch_finder_recovers" / "train.log"
    found = {v.key: v for v in read_context(path)}
    # "Batch size 2 succeeded, trying batch size 4": the first statement wins
    assert found[K.MICRO_BATCH].value == 2
    source = found[K.MICRO_BATCH].source
    assert source is not None and source.line == 11


# -- hostile input -------------------------------------------------------------------------------


def test_a_10_mb_single_line_is_bounded(tmp_path: Path) -> None:
    real = _line(CORPUS_DIR / "prefetch_overshoot" / "train.log", 17)
    huge = tmp_path / "one_line.log"
    with open(huge, "w", encoding="utf-8") as out:
        written = 0
        while written < 10 * 1024 * 1024:
            out.write(real + " ")
            written += len(real) + 1
    start = time.perf_counter()
    values = read_context(huge)
    elapsed = time.perf_counter() - start
    assert elapsed < 30, elapsed  # a bound on work, generous for a shared machine
    # only the line's first MAX_LINE_CHARS are searched: the statements there, once each
    assert {v.key for v in values} == {K.SEQ_LEN}
    assert len(values) == 1
    assert MAX_LINE_CHARS < len(real) * 100


def test_many_lines_stop_at_the_head(tmp_path: Path) -> None:
    # the settings are printed at start-up: a statement after HEAD_BYTES is not read
    real = _line(CORPUS_DIR / "prefetch_overshoot" / "train.log", 1)
    log = tmp_path / "long.log"
    with open(log, "w", encoding="utf-8") as out:
        written = 0
        while written <= HEAD_BYTES:
            out.write(real + "\n")
            written += len(real) + 1
        out.write(_line(CORPUS_DIR / "prefetch_overshoot" / "train.log", 17) + "\n")
    assert read_context(log) == ()


@pytest.mark.parametrize(
    "binary", ["fragmentation/snapshot_rank0.pickle", "model_states_too_large/ds_config.json"]
)
def test_binary_or_other_files_are_read_without_error(binary: str) -> None:
    values = read_context(CORPUS_DIR / binary)
    assert isinstance(values, tuple)


def test_an_unreadable_path_gives_nothing(tmp_path: Path) -> None:
    assert read_context(tmp_path / "absent.log") == ()
    assert read_context(tmp_path) == ()


def test_lightning_states_the_world_size_and_the_deepspeed_cast() -> None:
    # our Lightning DeepSpeed run (lightning 2.6) and a user's DDP paste (an older Lightning's
    # wording): the world size after MEMBER's slash; the cast the strategy announces
    ours = CORPUS_DIR / "lightning_deepspeed_states" / "train.log"
    theirs = FIELD / "lightning-4705" / "paste.txt"
    found = {v.key: v for v in values_in_line(_line(ours, 5), SourceRef(str(ours), 5))}
    assert found[K.WORLD_SIZE].value == 1 and found[K.WORLD_SIZE].certainty is Certainty.STATED
    cast = list(values_in_line(_line(ours, 6), SourceRef(str(ours), 6)))
    assert [(v.key, v.value) for v in cast] == [(K.PRECISION, "bf16")]
    other = {v.key: v for v in values_in_line(_line(theirs, 5), SourceRef(str(theirs), 5))}
    assert other[K.WORLD_SIZE].value == 2
    # the rank is not the world size
    assert not list(values_in_line("GLOBAL_RANK: 3, MEMBER: 4/", SourceRef("x", 1)))
