"""Lines a library prints only from inside one phase, read as the phase an error that follows
them, with nothing printed in between, happened in.

``transformers``' ``generate()`` logs, while it prepares a generation and before its first
forward pass, and nowhere else (``generation/utils.py``; the same text in the 4.x releases'
``generate`` and in the copies of it that model repositories ship with ``trust_remote_code``):

- ``Input length of input_ids is N, but `max_length` is set to M. This can lead to unexpected
  behavior...`` (``decoder_input_ids`` for an encoder-decoder; the quotes around
  ``max_length`` are backticks, two backticks or quotes by release);
- ``Setting `pad_token_id` to `eos_token_id`:N for open-end generation.``

A generation prints nothing per token: an out-of-memory error whose nearest line above is one of
these came from that generation (a prompt that long, the KV cache it grows).
"""

from __future__ import annotations

from oomlens.facts.log import Phase
from oomlens.lazyregex import lazy_regex

_GENERATE = lazy_regex(
    r"Input length of (?:decoder_)?input_ids is \d{1,12}, but [`'\"]{0,2}max_length[`'\"]{0,2} "
    r"is set to \d{1,12}|Setting [`'\"]?pad_token_id[`'\"]? to [`'\"]?eos_token_id[`'\"]?:"
)


def announced_phase(line: str) -> tuple[Phase, str] | None:
    """The phase ``line`` says the process was entering, and why; None for any other line."""
    match = _GENERATE.search(line[:2000])
    if match is None:
        return None
    return Phase.GENERATION, f"generate() logged {match.group(0)!r} right before the error"
