"""Kernel logs as separate inputs: dmesg, dmesg -T, journal and ISO stamps."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from oomlens.facts import SourceRef
from oomlens.facts.kernel import FatalSignalKind, KernelOomKill, OomKillerInvoked, SlurmOomKill
from oomlens.ingest.log.kernel import parse_kernel_line, read_kernel_log

KILL = (
    "Out of memory: Killed process 4242 (python) total-vm:{vm}kB, anon-rss:{anon}kB, "
    "file-rss:0kB, shmem-rss:{shm}kB, UID:0 pgtables:1000kB oom_score_adj:0"
)


def _kill(vm: int, anon: int, shm: int = 0) -> str:
    # the kernel's message (reference notes 1.11), numbers filled by code
    return KILL.format(vm=vm, anon=anon, shm=shm)


def test_every_stamp_form_gives_time_and_sizes(tmp_path: Path) -> None:
    line = _kill(64 * 1024**2, 60 * 1024**2, 1024)
    log = tmp_path / "kernel.log"
    log.write_text(
        "\n".join(
            [
                f"[ 5012.124000] {line}",
                f"[Mon Nov 30 04:58:18 2026] {line}",
                f"Nov 30 04:58:19 gpu-node-1 kernel: {line}",
                f"2026-11-30T04:58:20,123456+00:00 {line}",
                "[ 5012.000001] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
                "oom_score_adj=0",
                "unrelated line",
            ]
        )
        + "\n"
    )
    facts = read_kernel_log(log)
    assert facts.lines == 6 and len(facts.oom_kills) == 4
    assert all(
        k.anon_rss == 60 * 1024**3 and k.shmem_rss == 1024**2 and not k.cgroup
        for k in facts.oom_kills
    )
    assert facts.oom_kills[0].uptime_seconds == 5012.124 and facts.oom_kills[0].timestamp is None
    assert facts.oom_kills[1].timestamp == datetime(2026, 11, 30, 4, 58, 18)
    assert facts.oom_kills[2].timestamp is not None and facts.oom_kills[2].timestamp.second == 19
    assert facts.oom_kills[3].timestamp == datetime(2026, 11, 30, 4, 58, 20, 123456)
    (invoked,) = facts.oom_invocations
    assert invoked.process_name == "python"


def test_scheduler_and_shell_lines() -> None:
    ref = SourceRef("x", 1)
    slurm = parse_kernel_line(
        "slurmstepd: error: Detected 2 oom_kill event in StepId=5178325.batch. "
        "Some of the step tasks have been OOM Killed.",
        ref,
    )
    assert isinstance(slurm, SlurmOomKill) and slurm.count == 2 and slurm.step_id == "5178325.batch"
    task = parse_kernel_line("srun: error: gpu-node-3: task 5: Out Of Memory", ref)
    assert isinstance(task, SlurmOomKill) and (task.node, task.task) == ("gpu-node-3", 5)
    shm = parse_kernel_line(
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
        "shared memory (shm).",
        ref,
    )
    assert shm is not None and shm.kind is FatalSignalKind.SHM_EXHAUSTED  # type: ignore[union-attr]
    killed = parse_kernel_line(
        "/bin/bash: line 1:  4242 Killed                  python train.py", ref
    )
    assert killed is not None and killed.kind is FatalSignalKind.SIGKILL  # type: ignore[union-attr]
    assert parse_kernel_line("Killing subprocess 4242", ref) is None


def test_cgroup_kill_and_constraint() -> None:
    ref = SourceRef("x", 1)
    kill = parse_kernel_line(
        "Memory cgroup out of memory: " + _kill(10, 20)[len("Out of memory: ") :], ref
    )
    assert isinstance(kill, KernelOomKill) and kill.cgroup and kill.anon_rss == 20 * 1024
    constraint = parse_kernel_line(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/system.slice/job.scope,task_memcg=/system.slice/job.scope,task=python,pid=4242,uid=0",
        ref,
    )
    assert isinstance(constraint, OomKillerInvoked)
    assert (constraint.constraint, constraint.memcg, constraint.task, constraint.pid) == (
        "CONSTRAINT_MEMCG",
        "/system.slice/job.scope",
        "python",
        4242,
    )
