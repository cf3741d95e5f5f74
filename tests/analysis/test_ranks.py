"""Who failed first, who only died because a peer did."""

from __future__ import annotations

from pathlib import Path

from oomlens.analysis.ranks import rank_picture
from oomlens.ingest.elastic import read_error_file
from oomlens.ingest.log import read_log

ASSETS = Path(__file__).parents[1] / "assets" / "logs"
LAB_LINES = (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines()


def _section(name: str) -> list[str]:
    start = next(i for i, line in enumerate(LAB_LINES) if line.startswith("=" * 30 + f" {name} "))
    end = next(
        i for i in range(start + 1, len(LAB_LINES)) if LAB_LINES[i].startswith("=" * 30 + " ")
    )
    return LAB_LINES[start:end]


def _read(tmp_path: Path, name: str):
    target = tmp_path / f"{name}.log"
    target.write_text("\n".join(_section(name)) + "\n")
    return read_log(target)


def test_plain_torchrun_oom_is_attributed_to_the_root_cause_rank(tmp_path: Path) -> None:
    picture = rank_picture([_read(tmp_path, "E_torchrun_plain_oom_0")])
    assert picture.first_failed is not None and picture.first_failed.rank == 1
    assert picture.first_failed.outcome == "oom" and picture.first_failed.attributed
    assert picture.peer_victims == (0,)
    victim = next(s for s in picture.ranks if s.rank == 0)
    assert victim.signal == "SIGTERM" and "SIGTERM" in (victim.peer_evidence or "")


def test_sigkilled_rank_is_first_and_the_terminated_peer_a_victim(tmp_path: Path) -> None:
    picture = rank_picture([_read(tmp_path, "E_torchrun_plain_kill_0")])
    first = picture.first_failed
    assert first is not None and (first.rank, first.outcome, first.signal) == (
        1,
        "signal",
        "SIGKILL",
    )
    assert picture.peer_victims == (0,)


def test_two_ranks_failing_on_their_own_ordered_by_time(tmp_path: Path) -> None:
    body = [
        line
        for line in _section("B10_cudnn_full")
        if line.startswith(("Traceback", "  ", "torch."))
    ]
    lines = [
        "[rank1]:[E1130 04:58:20.000000000 x.cpp:1] first",
        *(f"[rank1]: {x}" for x in body),
        "[rank0]:[E1130 04:58:25.000000000 x.cpp:1] later",
        *(f"[rank0]: {x}" for x in body),
    ]
    target = tmp_path / "two.log"
    target.write_text("\n".join(lines) + "\n")
    picture = rank_picture([read_log(target)])
    assert picture.first_failed is not None and picture.first_failed.rank == 1
    assert picture.basis == "timestamp"


def test_error_file_joins_the_picture(tmp_path: Path) -> None:
    facts = read_error_file(ASSETS / "torchelastic_error_file_example.json", local_rank=1)
    picture = rank_picture([_read(tmp_path, "E_torchrun_record_oom_4")], error_files=[facts])
    first = picture.first_failed
    assert first is not None and first.rank == 1 and first.outcome == "oom"
    assert any(f.origin == "error_file" for f in first.failures)


def test_deepspeed_launcher_kill_without_traceback_is_unattributed(tmp_path: Path) -> None:
    # launch.py's sigkill_handler lines (reference notes 1.8), pids filled by code
    stamp = "[2026-11-30 05:00:0{s},000] [{level}] [launch.py:{n}:{func}] "
    lines = [
        stamp.format(s=1, level="INFO", n=272, func="main")
        + f"process {4240 + r} spawned with command: "
        + f"['/usr/bin/python3', '-u', 'train.py', '--local_rank={r}']"
        for r in range(2)
    ]
    lines += [
        stamp.format(s=9, level="INFO", n=333, func="sigkill_handler")
        + f"Killing subprocess {4240 + r}"
        for r in range(2)
    ]
    lines.append(
        stamp.format(s=9, level="ERROR", n=339, func="sigkill_handler")
        + "['/usr/bin/python3', '-u', 'train.py', '--local_rank=1'] exits with return code = -9"
    )
    target = tmp_path / "ds.log"
    target.write_text("\n".join(lines) + "\n")
    picture = rank_picture([read_log(target)])
    assert picture.first_failed is None
    assert [e.return_code for e in picture.launcher_exits] == [-9]
    assert sorted(r for r in picture.peer_victims if r is not None) == [0, 1]


def _case_picture(name: str):
    from tests._corpus import case_dir

    case = case_dir(name)
    logs = [read_log(p) for p in sorted(case.rglob("*.log")) if p.name != "kernel.log"]
    return rank_picture(logs)


def test_ranks_failing_at_the_same_moment_are_not_ordered_by_timestamp() -> None:
    # both ranks of the real prefetch_overshoot run print their OOM at 06:44:31.453
    picture = _case_picture("prefetch_overshoot")
    assert [s.first_time for s in picture.ranks][0] == [s.first_time for s in picture.ranks][1]
    assert picture.basis != "timestamp"
    assert picture.same_time == (0, 1)
    first = picture.first_failed
    assert first is not None and first.rank == 0  # printed first (train.log:263 before :341)
    assert picture.basis == "line_order"


def test_a_unique_earliest_time_decides_by_timestamp() -> None:
    picture = _case_picture("model_states_too_large")  # rank 1 at .547, rank 0 at .656
    assert picture.first_failed is not None and picture.first_failed.rank == 1
    assert picture.basis == "timestamp" and picture.same_time == ()


def test_peer_victims_are_ranks_and_never_the_straggler() -> None:
    picture = _case_picture("nccl_timeout")
    assert None not in picture.peer_victims
    assert picture.suspected_stragglers == (1,)
    assert not set(picture.peer_victims) & set(picture.suspected_stragglers)
    assert picture.peer_victims == (0,)
    assert None not in _case_picture("device_side_assert").peer_victims
