"""Run discovery in trees built from the real corpus' case folders and launcher layouts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from oomlens.errors import UsageError
from oomlens.triage import adapter, walk
from oomlens.triage.walk import FileEntry, RunSpec, find_runs
from tests._corpus import case_dir, case_names


def _is_log(entry: FileEntry) -> bool:
    return adapter.is_training_log(entry.path)


def _runs(*paths: Path) -> dict[str, RunSpec]:
    result = find_runs([str(p) for p in paths], is_log=_is_log)
    return {run.name: run for run in result.runs}


def _copy_case(name: str, dest: Path) -> Path:
    shutil.copytree(case_dir(name), dest)
    return dest


def test_every_corpus_case_is_one_run_holding_all_its_files() -> None:
    # GIVEN the corpus as it is checked in (cases, plus the generators in _scenarios)
    # WHEN it is walked
    runs = _runs(case_dir("fragmentation").parent)
    # THEN each case is one run, nothing else is, and each run hands its folder to the analysis
    assert sorted(runs) == case_names()
    for name, run in runs.items():
        assert run.inputs == (str(case_dir(name)),)
        relatives = {rel for rel, _ in run.files}
        on_disk = {
            str(p.relative_to(case_dir(name))) for p in case_dir(name).rglob("*") if p.is_file()
        }
        assert relatives == on_disk


def test_per_rank_layouts_belong_to_the_run_around_them() -> None:
    runs = _runs(case_dir("fragmentation").parent)
    torchrun = {rel for rel, _ in runs["generation_oom"].files if rel.startswith("torchrun_logs")}
    deepspeed = {
        rel for rel, _ in runs["model_states_too_large"].files if rel.startswith("rank_logs")
    }
    assert len(torchrun) == 4  # stdout.log and stderr.log of local ranks 0 and 1
    assert len(deepspeed) == 2
    assert not any("torchrun_logs" in name or "rank_logs" in name for name in runs)


def test_a_torchrun_log_dir_alone_is_the_run(tmp_path: Path) -> None:
    # GIVEN only what torchrun --log-dir wrote, in a job folder of an archive
    shutil.copytree(case_dir("generation_oom") / "torchrun_logs", tmp_path / "job-7")
    runs = _runs(tmp_path)
    assert list(runs) == ["job-7"]
    assert runs["job-7"].inputs == (str(tmp_path / "job-7"),)
    assert len(runs["job-7"].files) == 4


def test_deepspeed_rank_logs_alone_are_the_run(tmp_path: Path) -> None:
    shutil.copytree(case_dir("model_states_too_large") / "rank_logs", tmp_path / "job-8")
    runs = _runs(tmp_path)
    assert list(runs) == ["job-8"]
    assert len(runs["job-8"].files) == 2


def test_deepspeed_rank_logs_next_to_a_snapshot_belong_to_that_folder(tmp_path: Path) -> None:
    case = case_dir("model_states_too_large")
    run = tmp_path / "job-9"
    shutil.copytree(case / "rank_logs", run / "logs")
    shutil.copy(case / "snapshot_rank0.pickle", run)
    runs = _runs(tmp_path)
    assert list(runs) == ["job-9"]
    assert {rel for rel, _ in runs["job-9"].files} >= {"snapshot_rank0.pickle"}


def test_nested_runs_are_separate_and_the_outer_run_does_not_swallow_the_inner(
    tmp_path: Path,
) -> None:
    # GIVEN a run folder with a rerun kept in a subfolder, and a checkpoint folder
    outer = _copy_case("prefetch_overshoot", tmp_path / "exp")
    inner = _copy_case("prefetch_fits", outer / "rerun")
    (outer / "ckpt").mkdir()
    (outer / "ckpt" / "model.pt").write_bytes(b"\0" * 4096)
    (outer / "ckpt" / "optimizer.bin").write_bytes(b"\0" * 4096)
    runs = _runs(tmp_path)
    assert sorted(runs) == ["exp", "exp/rerun"]
    # THEN the outer run is given its own files and the subfolders without runs, one by one
    outer_inputs = set(runs["exp"].inputs)
    assert str(inner) not in outer_inputs
    assert str(outer / "ckpt") in outer_inputs
    assert str(outer / "train.log") in outer_inputs
    assert not any(p.startswith(str(inner)) for p in outer_inputs)
    assert not any(rel.startswith("rerun") for rel, _ in runs["exp"].files)
    # a checkpoint is no input and is never hashed
    assert "ckpt/model.pt" not in {rel for rel, _ in runs["exp"].files}
    assert runs["exp/rerun"].inputs == (str(inner),)


def test_slurm_output_files_of_several_jobs_are_one_run_each(tmp_path: Path) -> None:
    # GIVEN a folder where sbatch wrote the outputs of three jobs (%j and %A_%a names)
    logs = tmp_path / "slurm"
    logs.mkdir()
    shutil.copy(case_dir("fragmentation") / "train.log", logs / "slurm-1001.out")
    shutil.copy(case_dir("nccl_timeout") / "train.log", logs / "train.1002.out")
    shutil.copy(case_dir("nccl_timeout") / "train.log", logs / "train.1002.err")
    shutil.copy(case_dir("memory_leak_fixed") / "train.log", logs / "slurm-1003_4.out")
    runs = _runs(tmp_path)
    assert sorted(runs) == ["slurm/slurm-1001", "slurm/slurm-1003_4", "slurm/train.1002"]
    assert runs["slurm/train.1002"].inputs == (
        str(logs / "train.1002.err"),
        str(logs / "train.1002.out"),
    )
    assert runs["slurm/slurm-1001"].path == str(logs / "slurm-1001.out")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("memory_leak", "nccl_timeout"),  # DeepSpeed's runner, then torchrun
        ("device_side_assert", "generation_oom"),  # torchrun twice
        ("accumulation_mismatch", "accumulation_derived_micro"),  # DeepSpeed twice
    ],
)
def test_logs_of_launches_one_after_the_other_are_one_run_each(
    tmp_path: Path, first: str, second: str
) -> None:
    # GIVEN a job started twice into one folder: each log opens with its launcher's header,
    # the second starting after the first ended; a snapshot beside them could be either's
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(case_dir(first) / "train.log", folder / "attempt1.log")
    shutil.copy(case_dir(second) / "train.log", folder / "attempt2.log")
    shutil.copy(case_dir("memory_leak") / "snapshot_rank0.pickle", folder)
    runs = _runs(folder)
    # THEN each log is a run of its own, and the snapshot is handed to neither
    assert sorted(runs) == ["job/attempt1", "job/attempt2"]
    assert runs["job/attempt1"].inputs == (str(folder / "attempt1.log"),)
    assert runs["job/attempt2"].inputs == (str(folder / "attempt2.log"),)


def test_logs_of_launchers_that_ran_at_the_same_time_stay_one_run(tmp_path: Path) -> None:
    # GIVEN two logs with a DeepSpeed launcher's header each, whose times overlap (what the
    # nodes of one multi-node job write), and one log with a header beside a log without
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(case_dir("offload_pinned_uncapped") / "train.log", folder / "node0.log")
    shutil.copy(case_dir("offload_unpinned_uncapped") / "train.log", folder / "node1.log")
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(case_dir("memory_leak") / "train.log", other / "train.log")
    shutil.copy(case_dir("fragmentation") / "train.log", other / "rank0.log")
    runs = _runs(folder, other)
    # THEN each folder is one run
    assert sorted(runs) == ["job", "other"]


def test_folders_without_a_training_log_are_not_runs(tmp_path: Path) -> None:
    # GIVEN a kernel log, a config, a README and a hidden run copy: none is a run
    (tmp_path / "kernel").mkdir()
    shutil.copy(case_dir("checkpoint_save_host_oom") / "kernel.log", tmp_path / "kernel")
    (tmp_path / "configs").mkdir()
    shutil.copy(case_dir("memory_leak") / "ds_config.json", tmp_path / "configs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.txt").write_text("How to run the training job.\n")
    _copy_case("fragmentation", tmp_path / ".snapshot-copy")
    assert _runs(tmp_path) == {}


def test_a_log_file_given_directly_is_a_run(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    shutil.copy(case_dir("fragmentation") / "train.log", log)
    runs = _runs(log)
    assert list(runs) == ["job.log"]
    assert runs["job.log"].inputs == (str(log),)


def test_the_same_run_given_twice_is_one_run(tmp_path: Path) -> None:
    _copy_case("fragmentation", tmp_path / "a" / "frag")
    result = find_runs([str(tmp_path), str(tmp_path / "a")], is_log=_is_log)
    assert [run.name for run in result.runs] == ["a/frag"]


def test_symlinked_folders_are_not_followed(tmp_path: Path) -> None:
    _copy_case("fragmentation", tmp_path / "real" / "frag")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "loop").symlink_to(tmp_path)
    assert sorted(_runs(tmp_path)) == ["real/frag"]


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        find_runs([str(tmp_path / "nope")], is_log=_is_log)


def test_an_unreadable_subfolder_is_reported_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a folder the walk may not list (chmod 0 does not stop root, so scandir says so)
    _copy_case("fragmentation", tmp_path / "ok")
    locked = tmp_path / "locked"
    _copy_case("nccl_timeout", locked)
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(walk.os, "scandir", scandir)
    result = find_runs([str(tmp_path)], is_log=_is_log)
    assert [run.name for run in result.runs] == ["ok"]
    assert result.skipped == ((str(locked), "cannot be listed (Permission denied)"),)


def test_an_unreadable_top_directory_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def scandir(path: str) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(walk.os, "scandir", scandir)
    with pytest.raises(UsageError, match="cannot be listed .Permission denied.; check its"):
        find_runs([str(tmp_path)], is_log=_is_log)


def test_a_capture_directory_alone_is_a_run_and_one_beside_a_log_belongs_to_it(
    tmp_path: Path, real_capture: Path
) -> None:
    # GIVEN a capture directory on its own, and a case folder holding a log and its capture
    shutil.copytree(real_capture, tmp_path / "alone" / "oomlens-capture" / "slurm-41")
    case = _copy_case("fragmentation", tmp_path / "with_log")
    shutil.copytree(real_capture, case / "oomlens-capture" / "slurm-41")
    # WHEN walked
    runs = _runs(tmp_path)
    # THEN two runs: the lone capture, and the case with its capture inside
    assert sorted(runs) == ["alone/oomlens-capture/slurm-41", "with_log"]
    files = {name for name, _ in runs["with_log"].files}
    assert "oomlens-capture/slurm-41/rank0.events.jsonl" in files


def test_a_linked_run_directory_is_reported_as_a_link_not_followed(tmp_path: Path) -> None:
    # GIVEN a run reached through a symbolic link, and a run holding a link of its own
    target = _copy_case("fragmentation", tmp_path / "elsewhere" / "run")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "linked").symlink_to(target)
    inside = _copy_case("nccl_timeout", tmp_path / "tree" / "real")
    (inside / "latest").symlink_to(target)
    # WHEN walked
    result = find_runs([str(tmp_path / "tree")], is_log=_is_log)
    # THEN the link is not followed, and is named as the reason, with the target to pass
    assert [run.name for run in result.runs] == ["real"]
    assert len(result.skipped) == 1
    path, why = result.skipped[0]
    assert path == str(tmp_path / "tree" / "linked")
    assert why.startswith("a symbolic link (to ") and f"pass {target} itself" in why


def test_a_directory_named_among_others_that_holds_no_run_is_said(tmp_path: Path) -> None:
    # A paste.txt without any training-log marker: triage gave no row and no word for it
    # among 41 directories named on its command line.
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    (quiet / "paste.txt").write_text("loading weights\nstep 1\n")
    shutil.copytree(case_dir("fragmentation"), tmp_path / "run")
    result = find_runs([quiet, tmp_path / "run"], is_log=_is_log)
    assert [run.name for run in result.runs] == ["run"]
    assert [(path, why.split(" (")[0]) for path, why in result.skipped] == [
        (str(quiet), "no training log there")
    ]
