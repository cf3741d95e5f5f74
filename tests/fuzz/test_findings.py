"""Fuzz findings kept as regression tests: each case is rebuilt from its (kind, number, seed)
(``make_case`` is deterministic) and run as the campaign ran it.  Each failed before its fix
(see tests/fuzz/CAMPAIGNS.md); the unit tests named there pin the same defects down."""

from __future__ import annotations

import pytest

from tests.fuzz.cases import make_case
from tests.fuzz.runner import run_case, warm_up


@pytest.mark.parametrize(
    ("kind", "number", "seed"),
    [
        ("snapshot", 533, 120502),  # a block address that is a list reached the replay
        ("snapshot", 226, 120503),  # a recorded gc threshold torch refuses
        ("snapshot", 369, 120503),  # a trace no allocator could follow (KeyError in the model)
        ("log", 592, 120503),  # "a total capacity of 0 GiB": two rules divided by zero
        ("config", 343, 120504),  # a 401-digit train_batch_size: a divisor search past 120 s
        ("log", 227, 120506),  # a capacity of 0: non_pytorch_memory divided by zero
        ("log", 1016, 120506),  # a message that says pinning with no frame: IndexError
        ("snapshot", 178, 120506),  # 100,000 page maps at one address: quadratic rewind, limit
        ("snapshot", 155, 120507),  # an infinite roundup division count: OverflowError
        ("config", 53, 120507),  # a list micro batch times a 22-digit accumulation: OverflowError
        ("snapshot", 416, 120508),  # a gc threshold too large for a float: OverflowError
    ],
)
def test_a_fuzz_finding_stays_fixed(kind: str, number: int, seed: int) -> None:
    warm_up()
    result = run_case(make_case(kind, number, seed), clock="cpu", kill_after=120.0)
    assert result["findings"] == [], result
