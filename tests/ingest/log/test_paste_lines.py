"""What else a paste or a framework's log says: a process killed by a signal (however it is
named), torchrun's failure table without its header, a run that ended normally and the OOMs it
caught on the way, memory_summary()'s table, Lightning's parameter count, the platform."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from oomlens.facts.kernel import FatalSignalKind
from oomlens.ingest.log import read_log
from oomlens.lazyregex import _LazyPattern
from oomlens.session import AnalysisOptions, analyze
from tests.ingest.log._field import paste_path

ASSETS = Path(__file__).parents[2] / "assets" / "logs"
LAB_LINES = (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines()
NO_DEEPSPEED = AnalysisOptions(prefer_deepspeed=False)


def _write(tmp_path: Path, lines: list[str], name: str = "paste.txt") -> Path:
    target = tmp_path / name
    target.write_text("\n".join(lines) + "\n")
    return target


def _signals(path: Path) -> list[tuple[int | None, str | None]]:
    return [(f.exitcode, f.signal) for f in read_log(path).process_failures]


@pytest.mark.parametrize(("code", "name"), [(-9, "SIGKILL"), (-7, "SIGBUS"), (-11, "SIGSEGV")])
def test_a_subprocess_killed_by_a_signal(tmp_path: Path, code: int, name: str) -> None:
    # accelerate launch re-raises its worker's death as CalledProcessError (CPython's wording)
    error = subprocess.CalledProcessError(code, ["/usr/bin/python3", "train.py"])
    path = _write(
        tmp_path,
        [
            "Traceback (most recent call last):",
            '  File "/usr/bin/accelerate", line 8, in <module>',
            "    sys.exit(main())",
            f"subprocess.CalledProcessError: {error}",
        ],
    )
    assert (code, name) in _signals(path)
    verdict = analyze([path], options=NO_DEEPSPEED).verdict.value
    # SIGKILL: the OOM killer; SIGBUS: a shared-memory mapping (/dev/shm) that could not be
    # backed (oomlens.derive.signals); SIGSEGV: a crash, not memory
    assert verdict == ("other_failure" if name == "SIGSEGV" else "host_oom")


def test_signals_named_by_a_shell_and_by_pythons_fault_handler(tmp_path: Path) -> None:
    # real output of this machine: bash's job notices and faulthandler's header
    script = (
        'python3 -c "import os,signal;os.kill(os.getpid(),9)";'
        'python3 -X faulthandler -c "import os,signal;os.kill(os.getpid(),signal.SIGBUS)";'
        "true"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    path = _write(tmp_path, done.stderr.splitlines())
    facts = read_log(path)
    kinds = {line.kind for line in facts.fatal_signals}
    assert {FatalSignalKind.SIGKILL, FatalSignalKind.SIGBUS} <= kinds
    assert any(
        line.text.startswith("Fatal Python error: Bus error") for line in facts.fatal_signals
    )
    assert analyze([path], options=NO_DEEPSPEED).verdict.value == "host_oom"  # the SIGKILL


def test_killed_glued_to_a_progress_bar_and_zshs_job_notice() -> None:
    # chatglm6b-191: "... 4/8 [02:10<02:22, 35.73s/it]Killed"; baichuan2-138: zsh's
    # "[1]    26478 killed     python test.py" after a progress bar
    facts = read_log(paste_path("chatglm6b-191"))
    assert [line.kind for line in facts.fatal_signals] == [FatalSignalKind.SIGKILL]
    assert (-9, "SIGKILL") in _signals(paste_path("baichuan2-138"))
    for case in ("chatglm6b-191", "baichuan2-138"):
        assert analyze([paste_path(case)], options=NO_DEEPSPEED).verdict.value == "host_oom"


def test_torchruns_failure_table_without_its_header(tmp_path: Path) -> None:
    # the lab log's table for a rank killed with SIGKILL, pasted from its root cause on
    start = next(
        i
        for i, line in enumerate(LAB_LINES)
        if line.startswith("Root Cause") and "-9 (pid" in LAB_LINES[i + 5]
    )
    path = _write(tmp_path, LAB_LINES[start : start + 9])
    facts = read_log(path)
    [summary] = facts.failure_summaries
    [failure] = summary.failures
    assert (failure.rank, failure.exitcode, failure.signal, failure.root_cause) == (
        1,
        -9,
        "SIGKILL",
        True,
    )


def test_rich_logging_agent_line_names_the_killed_rank() -> None:
    # accelerate-1214: " ERROR    failed (exitcode: -9) local_rank: 5 (pid: 22) of  api.py:673"
    assert (-9, "SIGKILL") in _signals(paste_path("accelerate-1214"))


def _lab_oom(allocate: str) -> str:
    head = f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {allocate}"
    line = next(x for x in LAB_LINES if x.startswith(head))
    return line.split(": ", 1)[1]


def test_ooms_caught_by_a_retry_loop_before_a_normal_end(tmp_path: Path) -> None:
    # accelerate's find_executable_batch_size: each OOM logged as a warning, the run goes on
    oom = _lab_oom("2.00 MiB")
    lines = ["model 350m: 369M parameters"]
    lines += [
        f"2026-12-01 10:24:10,121 - WARNING - train - batch size {batch} ran out of memory, "
        f"retrying smaller: {oom}"
        for batch in (16, 8, 4)
    ]
    lines += [
        f"2026-12-01 10:24:54,{780 + step} - INFO - train - step {step}/5 loss 10.56 (0.2s)"
        for step in range(1, 6)
    ]
    lines.append("2026-12-01 10:24:54,961 - INFO - train - training finished with batch size 2")
    path = _write(tmp_path, lines)
    facts = read_log(path)
    assert facts.oom_events == ()
    assert len(facts.caught_oom_events) == 3
    assert facts.completion is not None and facts.completion.kind == "script"
    assert analyze([path], options=NO_DEEPSPEED).verdict.value == "no_failure"


def test_an_oom_raised_to_the_top_is_not_caught_by_a_later_progress_line(tmp_path: Path) -> None:
    # stdout is block-buffered: progress lines can land after the traceback that ended the run
    oom = _lab_oom("2.00 MiB")
    lines = [
        "step 1/5 loss 10.56",
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        "    loss.backward()",
        f"torch.OutOfMemoryError: {oom}",
        "step 2/5 loss 10.52",
    ]
    facts = read_log(_write(tmp_path, lines))
    assert len(facts.oom_events) == 1 and facts.caught_oom_events == ()


def test_a_crash_then_a_rerun_that_finishes_in_the_same_file(tmp_path: Path) -> None:
    oom = _lab_oom("2.00 MiB")
    lines = [
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        "    loss.backward()",
        f"torch.OutOfMemoryError: {oom}",
        "step 1/5 loss 10.56",
        "step 5/5 loss 10.51",
        "training finished",
    ]
    facts = read_log(_write(tmp_path, lines))
    assert len(facts.oom_events) == 1 and facts.caught_oom_events == ()


def test_memory_summary_table_counts_the_oom() -> None:
    # pytorch-35901: torch.cuda.memory_summary() with "CUDA OOMs: 1 | cudaMalloc retries: 1"
    facts = read_log(paste_path("pytorch-35901"))
    [summary] = facts.allocator_summaries
    mib = 2**20
    assert (summary.device, summary.ooms, summary.malloc_retries) == (0, 1, 1)
    assert (summary.allocated_current, summary.allocated_peak) == (1062 * mib, 4877 * mib)
    assert (summary.reserved_current, summary.reserved_peak) == (12420 * mib, 12420 * mib)
    assert analyze([paste_path("pytorch-35901")], options=NO_DEEPSPEED).verdict.value == "gpu_oom"


def test_lightning_model_summary_gives_the_parameter_count(tmp_path: Path) -> None:
    # Lightning's ModelSummary footer, as its rich and plain summaries print it
    for total, expected in (("368 M", 368_000_000), ("1.2 B", 1_200_000_000), ("7.2 K", 7200)):
        path = _write(
            tmp_path,
            [
                f"Trainable params: {total}",
                "Non-trainable params: 0",
                f"Total params: {total}",
                "Total estimated model params size (MB): 1,475.584",
            ],
            f"summary_{expected}.log",
        )
        count = read_log(path).param_count
        assert count is not None and (count.total, count.origin) == (expected, "lightning")


def test_platform_hints(tmp_path: Path) -> None:
    facts = read_log(paste_path("mxnet-6798"))  # "root@ff598b664d63:/mxnet/example/nce-loss#"
    assert [h.kind for h in facts.platform_hints] == ["container"]
    path = _write(
        tmp_path,
        [
            "Linux DESKTOP-1 5.15.90.1-microsoft-standard-WSL2 #1 SMP x86_64 GNU/Linux",
            '  File "/mnt/c/Users/me/train.py", line 3, in <module>',
        ],
    )
    assert [h.kind for h in read_log(path).platform_hints] == ["wsl"]


def test_a_window_with_no_failure_and_no_progress_is_unknown() -> None:
    # glm-112: three warnings of a model loading, the thread says it was then killed
    report = analyze([paste_path("glm-112")], options=NO_DEEPSPEED)
    assert report.verdict.value == "unknown"
    assert "no normal end" in report.verdict_reason


def test_line_by_line_and_the_fast_pass_read_a_whole_log_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the lab log is paste-sized; read it again as if it were not: the same OOM facts, and
    # line by line only adds (a traceback whose header the capture lost)
    from oomlens.ingest.log import reader

    lab = ASSETS / "lab_log_torch2.11_h200.txt"
    slow = read_log(lab)
    monkeypatch.setattr(reader, "LINE_BY_LINE_BYTES", 0)
    fast = read_log(lab)
    assert slow.line_by_line and not fast.line_by_line
    assert [(e.source, e.message, e.phase) for e in slow.oom_events] == [
        (e.source, e.message, e.phase) for e in fast.oom_events
    ]
    seen = {(e.source.line, e.exception_class) for e in slow.exceptions}
    assert {(e.source.line, e.exception_class) for e in fast.exceptions} <= seen
    assert [(f.exitcode, f.signal) for f in slow.process_failures] == [
        (f.exitcode, f.signal) for f in fast.process_failures
    ]


def test_the_paste_patterns_stay_linear_on_adversarial_lines() -> None:
    import regex

    from oomlens.ingest import documents
    from oomlens.ingest.log import paste, tb_shapes, torch_oom

    patterns = [
        value
        for module in (paste, tb_shapes, documents, torch_oom)
        for value in vars(module).values()
        if isinstance(value, regex.Pattern | _LazyPattern)  # lazy: compiled at first use
    ]
    assert len(patterns) > 40
    attacks = [
        "│" + " " * 60000,
        "│ /" + "a/" * 30000,
        "> " * 30000,
        "File ~/" + "x:1, in " * 7000,
        "[" + "x](y) in " * 6000,
        "Process1has1.00GiBmemoryinuse." * 2000,
        "1.00GiBalreadyallocated;" * 2400,
        "Error: " * 8000,
        "a" * 60000 + ":",
        "╭" + "─" * 60000,
        "-" * 30000 + "> 1",
        "[1]    " + "1 " * 30000,
        "step,loss," * 6000,
    ]
    for pattern in patterns:
        for attack in attacks:
            # a catastrophic pattern would need far longer than this: anchored at the start of
            # 60 kB lines, or searched in the bounded heads these modules search
            pattern.match(attack, timeout=5.0)
            pattern.search(attack[:8000], timeout=5.0)
    assert torch_oom.parse_oom_message("Tried to allocate 1.00 MiB " * 3000) is not None


def test_nvidia_smi_tables_in_a_paste() -> None:
    mib = 2**20
    # gpt2chitchat-19: four cards, the first one full
    usage = read_log(paste_path("gpt2chitchat-19")).gpu_usage
    assert [(u.device, u.used, u.total, u.origin) for u in usage] == [
        (0, 15514 * mib, 16130 * mib, "nvidia_smi"),
        (1, 0, 16130 * mib, "nvidia_smi"),
        (2, 0, 16130 * mib, "nvidia_smi"),
        (3, 0, 16130 * mib, "nvidia_smi"),
    ]
    # textsum-4: the usage row pasted without its leading "|"
    [row] = read_log(paste_path("textsum-4")).gpu_usage
    assert (row.used, row.total) == (0, 12194 * mib)
    # so-70074789: the process table (Xorg and gnome-shell on the card)
    processes = read_log(paste_path("so-70074789")).gpu_processes
    assert [(p.device, p.pid, p.kind, p.name, p.used) for p in processes] == [
        (0, 1047, "G", "/usr/lib/xorg/Xorg", 168 * mib),
        (0, 5521, "G", "/usr/lib/xorg/Xorg", 363 * mib),
        (0, 5637, "G", "/usr/bin/gnome-shell", 161 * mib),
    ]


def test_a_scripts_free_of_total_line(tmp_path: Path) -> None:
    # the shape of a script printing torch.cuda.mem_get_info() before loading its model
    path = _write(tmp_path, ["model 125m: 134M parameters; 1998 MiB free of 143156 MiB"])
    facts = read_log(path)
    [row] = facts.gpu_usage
    assert (row.used, row.total, row.origin) == ((143156 - 1998) * 2**20, 143156 * 2**20, "script")
    assert facts.param_count is not None and facts.param_count.total == 134_000_000
