"""The streaming reader on the real torch 2.11 log and on variants generated from real lines."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomlens.errors import InputError
from oomlens.facts.log import OomKind, Phase
from oomlens.ingest.log import ReaderLimits, read_log
from oomlens.lazyregex import _LazyPattern

ASSETS = Path(__file__).parents[2] / "assets" / "logs"
LAB = ASSETS / "lab_log_torch2.11_h200.txt"
GiB, MiB = 1024**3, 1024**2
LAB_LINES = LAB.read_text().splitlines()
REFERENCE_LINES = (ASSETS / "reference_lines.txt").read_text().splitlines()


def _section(name: str) -> list[str]:
    start = next(i for i, line in enumerate(LAB_LINES) if line.startswith("=" * 30 + f" {name} "))
    end = next(
        i for i in range(start + 1, len(LAB_LINES)) if LAB_LINES[i].startswith("=" * 30 + " ")
    )
    return LAB_LINES[start:end]


def _stderr_of(name: str) -> list[str]:
    lines = _section(name)
    begin = lines.index("--- stderr ---") + 1
    end = next(i for i in range(begin, len(lines)) if lines[i].startswith("--- rc="))
    return lines[begin:end]


def _write(tmp_path: Path, lines: list[str], name: str = "run.log") -> Path:
    target = tmp_path / name
    target.write_text("\n".join(lines) + "\n")
    return target


@pytest.fixture(scope="module")
def lab():
    return read_log(LAB)


def test_lab_log_every_oom_path_is_an_event(lab) -> None:
    # every line that states an OOM in the real log, found by simple text search
    expected = {
        number
        for number, line in enumerate(LAB_LINES, start=1)
        if ("out of memory" in line or "would exceed allowed memory" in line)
        and not line.startswith(
            ("  torch.OutOfMemoryError", "FILE ")
        )  # quotes inside torchrun summaries
        and "#" not in line[:3]
    }
    found = {event.source.line for event in lab.oom_events + lab.caught_oom_events}
    assert found == expected
    assert all(event.origin == "log" for event in lab.oom_events)
    # the script's own "CAUGHT: '<message>'" lines, each followed by the next experiment's
    # raised error: the program went on from them
    caught = {event.source.line for event in lab.caught_oom_events}
    assert caught == {n for n in expected if LAB_LINES[n - 1].startswith("CAUGHT: ")}


def test_lab_log_fragmentation_numbers_and_phase(lab) -> None:
    frag = next(
        e for e in lab.oom_events if e.message.reserved_unallocated == 68 * GiB and e.traceback
    )
    assert frag.message.allocated_by_pytorch == 70 * GiB
    assert frag.traceback.frames[-1].filename == "/tmp/oomlab/B2_frag_full.py"
    conv = next(e for e in lab.oom_events if e.message.tried_to_allocate == 20 * MiB)
    assert conv.phase is Phase.FORWARD and "conv.py" in (conv.phase_evidence or "")


def test_lab_log_multi_line_and_chained_messages(lab) -> None:
    asynchronous = next(e for e in lab.oom_events if e.message.kind is OomKind.ALLOCATOR_ASYNC)
    assert asynchronous.message.complete and asynchronous.message.free == round(138.22 * GiB)
    drivers = [e for e in lab.oom_events if e.message.kind is OomKind.DRIVER]
    assert len(drivers) == 3
    assert sum(1 for e in drivers if e.traceback is not None and e.traceback.chained) == 1


def test_lab_log_torchrun_summaries(lab) -> None:
    assert len(lab.failure_summaries) == 6
    for summary in lab.failure_summaries:
        assert summary.complete and summary.title == "/tmp/oomlab/child.py"
        root = [f for f in summary.failures if f.root_cause]
        others = [f for f in summary.failures if not f.root_cause]
        assert [(f.rank, f.local_rank) for f in root] == [(1, 1)]
        assert [(f.rank, f.exitcode, f.signal) for f in others] == [(0, -15, "SIGTERM")]
    exits = [next(f for f in s.failures if f.root_cause).exitcode for s in lab.failure_summaries]
    assert sorted(exits) == [-9, -6, 1, 1, 1, 1]
    with_oom = [f for s in lab.failure_summaries for f in s.failures if f.oom is not None]
    assert len(with_oom) == 2 and all(
        f.error_file and f.error_file.endswith("error.json") for f in with_oom
    )
    agent = [f for f in lab.process_failures if f.origin == "torchrun_agent"]
    assert [(f.local_rank, f.exitcode) for f in agent] == [
        (1, 1),
        (1, 1),
        (1, -9),
        (1, -6),
        (1, 1),
        (1, 1),
    ]
    assert len(lab.closing_signals) == 6
    assert lab.world_size is not None and lab.world_size.value == 2


def test_lab_log_summary_quotes_fold_into_the_workers_oom(lab) -> None:
    quoted = [e for e in lab.oom_events if e.reported_elsewhere]
    assert len(quoted) == 2
    # one printed by a plain worker (no prefix: the rank comes from the summary), one with --tee
    assert {e.source.rank for e in quoted} == {1}
    tee = next(e for e in quoted if LAB_LINES[e.source.line - 1].startswith("[default1]:"))
    assert tee.phase is Phase.UNKNOWN and tee.traceback is not None


def _interleave(a: list[str], b: list[str]) -> list[str]:
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        out.extend(x[i] for x in (a, b) if i < len(x))
    return out


def test_two_ranks_interleaved_line_by_line(tmp_path: Path) -> None:
    body = [line for line in _stderr_of("B10_cudnn_full") if line]
    log = _write(
        tmp_path, _interleave([f"[rank0]: {x}" for x in body], [f"[rank1]: {x}" for x in body])
    )
    facts = read_log(log)
    assert sorted(e.source.rank for e in facts.oom_events) == [0, 1]
    assert all(e.phase is Phase.FORWARD and len(e.traceback.frames) == 5 for e in facts.oom_events)
    assert facts.ranks_seen == (0, 1)


def test_glued_lines_of_two_ranks_are_split(tmp_path: Path) -> None:
    body = [line for line in _stderr_of("B10_cudnn_full") if line]
    rank0 = [f"[default0]:[rank0]: {x}" for x in body]
    rank1 = [f"[default1]:[rank1]: {x}" for x in body]
    glued = [a + b for a, b in zip(rank0, rank1, strict=True)]  # two writes, one newline
    facts = read_log(_write(tmp_path, glued))
    assert sorted(e.source.rank for e in facts.oom_events) == [0, 1]


def test_pdsh_hosts_and_stacked_prefixes(tmp_path: Path) -> None:
    body = [line for line in _stderr_of("B2_frag_full") if line]
    lines = [f"worker-1: [default0]:[rank8]: {x}" for x in body]
    (event,) = read_log(_write(tmp_path, lines)).oom_events
    assert (event.source.rank, event.source.host) == (8, "worker-1")
    assert event.message.reserved_unallocated == 68 * GiB


def test_per_rank_file_takes_the_rank_of_its_layout(tmp_path: Path) -> None:
    (event,) = read_log(_write(tmp_path, _stderr_of("B1_huge_uncaught")), rank=5).oom_events
    assert event.source.rank == 5


def _see_memory_usage(label: str, ma: float, max_ma: float, ca: float, max_ca: int) -> list[str]:
    # DeepSpeed >= 0.18.3 prints these with print(); the f-string of deepspeed/runtime/utils.py
    memory = (
        f"MA {round(ma, 2)} GB         Max_MA {round(max_ma, 2)} GB         "
        f"CA {round(ca, 2)} GB         Max_CA {max_ca} GB "
    )
    return [label, memory, "CPU Virtual Memory:  used = 12.3 GB, percent = 10.2%"]


def test_see_memory_usage_series_is_bounded_with_growth_statistics(tmp_path: Path) -> None:
    lines: list[str] = []
    for step in range(3000):
        lines += [
            "[2026-11-30 05:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]"
        ]
        lines += _see_memory_usage("Engine before forward", 10 + step * 0.01, 12, 20, 20)
        lines += _see_memory_usage("Engine after step", 11 + step * 0.01, 14, 20, 20)
    facts = read_log(
        _write(tmp_path, lines), limits=ReaderLimits(series_head=8, series_middle=32, series_tail=8)
    )
    (series,) = facts.memory
    assert series.total_samples == 6000 and len(series.samples) <= 48 + 2
    assert series.samples[0].label == "Engine before forward" and series.samples[
        0
    ].cpu_used == round(12.3 * GiB)
    assert series.samples[-1].step == 2999
    after = next(s for s in series.by_label if s.label == "Engine after step")
    assert after.allocated.count == 3000
    assert after.allocated.slope == pytest.approx(0.01 * GiB, rel=0.01)
    assert facts.steps.max_step == 2999 and facts.steps.total == 3000


def test_reference_deepspeed_and_launcher_lines(tmp_path: Path) -> None:
    lines = list(REFERENCE_LINES)
    lines += [
        "[2026-11-30 05:00:01,000] [INFO] [launch.py:272:main] process 4242 spawned with command: "
        "['/usr/bin/python3', '-u', 'run_clm.py', '--local_rank=1']",
        "[2026-11-30 05:00:09,000] [INFO] [launch.py:333:sigkill_handler] Killing subprocess 4242",
        "[2026-11-30 05:00:09,500] [ERROR] [launch.py:339:sigkill_handler] ['/usr/bin/python3', '"
        "-u', "
        "'run_clm.py', '--local_rank=1'] exits with return code = -9",
        "[2026-11-30 05:00:00,000] [INFO] [launch.py:163:main] WORLD INFO DICT: {'localhost': [0,"
        " 1, 2, 3]}",
        "[2026-11-30 05:00:02,000] [WARNING] [stage3.py:2391:step] 2 pytorch allocator cache flus"
        "hes since last step. "
        "this happens when there is high memory pressure and is detrimental to performance.",
    ]
    facts = read_log(_write(tmp_path, lines))
    (batch,) = facts.batch_assertions
    assert (
        batch.train_batch_size,
        batch.micro_batch_per_gpu,
        batch.gradient_accumulation_steps,
        batch.world_size,
    ) == (8, 2, 1, 1)
    (exit_line,) = facts.launcher_exits
    assert exit_line.return_code == -9 and exit_line.cmd_local_rank == 1
    (killed,) = facts.killed_subprocesses
    assert (killed.pid, killed.local_rank) == (4242, 1)
    assert facts.world_size is not None and (facts.world_size.value, facts.world_size.origin) == (
        4,
        "world_info",
    )
    assert facts.cache_flushes.warnings == 1 and facts.cache_flushes.total_flushes == 2
    (peer,) = facts.peer_failures
    assert peer.kind == "watchdog_timeout" and peer.source.rank == 0
    samples = [s for series in facts.memory for s in series.samples]
    assert [round(s.allocated / GiB, 2) for s in samples] == [11.76, 0.0, 0.72]
    assert [s.max_reserved // GiB for s in samples] == [12, 15, 2]
    failures = [(f.origin, f.exitcode, f.local_rank) for f in facts.process_failures]
    assert failures == [("torchrun_agent", -9, 3), ("torchrun_agent", -9, 0)]
    assert facts.slurm_oom_kills[0].count == 1 and facts.slurm_oom_kills[0].step_id == "3955284.0"


def _dump_lines() -> list[str]:
    # DeepSpeedConfig.print: two spaces, the key, 29 - len(key) dots, the value; then the user json
    stamp = "[2026-11-30 05:00:00,000] [INFO] [config.py:1007:print] "
    entries = {
        "train_batch_size": "8",
        "train_micro_batch_size_per_gpu": "2",
        "world_size": "4",
        "zero_config": "stage=3 contiguous_gradients=True reduce_bucket_size=2359296",
    }
    lines = [stamp.replace("print]", "print]") + "DeepSpeedEngine configuration:"]
    for key, value in entries.items():
        dots = "." * (29 - len(key))
        lines.append(stamp + (f"  {key} {dots} {value}" if dots else f"  {key}  {value}"))
    lines.append(stamp.replace("1007", "998") + "  json = {")
    lines += [
        '    "train_batch_size":8, ',
        '    "steps_per_print":inf, ',
        '    "zero_optimization":{',
        '        "reduce_bucket_size":2.359296e+06',
        "    }",
        "}",
    ]
    lines.append("[2026-11-30 05:00:01,000] [INFO] [engine.py:1:x] next")
    return lines


def test_config_dump_is_kept_raw(tmp_path: Path) -> None:
    facts = read_log(_write(tmp_path, _dump_lines()))
    dump = facts.config_dump
    assert dump is not None and dump.complete
    assert dict(dump.entries)["train_micro_batch_size_per_gpu"] == "2"
    assert dict(dump.entries)["zero_config"].startswith("stage=3")
    assert dump.json_text is not None and '"steps_per_print":inf, ' in dump.json_text
    assert dump.json_text.rstrip().endswith("}")
    assert facts.world_size is not None and facts.world_size.origin == "config_dump"


def test_kernel_lines_inside_a_training_log(tmp_path: Path) -> None:
    # the kernel's message format (reference notes 1.11), numbers filled by code
    lines = [
        "[ 5012.123456] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_C"
        "OMP), order=0, oom_score_adj=0",
        "[ 5012.123999] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowe"
        "d=0,"
        "oom_memcg=/slurm/uid_0/job_7,task_memcg=/slurm/uid_0/job_7/step_0,task=python,pid=4242,uid=0",
        "[ 5012.124000] Memory cgroup out of memory: Killed process 4242 (python) "
        f"total-vm:{64 * 1024 * 1024}kB, anon-rss:{60 * 1024 * 1024}kB, file-rss:1024kB, "
        "shmem-rss:0kB, UID:0 pgtables:1000kB oom_score_adj:0",
        "/bin/bash: line 1:  4242 Bus error               (core dumped) python train.py",
    ]
    facts = read_log(_write(tmp_path, lines))
    (kill,) = facts.kernel_oom_kills
    assert (
        kill.cgroup
        and kill.pid == 4242
        and kill.anon_rss == 60 * GiB
        and kill.uptime_seconds == 5012.124
    )
    constraint = next(i for i in facts.oom_invocations if i.constraint)
    assert constraint.constraint == "CONSTRAINT_MEMCG" and constraint.memcg == "/slurm/uid_0/job_7"
    assert [f.kind.value for f in facts.fatal_signals] == ["SIGBUS"]


def test_steps_and_losses(tmp_path: Path) -> None:
    lines = [
        "{'loss': 2.3456, 'grad_norm': 1.5, 'learning_rate': 1e-05, 'epoch': 0.1}",
        "{'loss': 1.9, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.2}",
        " 45%|████▌     | 450/1000 [12:10<14:52,  1.62s/it]",
    ]
    facts = read_log(_write(tmp_path, lines))
    assert facts.steps.total == 3 and facts.steps.max_step == 450
    assert facts.steps.loss is not None and facts.steps.loss.last == 1.9


def test_many_ooms_are_bounded_and_counted(tmp_path: Path) -> None:
    line = next(
        x
        for x in LAB_LINES
        if x.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00")
    )
    facts = read_log(_write(tmp_path, [line, ""] * 300), limits=ReaderLimits(max_oom_events=50))
    assert len(facts.oom_events) == 50 and dict(facts.dropped)["oom_events"] == 250


def test_log_cut_mid_traceback_keeps_what_it_can(tmp_path: Path) -> None:
    body = _stderr_of("B2_frag_full")
    cut = "\n".join(body)
    cut = cut[: cut.index("is reserved by PyTorch") - 10]
    target = tmp_path / "cut.log"
    target.write_text(cut)
    facts = read_log(target)
    (event,) = facts.oom_events
    assert not event.message.complete and event.message.allocated_by_pytorch == 70 * GiB
    assert facts.ended_mid_line and not facts.ended_in_traceback  # cut after the exception line
    assert any("cut" in note or "end of line" in note for note in facts.notes)


def test_every_truncation_of_a_short_crash_log_reads(tmp_path: Path) -> None:
    data = ("\n".join(_stderr_of("B7_private_pool")) + "\n").encode()
    target = tmp_path / "t.log"
    found = 0
    for cut in range(1, len(data), 7):
        target.write_bytes(data[:cut])
        facts = read_log(target)
        found += len(facts.oom_events)
    assert found > 0


def test_compressed_and_plain_give_the_same_facts(tmp_path: Path) -> None:
    target = tmp_path / "lab.log.gz"
    target.write_bytes(gzip.compress(LAB.read_bytes()))
    plain, packed = read_log(LAB), read_log(target, display=str(LAB))
    assert [e.message for e in plain.oom_events] == [e.message for e in packed.oom_events]
    assert packed.compression == "gzip"


def test_empty_file_is_an_input_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        read_log(empty)


def test_binary_garbage_reads_without_error(tmp_path: Path) -> None:
    rng = random.Random(7)
    target = tmp_path / "garbage.bin"
    target.write_bytes(bytes(rng.randrange(256) for _ in range(300_000)))
    facts = read_log(target)
    assert facts.lines > 0 and facts.bytes_read == 300_000 and facts.oom_events == ()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(min_size=1, max_size=4000), st.sampled_from(LAB_LINES[130:140] + REFERENCE_LINES))
def test_reader_never_raises_on_arbitrary_bytes(tmp_path: Path, noise: bytes, real: str) -> None:
    target = tmp_path / "fuzz.log"
    mid = len(noise) // 2
    target.write_bytes(noise[:mid] + real.encode() + noise[mid:])
    facts = read_log(target)
    # a line was read, or the input (e.g. a bare gzip header) was reported as cut
    assert (facts.lines >= 1 or facts.notes) and len(facts.oom_events) <= 4


def test_regexes_stay_linear_on_adversarial_lines(tmp_path: Path) -> None:
    import regex

    from oomlens.ingest import detect
    from oomlens.ingest.log import (
        deepspeed,
        kernel,
        prefixes,
        steps,
        timestamps,
        torch_oom,
        torchrun,
    )
    from oomlens.ingest.log import traceback as tb

    patterns = [
        value
        for module in (
            torch_oom,
            deepspeed,
            kernel,
            prefixes,
            steps,
            timestamps,
            torchrun,
            tb,
            detect,
        )
        for value in vars(module).values()
        if isinstance(value, regex.Pattern | _LazyPattern)  # lazy: compiled at first use
    ]
    assert len(patterns) > 60
    attacks = [
        "1" * 60000,
        " " * 60000,
        "1." * 30000,
        "[rank" * 12000,
        "(a pid=" * 8000,
        "Tried to allocate " + "1.00 MiB " * 6000,
        'File "' + "x" * 60000,
        "NVML_SUCCESS == " + "r " * 30000,
        "MA 1.0 GB " * 6000,
        "step " * 12000,
        "a: " * 20000,
        "{'loss': 1, " * 5000,
    ]
    for pattern in patterns:
        for attack in attacks:
            # a catastrophic pattern would need far longer than this on 60 kB lines
            pattern.search(attack, timeout=5.0)


def test_anchor_set_stays_within_the_fast_prefilter() -> None:
    # Aho-Corasick's SIMD prefilter handles at most 64 literals, none starting with a space:
    # beyond that the prefilter falls back and the whole pass gets several times slower.
    from oomlens.ingest.log import ANCHORS

    assert len(ANCHORS) <= 64
    assert not any(anchor[:1].isspace() for anchor in ANCHORS)


def test_see_memory_usage_logger_rendering_of_older_deepspeed(tmp_path: Path) -> None:
    # DeepSpeed <= 0.18.2 emits the three lines with logger.info (reference notes 1.2)
    stamp = "[2023-04-07 13:08:55,469] [INFO] [utils.py:{n}:see_memory_usage] "
    lines = [
        stamp.format(n=829) + "Before initializing optimizer states",
        REFERENCE_LINES[1],
        stamp.format(n=831) + "CPU Virtual Memory:  used = 12.3 GB, percent = 10.2%",
    ]
    (series,) = read_log(_write(tmp_path, lines)).memory
    (sample,) = series.samples
    assert sample.label == "Before initializing optimizer states"
    assert sample.allocated == round(11.76 * GiB) and sample.cpu_percent == 10.2
    assert sample.timestamp is not None and sample.timestamp.year == 2023


def test_memory_does_not_grow_with_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemalloc

    from oomlens.ingest.log import reader

    # both logs read the way large logs are (the small one would be read line by line)
    monkeypatch.setattr(reader, "LINE_BY_LINE_BYTES", 0)

    oom = next(
        x
        for x in LAB_LINES
        if x.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00")
    )

    def peak_for(steps: int) -> int:
        lines: list[str] = []
        for step in range(steps):
            lines += _see_memory_usage(
                f"Engine after step {step % 3}", 10 + step * 1e-4, 12, 20, 20
            )
            lines += [
                "{'loss': 1.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}",
                oom,
                "",
            ]
        path = _write(tmp_path, lines, f"run{steps}.log")
        tracemalloc.start()
        facts = read_log(path, limits=ReaderLimits(max_oom_events=20), chunk_bytes=4096)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert facts.memory[0].total_samples == steps and len(facts.oom_events) == 20
        return peak

    small, large = peak_for(250), peak_for(2_000)
    # eight times the log, about the same memory: bounded lists, thinned series, fixed blocks
    # (both logs span several batches of blocks: a batch is what is held at once)
    assert large < small * 1.5


def test_free_form_progress_lines_with_rank_in_the_text(tmp_path: Path) -> None:
    # the corpus scenario scripts print f"rank {rank} step {step} loss {loss:.4f}" and
    # f"step {step}/{steps} loss {loss:.4f} ({elapsed:.1f}s)"
    lines = [f"rank {r} step {s} loss {2.0 - s / 100:.4f}" for s in range(3) for r in range(2)]
    lines += ["step 7/100 loss 1.2345 (12.3s)"]
    facts = read_log(_write(tmp_path, lines))
    assert facts.steps.total == 7 and facts.steps.max_step == 7
    assert {s.source.rank: s.step for s in facts.steps.last_by_rank} == {0: 2, 1: 2, None: 7}
    assert facts.steps.last is not None and facts.steps.last.total == 100


def test_log_cut_between_traceback_and_exception_line(tmp_path: Path) -> None:
    body = [line for line in _stderr_of("B2_frag_full") if line]
    facts = read_log(_write(tmp_path, body[:-1]))  # everything but the exception line
    assert facts.oom_events == () and facts.ended_in_traceback
    assert any("traceback" in note for note in facts.notes)


def test_a_wall_of_oom_messages_is_read_once_not_once_per_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # found by the fuzzer: one real OOM line repeated 20,000 times took ~25 s, each message
    # scanning up to 64 lines back for a timestamp
    from oomlens.ingest.log import reader, reader_context

    message = next(line for line in _stderr_of("B2_frag_full") if "OutOfMemoryError" in line)
    calls = 0
    real = reader.leading_timestamp

    def counted(text: str, year: int | None) -> object:
        nonlocal calls
        calls += 1
        return real(text, year)

    # the lines read and the back-scans for a time (reader_context.time_before) together
    monkeypatch.setattr(reader, "leading_timestamp", counted)
    monkeypatch.setattr(reader_context, "leading_timestamp", counted)
    facts = read_log(_write(tmp_path, [message] * 3000))
    assert len(facts.oom_events) > 0
    assert calls < 4 * 3000  # was about 25 back-scanned lines per message: ~75,000


def test_a_wall_of_cublas_errors_is_not_reparsed_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # found by the fuzzer: a real cuBLAS line repeated 20,000 times (1.8 MB) took over 100 s:
    # each line of the growing exception message was parsed again as a wrapped allocator
    # message, which it cannot be (it has no allocator message start)
    from oomlens.ingest.log import torch_oom

    line = (ASSETS / "reference_messages.txt").read_text().splitlines()[6]
    assert "CUBLAS_STATUS_ALLOC_FAILED" in line
    calls = 0
    real = torch_oom.wrapped_complete

    def counted(text: str) -> bool:
        nonlocal calls
        calls += 1
        return real(text)

    monkeypatch.setattr(torch_oom, "wrapped_complete", counted)
    facts = read_log(_write(tmp_path, [line] * 3000))
    assert facts.oom_events and facts.oom_events[0].message.kind.value == "cublas"
    assert calls < 30  # was one per line: ~3,000


def test_a_wall_of_cut_allocator_messages_costs_little_per_line(tmp_path: Path) -> None:
    # the same wall where every line starts an allocator message (a real one, cut before its
    # last clause): each line is still parsed, in time linear in the message (~13 s before)
    import time

    real = (ASSETS / "reference_messages.txt").read_text().splitlines()[0]
    line = real[: real.index("already allocated")]
    started = time.process_time()
    facts = read_log(_write(tmp_path, [line] * 5000))
    assert facts.oom_events
    assert time.process_time() - started < 6.0


def test_a_repeated_oom_line_is_searched_for_more_messages_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # found by the fuzzer: one real OOM line padded to 5.5 KB and repeated 20,000 times
    # (111 MB) took 70 s, every copy searched again for a second message printed into it
    from oomlens.ingest.log import torch_oom

    message = next(line for line in _stderr_of("B2_frag_full") if "OutOfMemoryError" in line)
    calls = 0
    real = torch_oom.allocator_starts

    def counted(text: str, limit: int | None = None) -> list[int]:
        nonlocal calls
        calls += 1
        return real(text, limit)

    monkeypatch.setattr(torch_oom, "allocator_starts", counted)
    facts = read_log(_write(tmp_path, [message] * 3000))
    assert len(facts.oom_events) > 0
    assert calls < 30  # was one per copy: ~3,000


def test_the_reader_imports_neither_process_pools_nor_the_config_parser_until_needed(
    tmp_path: Path,
) -> None:
    # every process that reads a log pays for what the reader imports up front (the SLURM
    # epilog and triage's workers too): the pure path's process pools and the config dump's
    # parser come in only when a read needs them
    import subprocess
    import sys

    log = tmp_path / "run.log"
    log.write_text("[rank0]: step 1/10 loss 2.5\n")
    probe = (
        "import sys; from oomlens.ingest.log import read_log; "
        "late = ('multiprocessing', 'oomlens.ingest.ds_config'); "
        "before = sorted(m for m in late if m in sys.modules); "
        "read_log(sys.argv[1]); "
        "print(before, sorted(m for m in late if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", probe, str(log)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    )
    assert done.stdout.split("\n")[0] == "[] []"
