"""Lines only one phase prints place an error that follows them with nothing in between:
``generate()``'s own log lines.  Real lines: the field corpus' development split and public
threads (cited), pastes built from them by code."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.facts.log import Phase
from oomlens.ingest.log import read_log
from oomlens.ingest.log.library_lines import announced_phase

FIELD = Path(__file__).resolve().parents[3] / "fixtures" / "field_logs"


@pytest.mark.parametrize(
    "line",
    [
        # transformers 4.x generate() and the copies model repositories ship
        "Input length of input_ids is 46371, but `max_length` is set to 128. This can lead to "
        "unexpected behavior. You should consider increasing `max_new_tokens`.",
        "Input length of decoder_input_ids is 600, but ``max_length`` is set to 512. This can "
        "lead to unexpected behavior.",
        "Setting `pad_token_id` to `eos_token_id`:2 for open-end generation.",
    ],
)
def test_generate_announcing_itself(line: str) -> None:
    said = announced_phase(line)
    assert said is not None and said[0] is Phase.GENERATION


@pytest.mark.parametrize(
    "line",
    [
        "Input length of the prompt is too long",
        "Setting pad token for training",
        "max_length is set to 128",
    ],
)
def test_other_lines_announce_nothing(line: str) -> None:
    assert announced_phase(line) is None


# transformers' generate() announcing itself (generation/utils.py); lines as posted in
# github.com/KoboldAI/KoboldAI-Client/issues/382 and (the OOM of a generation)
# github.com/oobabooga/textgen/issues/1041
PAD = "Setting `pad_token_id` to `eos_token_id`:50256 for open-end generation."
GENERATION_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 8.00 "
    "GiB total capacity; 6.63 GiB already allocated; 0 bytes free; 7.29 GiB reserved in total by "
    "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)


def test_generate_announcing_itself_right_before_the_error_places_it_in_generation(
    tmp_path: Path,
) -> None:
    # the field paste: the input-length warning, a blank line, the OOM
    (event,) = read_log(FIELD / "chatglm6b-1137" / "paste.txt").oom_events
    assert event.phase is Phase.GENERATION
    assert "Input length of input_ids is 46371" in (event.phase_evidence or "")
    # a variant built by code from the two threads' lines (a blank line between them, as in
    # the field paste: a line of words right above a lone message is read as its wrapped start)
    paste = tmp_path / "paste.txt"
    paste.write_text(f"{PAD}\n\n{GENERATION_OOM}\n")
    (event,) = read_log(paste).oom_events
    assert event.phase is Phase.GENERATION


def test_a_line_printed_between_the_announcement_and_the_error_unplaces_it(
    tmp_path: Path,
) -> None:
    paste = tmp_path / "paste.txt"
    between = "Output generated in 6.34 seconds (0.32 tokens/s)"
    paste.write_text(f"{PAD}\n{between}\n\n{GENERATION_OOM}\n")
    (event,) = read_log(paste).oom_events
    assert event.phase is Phase.UNKNOWN
