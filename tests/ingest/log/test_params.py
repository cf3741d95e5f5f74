"""Parameter-count lines, as the tools print them, and the corpus scripts' own lines."""

from __future__ import annotations

import pytest

from oomlens.ingest.log import read_log
from oomlens.ingest.log.params import parse_param_count
from tests._corpus import case_dir


@pytest.mark.parametrize(
    ("line", "total", "trainable", "origin"),
    [
        # DeepSpeed >= 0.10.1 zero.Init exit (deepspeed/runtime/zero/partition_parameters.py)
        (
            "[2024-01-01 12:00:00,000] [INFO] [partition_parameters.py:348:__exit__] finished "
            "initializing model - num_params = 291, num_elems = 6.74B",
            6_740_000_000,
            None,
            "deepspeed",
        ),
        # DeepSpeed < 0.10.1
        ("finished initializing model with 1.34B parameters", 1_340_000_000, None, "deepspeed"),
        # transformers Trainer ("Number of trainable parameters = {get_model_param_count(...)}")
        (
            "[INFO|trainer.py:2134] >>   Number of trainable parameters = 124,439,808",
            124_439_808,
            124_439_808,
            "hf_trainer",
        ),
        # peft print_trainable_parameters()
        (
            "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622",
            6_742_609_920,
            4_194_304,
            "peft",
        ),
        ("llama: 220M parameters, micro batch 8 x 4096 tokens", 220_000_000, None, "script"),
    ],
)
def test_parameter_count_lines(line: str, total: int, trainable: int | None, origin: str) -> None:
    reading = parse_param_count(line)
    assert reading is not None
    assert (reading.total, reading.trainable, reading.origin) == (total, trainable, origin)


@pytest.mark.parametrize(
    "line",
    [
        "model_parameters=model.parameters()",
        "params: {'lr': 0.1}",
        "1.5 parameters",
        "num_params = N",
    ],
)
def test_lines_that_only_mention_parameters_are_not_counts(line: str) -> None:
    assert parse_param_count(line) is None


def test_the_corpus_scripts_line_is_read_with_its_source() -> None:
    facts = read_log(case_dir("prefetch_overshoot") / "train.log")
    assert facts.param_count is not None
    assert facts.param_count.total == 1_340_000_000
    assert facts.param_count.source.line is not None
