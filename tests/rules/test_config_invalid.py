"""``config_invalid`` on configs that a framework refuses, with the fix the refusal calls for."""

from __future__ import annotations

from pathlib import Path

from oomlens.session import analyze
from tests._corpus import case_dir


def _mismatch_log(tmp_path: Path, listed: list[str]) -> Path:
    """The crash corpus' transformers mismatch (a real run), its listing replaced."""
    lines = (case_dir("hf_trainer_config_mismatch") / "train.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "mismatch TrainingArguments" in line)
    end = next(i for i in range(start, len(lines)) if "easiest method" in lines[i])
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines[: start + 1] + listed + lines[end:]) + "\n")
    return path


def test_a_scheduler_mismatch_is_a_refused_key_set_to_auto_not_a_batch_mismatch(
    tmp_path: Path,
) -> None:
    # transformers-29348: the listed key has dots, so it was not read as a key at all, and
    # the listing was taken for a batch mismatch ("do not match the GPU count", 70%).
    listed = [
        "[rank0]: - ds scheduler.params.total_num_steps=0 vs hf num_training_steps (calculated)=260"
    ]
    report = analyze([_mismatch_log(tmp_path, listed)])
    top = report.diagnoses[0]
    assert top.id == "config_invalid"
    assert "accumulation_mismatch" not in [d.id for d in report.diagnoses]
    assert top.fixes[0].config_patch == {"scheduler": {"params": {"total_num_steps": "auto"}}}


def test_batch_keys_in_the_listing_stay_a_batch_mismatch() -> None:
    report = analyze([case_dir("hf_trainer_config_mismatch")])
    assert report.diagnoses[0].id == "accumulation_mismatch"


def test_one_batch_key_that_mismatches_is_said_in_one_grammatical_sentence(
    tmp_path: Path,
) -> None:
    listed = ["[rank0]: - ds train_micro_batch_size_per_gpu=1 vs hf per_device_train_batch_size=8"]
    [top, *_] = analyze([_mismatch_log(tmp_path, listed)]).diagnoses
    assert top.id == "accumulation_mismatch"
    assert top.summary.endswith(
        "the DeepSpeed config's train_micro_batch_size_per_gpu does not match the trainer's "
        "arguments"
    )
