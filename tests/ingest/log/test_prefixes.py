"""Launcher prefixes are stripped in a loop and what they said is kept."""

from __future__ import annotations

import pytest

from oomlens.ingest.log.prefixes import NO_PREFIX, strip_prefixes

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 GiB."


@pytest.mark.parametrize(
    ("prefix", "host", "rank", "local_rank"),
    [
        ("[default1]:", None, None, 1),
        ("[rank3]: ", None, 3, None),
        ("[default0]:[rank4]: ", None, 4, 0),
        ("worker-1: [rank2]: ", "worker-1", 2, None),
        ("gpu-q-13: [default3]:[rank11]: ", "gpu-q-13", 11, 3),
        ("[1,5]<stderr>:", None, 5, None),
        ("(VllmWorker rank=1 pid=254) ", None, 1, None),
        (" 7: ", None, 7, None),
        ("stderr: [default2]:", None, None, 2),
        ("[trainer6]:", None, None, 6),
        ("[rank: 3] ", None, 3, None),
        ("worker-2: [rank: 17] ", "worker-2", 17, None),
    ],
)
def test_stacked_prefixes_are_stripped_and_kept(
    prefix: str, host: str | None, rank: int | None, local_rank: int | None
) -> None:
    rest, meta = strip_prefixes(prefix + OOM, set())
    assert rest == OOM
    assert (meta.host, meta.rank, meta.local_rank) == (host, rank, local_rank)


@pytest.mark.parametrize(
    "line",
    [
        OOM,
        "RuntimeError: CUDA error: out of memory",
        "srun: error: node1: task 0: Out Of Memory",
        "slurmstepd: error: Detected 1 oom-kill event(s) in step 3955284.0 cgroup.",
        "W1130 04:59:49.946000 2167 torch/distributed/elastic/multiprocessing/api.py:1012] Sendin"
        "g process",
        "[2026-11-30 04:59:45,737] [INFO] [launch.py:1:main] dist_world_size=2",
        "[W1130 04:58:18.033935144 Module.cpp:204] symbolizing C++ stack trace",
        "python3: can't open file",
        "",
    ],
)
def test_lines_that_start_like_prefixes_but_are_not(line: str) -> None:
    rest, meta = strip_prefixes(line, set())
    assert rest == line and meta is NO_PREFIX


def test_a_host_confirmed_once_is_recognised_without_digits_later() -> None:
    hosts: set[str] = set()
    strip_prefixes("login: [rank0]: Traceback (most recent call last):", hosts)
    rest, meta = strip_prefixes("login: plain text", hosts)
    assert (rest, meta.host) == ("plain text", "login")


def test_stream_key_separates_ranks_and_hosts() -> None:
    keys = {
        strip_prefixes(p + "x", set())[1].key
        for p in ("[rank0]: ", "[rank1]: ", "a-1: [rank0]: ", "")
    }
    assert len(keys) == 4


def test_lightnings_rank_prefix_is_the_ranks_stream() -> None:
    # lightning_utilities' rank_prefixed_message: f"[rank: {rank}] {message}", the global rank
    lightning = strip_prefixes("[rank: 3] Seed set to 42", set())
    torch = strip_prefixes("[rank3]: Seed set to 42", set())
    assert lightning == torch
    for line in ("[rank: 3]Seed set", "[rank:3] Seed set", "[rank: x] Seed", "[rank: 1234567] a"):
        assert strip_prefixes(line, set())[1] is NO_PREFIX
