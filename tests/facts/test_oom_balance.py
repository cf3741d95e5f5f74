"""The OOM message's balance sheet, on messages real runs and real users printed (the crash
corpus and pastes of the field corpus, parsed by the log reader's own parser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlens.facts.log import OomMessage
from oomlens.facts.oom_balance import balance
from oomlens.ingest.log.torch_oom import parse_oom_message

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2
SLACK = 2 * GIB


def _message_of(path: Path) -> OomMessage:
    for line in path.read_text(errors="replace").splitlines():
        message = parse_oom_message(line)
        if message is not None and message.tried_to_allocate is not None:
            return message
    raise AssertionError(f"no OOM message with numbers in {path}")


def _field(case: str) -> OomMessage:
    return _message_of(ROOT / "fixtures" / "field_logs" / case / "paste.txt")


def _crash(case: str) -> OomMessage:
    return _message_of(ROOT / "fixtures" / "crash_logs" / case / "train.log")


def test_a_leftover_process_shows_as_memory_the_allocator_does_not_hold() -> None:
    # "Tried to allocate 36.00 MiB (GPU 0; 10.76 GiB total capacity; 996.23 MiB already
    # allocated; 8.81 MiB free; 1010.00 MiB reserved in total by PyTorch)": no process listed
    b = balance(_field("residualmaskingnetwork-15"), SLACK)
    assert b.reserved == pytest.approx(1010 * MIB, abs=MIB)
    assert b.outside_allocator == pytest.approx((10.76 * 1024 - 1010 - 8.81) * MIB, rel=0.01)
    assert b.outside_unlisted == b.outside_allocator and not b.others
    assert not b.oversized and not b.capped


def test_the_job_seen_from_a_container_is_not_another_process() -> None:
    # trl CI: four processes listed, no "this process has" clause; PyTorch holds 7.85 GiB +
    # 86.90 MiB, and "Process 21194 has 8.07 GiB" is that job itself
    message = _field("trl-5197")
    b = balance(message, SLACK)
    assert b.self_listed is not None and b.self_listed.bytes == pytest.approx(8.07 * GIB, 0.01)
    assert {p.pid for p in b.others} == {21197, 21200, 21203}
    assert b.others_total == pytest.approx((366 + 484) * MIB + 3.40 * GIB, rel=0.01)
    assert b.in_use_self == b.self_listed.bytes
    # without the container's own process the device had room: the others took the difference
    assert b.free is not None and b.request is not None
    assert b.free < b.request <= b.free + b.others_total


def test_with_this_process_clause_every_listed_process_is_another() -> None:
    # the crash corpus' other_process case: 2.2+ message with the "this process has" clause
    b = balance(_crash("other_process"), SLACK)
    assert b.self_listed is None and b.others
    assert b.in_use_self == b.message.process_in_use


def test_a_cap_with_room_on_the_device_is_the_limit() -> None:
    # torch.compile run at its 10 GiB 'allowed' cap while another process holds 8.54 GiB of a
    # 139.80 GiB card with 120.67 GiB free
    b = balance(_crash("compiled_activation"), SLACK)
    assert b.capped and b.limit == 10 * GIB
    assert b.others_total == pytest.approx(8.54 * GIB, rel=0.01)
    assert b.live_share is not None and b.live_share > 0.95


def test_a_request_larger_than_the_card_is_oversized() -> None:
    # "Tried to allocate 37631.79 GiB (GPU 3; 79.21 GiB total capacity; ..."
    b = balance(_field("megatrondeepspeed-bigscience-384"), SLACK)
    assert b.oversized
    assert b.request_share is not None and b.request_share > 400


def test_torch_1_0_cached_is_the_reserved_but_unallocated_figure() -> None:
    # pytorch/examples#621 (torch 1.2): 435.61 MiB allocated, 24.17 MiB free, 26.39 MiB cached
    # on a 1024 MiB card: "cached" was amount_cached - amount_allocated
    b = balance(_field("pytorch-examples-621"), SLACK)
    assert b.unallocated == pytest.approx(26.39 * MIB, abs=0.01 * MIB)
    assert b.reserved == pytest.approx((435.61 + 26.39) * MIB, abs=0.02 * MIB)
    assert b.outside_allocator == pytest.approx((1024 - 435.61 - 26.39 - 24.17) * MIB, abs=MIB)


def test_shortfall_says_whether_a_defragmented_allocator_would_have_failed_too() -> None:
    # LoRA ViT: 1.50 GiB requested, 1.41 GiB free, 13.22 - 13.19 GiB cached: 60 MiB short
    b = balance(_field("loravit-6"), SLACK)
    assert b.shortfall == pytest.approx(0.06 * GIB, abs=16 * MIB)
    assert b.live_share is not None and b.live_share > 0.9
    # algorithmic-efficiency: 2.51 GiB requested with 7.66 GiB reserved but unallocated:
    # the memory was there, in cached pieces
    frag = balance(_field("algoperf-426"), SLACK)
    assert frag.shortfall is not None and frag.shortfall < 0


def test_the_field_corpus_numbers_balance_wherever_a_message_has_them() -> None:
    # every labelled paste's first message: the sheet never invents memory
    corpus = ROOT / "fixtures" / "field_logs"
    checked = 0
    for case in sorted(p for p in corpus.iterdir() if (p / "case.json").is_file()):
        numbers = json.loads((case / "case.json").read_text()).get("oom_numbers")
        if not numbers or "total_capacity" not in numbers:
            continue
        try:
            message = _message_of(case / "paste.txt")
        except AssertionError:
            continue
        b = balance(message, SLACK)
        if b.outside_allocator is not None and b.capacity is not None:
            assert 0 <= b.outside_allocator <= b.capacity
            assert b.outside_unlisted is not None and b.outside_unlisted <= b.outside_allocator
            checked += 1
    assert checked >= 30
