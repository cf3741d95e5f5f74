"""`oomlens analyze` as a user runs it: exit codes, formats, output files, bad inputs."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests._corpus import case_dir
from tests.cli._terminal import on_terminal

CASE = case_dir("other_process")


def run(*args: str | os.PathLike[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomlens", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_analyze_a_run_directory_prints_the_verdict_cause_and_fix() -> None:
    result = run("analyze", CASE)
    assert result.returncode == 0, result.stderr
    assert "GPU OOM" in result.stdout
    assert "[other_process]" in result.stdout
    assert "Process 1652 has 125.79 GiB" in result.stdout
    assert "fix:" in result.stdout
    assert "\x1b[" not in result.stdout  # no colour when not a terminal
    assert result.stderr == ""


def test_output_file_format_follows_the_extension(tmp_path: Path) -> None:
    for name, check in (
        ("r.json", lambda t: json.loads(t)["verdict"] == "gpu_oom"),
        ("r.md", lambda t: t.startswith("# oomlens: GPU OOM")),
        ("r.txt", lambda t: t.startswith("oomlens: GPU OOM")),
    ):
        target = tmp_path / name
        result = run("analyze", CASE, "-o", target)
        assert result.returncode == 0, result.stderr
        assert check(target.read_text()), name
        assert f"report written to {target}" in result.stderr


def test_unknown_output_extension_is_a_usage_error(tmp_path: Path) -> None:
    result = run("analyze", CASE, "-o", tmp_path / "report.xyz")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "report.xyz" in result.stderr
    assert "Traceback" not in result.stderr


def test_nothing_readable_exits_3_with_one_line_naming_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "run.log"
    empty.write_bytes(b"")
    result = run("analyze", empty)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1
    assert str(empty) in result.stderr and "empty" in result.stderr
    missing = run("analyze", tmp_path / "nope.log")
    assert missing.returncode == 3 and "does not exist" in missing.stderr


def test_an_empty_directory_is_reported_not_crashed_on(tmp_path: Path) -> None:
    result = run("analyze", tmp_path)
    assert result.returncode == 3
    assert "holds no training log" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_inputs_are_listed_and_the_good_ones_still_analyzed(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 64)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    result = run("analyze", CASE / "train.log", garbage, empty, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "gpu_oom"
    problems = {Path(i["path"]).name: i["problem"] for i in report["inputs"] if i["problem"]}
    assert set(problems) == {"garbage.bin", "empty.log"}
    assert all(p.startswith(str(tmp_path)) for p in problems.values())


def test_compressed_dirty_and_truncated_logs_are_read(tmp_path: Path) -> None:
    raw = (CASE / "train.log").read_bytes()
    cut = raw[: raw.index(b"reserved by PyTorch but unallocated") + 20]  # cut mid-message
    dirty = b"\xff\xfe\x00garbage\x1b[31m\n" + cut
    for name, data in (
        ("a.log.gz", gzip.compress(dirty)),
        ("b.log.bz2", bz2.compress(dirty)),
        ("c.log", dirty),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        result = run("analyze", path, "--format", "json")
        assert result.returncode == 0, (name, result.stderr)
        report = json.loads(result.stdout)
        assert report["verdict"] == "gpu_oom", name
        assert report["oom_events"][0]["tried_to_allocate"] == 64 * 1024**2


def test_a_megabyte_line_does_not_break_the_analysis(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"x" * (8 * 1024 * 1024) + b"\n" + (CASE / "train.log").read_bytes())
    result = run("analyze", path, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["diagnoses"][0]["id"] == "other_process"


def test_bad_option_values_are_usage_errors() -> None:
    for args in (
        ["--params", "lots"],
        ["--gpu-memory", "big"],
        ["--gpus", "0"],
        ["--format", "pdf"],
    ):
        result = run("analyze", CASE, *args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr


def test_thresholds_file_is_data_and_is_validated(tmp_path: Path) -> None:
    settings = tmp_path / "oomlens.toml"
    settings.write_text("[thresholds]\nother_process_min_fraction = 0.99\n")
    result = run("analyze", CASE, "--thresholds", settings, "--format", "json")
    assert result.returncode == 0, result.stderr
    ids = [d["id"] for d in json.loads(result.stdout)["diagnoses"]]
    assert "other_process" not in ids  # 125.79 of 139.80 GiB is below a 99% threshold
    settings.write_text("[thresholds]\nos.system = 1\n")
    bad = run("analyze", CASE, "--thresholds", settings)
    assert bad.returncode == 2 and "unknown threshold" in bad.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "secret.log"
    path.write_text("Traceback (most recent call last):\n")
    path.chmod(0)
    result = run("analyze", path)
    assert result.returncode == 3 and "secret.log" in result.stderr


def test_python_dash_m_and_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and "oomlens" in result.stdout


def test_a_deeply_nested_config_beside_a_good_log_costs_only_itself(tmp_path: Path) -> None:
    # the fuzzer's 1 KB file: 1,000 levels of JSON dropped as the run's ds_config
    (tmp_path / "train.log").write_bytes((CASE / "train.log").read_bytes())
    (tmp_path / "ds_config.json").write_text('{"x":' + "[" * 1000 + "]" * 1000 + "}")
    result = run("analyze", tmp_path, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "gpu_oom"
    assert [Path(i["path"]).name for i in report["inputs"]] == ["train.log"]
    named = run("analyze", CASE / "train.log", tmp_path / "ds_config.json", "--format", "json")
    assert named.returncode == 0, named.stderr
    problems = [i["problem"] for i in json.loads(named.stdout)["inputs"] if i["problem"]]
    assert len(problems) == 1 and "nested deeper than" in problems[0]
    alone = run("analyze", tmp_path / "ds_config.json")
    assert alone.returncode == 3 and alone.stderr.count("\n") == 1
    assert "nested deeper than" in alone.stderr


def test_a_reader_that_fails_costs_only_its_own_input(monkeypatch: pytest.MonkeyPatch) -> None:
    from oomlens.ingest.kinds import kind
    from oomlens.session import analyze

    def broken(self: object, found: object, options: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    snapshot = kind("snapshot_pickle")
    monkeypatch.setattr(type(snapshot), "read", broken)
    report = analyze([case_dir("prefetch_overshoot")])
    assert report.verdict.value == "gpu_oom"
    problems = [i for i in report.facts.inputs if i.problem]
    assert [Path(i.path).suffix for i in problems] == [".pickle", ".pickle"]
    assert all("internal error" in (i.problem or "") for i in problems)
    assert all("RecursionError" in (i.problem or "") for i in problems)


def test_a_hostile_file_name_reaches_no_terminal(tmp_path: Path) -> None:
    # found by the fuzzer: the evidence's "(file:line)" was printed as it came
    from oomlens.untrusted import CONTROL_CHARACTERS

    hostile = tmp_path / "\x1b]0;title\x07\u202e.log"
    hostile.write_bytes((CASE / "train.log").read_bytes())
    result = run("analyze", hostile)
    assert result.returncode == 0, result.stderr
    assert "title" in result.stdout and not CONTROL_CHARACTERS.search(result.stdout)


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_redact_says_so_in_every_format_that_carries_the_notice(capsys, fmt: str) -> None:
    # issue 12: --redact --format markdown printed a redacted report without its notice
    from oomlens.cli import main

    with pytest.raises(SystemExit) as info:
        main(["analyze", str(case_dir("prefetch_overshoot")), "--redact", "--format", fmt])
    out = capsys.readouterr().out
    assert info.value.code in (0, None)
    notice = {
        "markdown": "redacted (user names, home paths, host names and IP addresses replaced)",
        "html": "Redacted: user names, home paths, host names and IP addresses were replaced",
    }[fmt]
    assert notice in out


def test_an_error_quoting_a_hostile_file_prints_no_control_character(tmp_path: Path) -> None:
    # the unpickler's own message quotes the file's bytes: ESC, BEL and a line feed among them
    # would reach the terminal (fuzz campaign M, snapshot-450)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(b"\x80\x02F(h\x1b[31m\x07\x05\nforged line\n.")
    result = run("analyze", path)
    assert result.returncode == 3
    assert "corrupt pickle" in result.stderr
    assert not any(c in result.stderr for c in "\x1b\x07\x05")
    assert result.stderr.count("\n") == 1  # one line, whatever the file says


def test_error_messages_are_one_line_without_control_characters() -> None:
    from oomlens.errors import InputError

    error = InputError("log\x1b]0;title\x07.txt", "bad\nline\x9b31m", "do\tthis")
    assert error.message == "log]0;title.txt: bad line31m; do this"


def test_a_full_standard_output_is_one_usage_error_not_a_bug() -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "oomlens", "analyze", CASE, "--format", "json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1
    assert "standard output: cannot write the report (No space left on device)" in result.stderr
    assert "internal error" not in result.stderr


def test_a_read_only_file_system_is_one_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from oomlens.cli import main

    def read_only(path: object, *args: object, **kwargs: object) -> None:
        # a read-only mount refuses the report's placing and then even the temporary's removal
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(os, "unlink", read_only)
    with pytest.raises(SystemExit) as stopped:
        main(["analyze", str(CASE), "-o", str(tmp_path / "r.json")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "r.json: cannot write the report (Read-only file system)" in err


def test_a_directory_of_several_runs_is_refused_not_mixed_into_one_answer(tmp_path: Path) -> None:
    import shutil

    for name, case in (("run1", "fragmentation"), ("run2", "other_process")):
        shutil.copytree(case_dir(case), tmp_path / "archive" / name)
    result = run("analyze", tmp_path / "archive", "--format", "json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "holds 2 runs (run1, run2)" in result.stderr
    assert f"oomlens analyze {tmp_path / 'archive' / 'run1'}" in result.stderr
    # one of them, as the line says, is that run's answer alone
    alone = run("analyze", tmp_path / "archive" / "run2", "--format", "json")
    assert json.loads(alone.stdout)["diagnoses"][0]["id"] == "other_process"
    # --one-run reads the directory as one job's parts, as asked
    together = run("analyze", tmp_path / "archive", "--one-run", "--format", "json")
    assert together.returncode == 0, together.stderr
    assert len({i["path"] for i in json.loads(together.stdout)["inputs"]}) >= 4


def test_a_folder_of_two_launches_logs_is_refused_naming_one_log(tmp_path: Path) -> None:
    import shutil

    # GIVEN a job started twice into one folder: a torchrun launch, then a DeepSpeed one later
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(case_dir("activation_memory") / "train.log", folder / "first.log")
    shutil.copy(case_dir("prefetch_overshoot") / "train.log", folder / "second.log")
    result = run("analyze", folder, "--format", "json")
    # THEN it is refused as two runs, with a command that analyzes one of them
    assert result.returncode == 2 and result.stdout == ""
    assert "holds 2 runs (job/first, job/second)" in result.stderr
    assert f"oomlens analyze {folder / 'first.log'}" in result.stderr
    alone = run("analyze", folder / "first.log", "--format", "json")
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["diagnoses"][0]["id"] == "activation_memory"


def test_a_run_directory_with_its_capture_inside_is_one_run() -> None:
    result = run("analyze", case_dir("fragmentation_captured"), "--format", "json")
    assert result.returncode == 0, result.stderr


def _drain(fifo: Path) -> threading.Thread:
    """A reader for ``fifo`` (opening it for writing blocks until one is there)."""

    def read() -> None:
        with open(fifo, "rb") as stream:
            while stream.read(65536):
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_an_output_that_is_a_device_or_fifo_is_written_through_not_replaced(
    tmp_path: Path,
) -> None:
    # -o /dev/null replaced the device node with a regular file (a temporary file renamed
    # over it): as root, a node's /dev/null.  A FIFO stands for the device here.
    for option in ("-o", "--html"):
        fifo = tmp_path / f"out{option}.json"
        os.mkfifo(fifo)
        reader = _drain(fifo)
        result = run("analyze", CASE, "--format", "json", option, fifo)
        reader.join(timeout=10)
        assert result.returncode == 0, result.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode), option


WRAP_CASE = case_dir("prefetch_overshoot")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _widest(text: str) -> int:
    return max(len(ANSI.sub("", line)) for line in text.splitlines())


@pytest.mark.parametrize(("columns", "env"), [(100, {}), (200, {"COLUMNS": "80"})])
def test_on_a_terminal_the_summary_wraps_to_its_width_with_a_hanging_indent(
    columns: int, env: dict[str, str]
) -> None:
    width = int(env.get("COLUMNS", columns))
    # named as from the checkout's root: an absolute path may be wider than 80 columns alone
    root = WRAP_CASE.parents[2]
    code, shown = on_terminal(["analyze", str(WRAP_CASE.relative_to(root))], columns, env, root)
    assert code == 0, shown
    assert "\x1b[" in shown  # coloured, as on a terminal: the codes take no columns
    lines = [ANSI.sub("", line) for line in shown.splitlines()]
    over = [line.strip() for line in lines if len(line) > width]
    # only a path longer than a line at its indent may pass the width, whole and alone on its
    # line (a frame the evidence cites)
    assert all(line and " " not in line for line in over), over
    patch = next(i for i, line in enumerate(lines) if "ds_config patch:" in line)
    assert re.match(r' {26}\{?"stage3_', lines[patch + 1])  # under the patch, not column 0
    cited = [line for line in lines if line.startswith("      (") and "train.log:263" in line]
    assert cited  # an evidence item's source, on its own line under the item's text


def test_piped_output_is_not_wrapped_whatever_columns_says() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    piped = subprocess.run(
        [sys.executable, "-m", "oomlens", "analyze", str(WRAP_CASE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr
    assert _widest(piped.stdout) > 400  # the whole OOM message on its item's line, for grep
    assert piped.stdout == run("analyze", WRAP_CASE, "--width", "0").stdout


def test_width_option_wraps_a_pipe_and_a_file_only_when_asked(tmp_path: Path) -> None:
    wrapped = run("analyze", WRAP_CASE, "--width", "100")
    assert wrapped.returncode == 0, wrapped.stderr
    # only a path longer than a line goes past, whole and alone
    over = [ANSI.sub("", line) for line in wrapped.stdout.splitlines() if len(line) > 100]
    assert all(line.strip() and " " not in line.strip() for line in over), over
    run("analyze", WRAP_CASE, "-o", tmp_path / "plain.txt")
    assert _widest((tmp_path / "plain.txt").read_text()) > 400
    run("analyze", WRAP_CASE, "-o", tmp_path / "wrapped.txt", "--width", "100")
    assert (tmp_path / "wrapped.txt").read_text() == wrapped.stdout
    assert run("analyze", WRAP_CASE, "--width", "-1").returncode == 2


_LOG_LINE = (
    "step 3 loss 1.25\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a "
    "total capacity of 39.39 GiB of which 100.00 MiB is free.\n"
)


@pytest.mark.parametrize(
    "logs",
    [
        # a run of its own at the top, another nested in a sub-folder
        ("out.log", "retry/out.log"),
        # three runs, each nested in the one before
        ("job.err", "b/job.err", "b/c/job.err"),
        # a run made of its files beside sub-folders that hold runs
        ("rank0.log", "rank1.log", "sweep1/train.log", "sweep2/train.log"),
    ],
)
def test_the_command_the_several_runs_refusal_suggests_analyzes_one_run(
    tmp_path: Path, logs: tuple[str, ...]
) -> None:
    top = tmp_path / "my runs"  # a space: the command must quote it
    for name in logs:
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(_LOG_LINE)

    def run_there(*args: str) -> subprocess.CompletedProcess[str]:
        # from the folder the user is in, with this checkout's oomlens
        env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return subprocess.run(
            [sys.executable, "-m", "oomlens", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )

    refused = run_there("analyze", "my runs/")
    assert refused.returncode == 2, refused.stderr
    suggested = re.search(r"analyze one of them \((oomlens analyze .+?)\), all", refused.stderr)
    assert suggested is not None, refused.stderr
    words = shlex.split(suggested.group(1))
    assert words[:2] == ["oomlens", "analyze"]
    done = run_there(*words[1:], "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "gpu_oom"


_KERNEL_KILL = (
    "[Tue Mar  4 10:01:02 2025] Out of memory: Killed process 4242 (python) total-vm:912345678kB, "
    "anon-rss:501234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1000000kB "
    "oom_score_adj:0\n"
)


def _analyze_streamed(
    args: list[str], tmp_path: Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    spool = tmp_path / "tmp"
    spool.mkdir(exist_ok=True)
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "oomlens", "analyze", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"TMPDIR": str(spool)},
        **kwargs,
    )


def test_standard_input_is_read_when_named_dash(tmp_path: Path) -> None:
    log = (case_dir("other_process") / "train.log").read_text()
    result = _analyze_streamed(["-"], tmp_path, input=log)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["diagnoses"][0]["id"] == "other_process"
    assert [i["path"] for i in report["inputs"]] == ["<stdin>"]
    assert str(tmp_path / "tmp") not in result.stdout  # the spool is never shown...
    assert list((tmp_path / "tmp").iterdir()) == []  # ...and is gone


def test_a_pipe_named_by_path_is_read_as_process_substitution_gives_it(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.write(write, _KERNEL_KILL.encode())
    os.close(write)
    try:
        result = _analyze_streamed([f"/dev/fd/{read}"], tmp_path, pass_fds=(read,))
    finally:
        os.close(read)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "host_oom"
    assert [i["path"] for i in report["inputs"]] == [f"/dev/fd/{read}"]


def test_what_the_summary_leaves_out_is_where_it_says(tmp_path: Path) -> None:
    import html

    case = case_dir("model_states_too_large")
    summary = run("analyze", case)
    more = re.search(r"\.\.\. (\d+) more in the full report \((.+)\)$", summary.stdout, re.M)
    assert more is not None, summary.stdout
    report = json.loads(run("analyze", case, "--format", "json").stdout)
    left_out = [
        e["text"]
        for d in report["diagnoses"][:3]
        if len(d["evidence"]) > 4
        for e in d["evidence"][4:]
    ]
    assert len(left_out) >= int(more.group(1))
    ways = more.group(2).split(", or ")
    assert len(ways) >= 2
    for way in ways:
        args = shlex.split(way)
        written = tmp_path / "report"
        if args[0] == "-o":
            written = tmp_path / args[1]
            args = ["-o", str(written)]
        done = run("analyze", case, *args)
        assert done.returncode == 0, done.stderr
        text = written.read_text() if written.exists() else done.stdout
        # the text as a reader sees it: no Markdown escapes, no HTML entities or tags
        plain = " ".join(html.unescape(re.sub(r"<[^>]+>|\\(?=\W)", "", text)).split())
        for item in left_out:
            assert " ".join(item.split())[:70] in plain, (way, item)
