"""Reasoning from partial evidence, as an engineer reads a paste: the message's arithmetic, the
size of the request, the frames, the signals, the platform.  Each path on real text: pastes of
the field corpus (development split), the crash corpus, or inputs built by code from them (said
where).  The best-supported cause comes first with a confidence that says how much the paste
holds; ``insufficient_evidence`` comes first only when nothing points anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.diagnosis import Diagnosis, EvidenceKind
from oomlens.report import Report
from oomlens.rules.common.advice import CAPTURE_SNAPSHOT
from oomlens.rules.uncertainty import SURE_ENOUGH
from oomlens.session import analyze

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "fixtures" / "field_logs"
CRASH = ROOT / "fixtures" / "crash_logs"


def _paste(case: str) -> Report:
    return analyze([FIELD / case / "paste.txt"])


def _ids(report: Report) -> list[str]:
    return [d.id for d in report.diagnoses]


def _get(report: Report, rule: str) -> Diagnosis:
    return next(d for d in report.diagnoses if d.id == rule)


# -- the message's arithmetic


def test_memory_the_allocator_does_not_hold_is_another_process() -> None:
    # 10.76 GiB card, PyTorch reserved 1010 MiB, 8.81 MiB free: ~9.8 GiB held elsewhere
    report = _paste("residualmaskingnetwork-15")
    top = report.top
    assert top is not None and top.id == "other_process"
    assert 0.5 <= top.confidence < 0.6  # one message, no listing: medium, not certain
    assert any("held outside this process' allocator" in e.text for e in top.evidence)
    assert any("nvidia-smi" in m for m in top.missing)


def test_a_context_and_a_display_are_not_another_process() -> None:
    # 3.95 GiB laptop card: 1.17 GiB outside the allocator is a context plus the display; the
    # process' own tensors filled the rest, so the batch is named (low)
    report = _paste("pytorch-16417")
    assert report.top is not None and report.top.id == "activation_memory"
    assert "other_process" not in _ids(report)


def test_the_container_view_of_the_job_is_not_another_process(tmp_path: Path) -> None:
    # GIVEN the real fragmentation OOM (2.2+, "this process has 7.16 GiB") as a container
    # prints it: the same numbers under a host pid, no "this process has" clause
    lines = (CRASH / "fragmentation" / "train.log").read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if "this process has 7.16 GiB" in line)
    lines[index] = lines[index].replace(
        "Including non-PyTorch memory, this process has 7.16 GiB memory in use.",
        "Process 2771 has 7.16 GiB memory in use.",
    )
    log = tmp_path / "train.log"
    log.write_text("".join(lines))
    # THEN the diagnosis is the real case's, and the listed process is not another one
    report = analyze([log])
    assert report.top is not None and report.top.id == "fragmentation"
    assert "other_process" not in _ids(report)


def test_with_its_own_size_accounted_the_other_listed_processes_are_others() -> None:
    # TRL CI: four processes listed, one is the job (8.07 GiB = 7.85 + 0.09 GiB + context)
    report = _paste("trl-5197")
    other = _get(report, "other_process")
    assert any("is this job itself" in e.note for e in other.evidence)
    assert other.figures["other_processes_share"].value == pytest.approx(0.29, abs=0.01)


def test_a_cap_with_room_on_the_device_is_not_the_other_process() -> None:
    report = analyze([CRASH / "compiled_activation" / "train.log"])
    assert report.top is not None and report.top.id == "activation_memory"
    assert "other_process" not in _ids(report)
    assert any("took nothing" in e.text for e in report.top.evidence)


# -- the size of the request


def test_a_request_larger_than_the_card_is_a_shape_bug() -> None:
    # Megatron-DeepSpeed: 37631.79 GiB for an attention mask on a 79.21 GiB card
    report = _paste("megatrondeepspeed-bigscience-384")
    assert report.verdict.value == "gpu_oom"
    top = report.top
    assert top is not None and top.id == "oversized_allocation" and top.confidence >= 0.8
    assert all(d.confidence <= 0.3 for d in report.diagnoses[1:])


def test_nearly_the_whole_card_in_one_request_is_suspect_but_not_certain() -> None:
    # 23.11 GiB asked on a 23.70 GiB card with 1.54 GiB allocated
    report = _paste("d3dp-9")
    top = report.top
    assert top is not None and top.id == "oversized_allocation"
    assert top.confidence < SURE_ENOUGH


# -- thin evidence: the best-supported cause first, low, with the capture recipe


def test_a_lone_full_message_names_the_batch_low_and_says_what_to_capture() -> None:
    report = _paste("loravit-6")
    assert _ids(report)[:2] == ["activation_memory", "model_states_too_large"]
    top = report.top
    assert top is not None and top.confidence < SURE_ENOUGH
    assert CAPTURE_SNAPSHOT in top.missing
    assert report.diagnoses[-1].id == "insufficient_evidence"
    assert report.diagnoses[-1].confidence <= min(d.confidence for d in report.diagnoses[:-1])


def test_nothing_pointing_anywhere_leads_with_insufficient_evidence() -> None:
    # "RuntimeError: CUDA error: out of memory" and nothing else
    report = _paste("opennmt-py-1089")
    assert report.verdict.value == "gpu_oom"
    assert _ids(report) == ["insufficient_evidence"]
    assert report.missing


# -- frames and phase


def test_evaluation_frames_name_evaluation() -> None:
    report = _paste("imagecaptioning-57")  # train.py ... in validate
    assert report.top is not None and report.top.id == "eval_or_generation"


def _window_from_traceback(log: Path, tmp_path: Path) -> Path:
    """The log from its traceback on: what a user pastes (no step lines, no startup)."""
    lines = log.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    window = tmp_path / f"window_{log.parent.name}.log"
    window.write_text("".join(lines[start:]))
    return window


def test_optimizer_frames_name_the_states_as_strongly_as_they_show_them(tmp_path: Path) -> None:
    # GIVEN windows of two real logs that fail in the optimizer step (built by code): one
    # creating Adam's states (model_states_too_large), one at step 33 of a leak (memory_leak)
    rank_log = next((CRASH / "model_states_too_large" / "rank_logs").glob("*.log"))
    creating = analyze([_window_from_traceback(rank_log, tmp_path)])
    leak_log = CRASH / "memory_leak" / "train.log"
    stepping = analyze([_window_from_traceback(leak_log, tmp_path)])
    # THEN a frame that creates the states names them as firmly as the whole log does...
    assert creating.top is not None and creating.top.id == "model_states_too_large"
    assert creating.top.confidence >= 0.6
    # ...while a plain optimizer step, whose step count the window hides, names them low;
    # the whole log, with its memory series, finds the leak
    states = _get(stepping, "model_states_too_large")
    assert states.confidence < SURE_ENOUGH
    whole = analyze([leak_log])
    assert whole.top is not None and whole.top.id == "memory_leak"
    assert "model_states_too_large" not in _ids(whole)


def test_the_line_of_the_error_says_the_state_dict_was_being_saved() -> None:
    # FSDP's "Failed to clone() tensor ... state_dict ... Error: CUDA out of memory"
    report = _paste("stanfordalpaca-65")
    assert report.top is not None and report.top.id == "checkpoint_save_gather"


def test_a_backward_pass_in_a_paste_is_not_confident() -> None:
    # IPython traceback in backward, card full: activations, but a paste cannot say whether it
    # ever fit (the thread found a leak): medium, not confident
    report = _paste("pytorch-64586")
    top = report.top
    assert top is not None and top.id == "activation_memory" and top.confidence < 0.6


# -- exit codes, signals, platform


def test_a_silent_death_under_memory_pressure_is_the_oom_killer() -> None:
    report = _paste("deepspeed-4571")
    assert report.verdict.value == "host_oom"
    top = report.top
    assert top is not None and top.id == "host_oom_killed" and top.confidence >= 0.6
    assert any("84.6%" in e.text for e in top.evidence)


def test_memory_summary_oom_count_and_bloated_cache_are_fragmentation() -> None:
    report = _paste("pytorch-35901")
    assert report.verdict.value == "gpu_oom"
    assert report.top is not None and report.top.id == "fragmentation"


def test_a_driver_oom_under_wsl_is_pinned_memory(tmp_path: Path) -> None:
    # GIVEN the real lone WSL paste ("RuntimeError: CUDA error: out of memory") with the frame
    # a WSL user's traceback shows (a script under /mnt/c), built by code
    error = (FIELD / "wsl-8447" / "paste.txt").read_text().strip()
    log = tmp_path / "out.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/mnt/c/Users/me/project/train.py", line 41, in <module>\n'
        "    images = images.to(device)\n"
        f"{error}\n"
    )
    report = analyze([log])
    assert report.verdict.value == "host_oom"
    top = report.top
    assert top is not None and top.id == "pinned_memory_exhaustion" and top.confidence == 0.5


def test_a_framework_naming_its_memory_setting_is_a_config_hazard() -> None:
    # vLLM behind docker compose: "No available memory for the cache blocks. Try increasing
    # `gpu_memory_utilization` when initializing the engine."
    report = _paste("vllm-10439")
    assert report.verdict.value == "config_error"
    top = report.top
    assert top is not None and top.id == "config_hazard"
    assert "gpu_memory_utilization" in top.title
    assert any(e.kind is EvidenceKind.LOG for e in top.evidence)


def test_shared_memory_refused_for_permission_is_not_a_full_dev_shm() -> None:
    # NCCL: "Call to shm_open failed : Permission denied" then "Error while creating shared
    # memory segment": the segment was refused, /dev/shm was not full
    report = _paste("pytorch-37004")
    assert report.verdict.value == "other_failure"
    assert report.top is not None and report.top.id == "not_oom"
    assert _get(report, "shm_exhausted").confidence <= 0.3


def test_an_error_cut_before_its_message_names_nothing(tmp_path: Path) -> None:
    # GIVEN the device-side-assert run's rank-1 traceback, cut before its exception line
    # (built by code from the real log)
    lines = (CRASH / "device_side_assert" / "train.log").read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    end = next(i for i in range(start + 1, len(lines)) if "RuntimeError:" in lines[i])
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[start:end]))
    # THEN nothing claims it was not memory, and the verdict says the text is cut
    report = analyze([cut])
    assert "not_oom" not in _ids(report)
    assert report.verdict.value == "unknown"


def test_a_lone_unplaced_error_is_not_a_confident_not_oom() -> None:
    # "RuntimeError: nvjpegDecode failed: 5" (nvJPEG's allocator failure, per the thread)
    report = _paste("torchvision-4378")
    assert report.top is not None and report.top.confidence < 0.6
    full = analyze([CRASH / "device_side_assert"])
    assert full.top is not None and full.top.id == "not_oom" and full.top.confidence >= 0.8


def test_a_request_above_a_capacity_the_message_itself_contradicts_is_only_a_lead(
    tmp_path: Path,
) -> None:
    """megatrondeepspeed-bigscience-384's real pre-2.2 message with its "already allocated"
    and "reserved" figures raised above the card's capacity (as managed memory or a capacity
    read from another device prints them): the card no longer bounds the request, so one
    request above it is not a confident shape bug."""
    line = next(
        ln
        for ln in (FIELD / "megatrondeepspeed-bigscience-384" / "paste.txt")
        .read_text()
        .splitlines()
        if "total capacity" in ln
    )
    varied = (
        line.replace("37631.79 GiB", "90.00 GiB")
        .replace("50.52 GiB already allocated", "150.52 GiB already allocated")
        .replace("52.32 GiB reserved", "152.32 GiB reserved")
    )
    assert varied != line
    paste = tmp_path / "paste.txt"
    paste.write_text(varied + "\n")
    report = analyze([paste])
    oversized = [d for d in report.diagnoses if d.id == "oversized_allocation"]
    assert oversized and oversized[0].confidence < 0.5
    assert any(not e.supports for e in oversized[0].evidence)
