"""A failure's lines and another run's in one file (two jobs writing to one log, a paste of
two terminals): the other run's normal end must not make the failure's OOM a caught one, and
its lines must neither end the failure's traceback nor continue its error's message.

Every input is made by code from real lines: a field paste's crash (``algoperf-426``: an
exception line; ``pytorch-64586``: an IPython traceback; ``pytorch-37004``: an NCCL error,
whose message runs on to the next blank line) or a lab run's OOM message as ``str(e)`` prints
it (``lab_log_torch2.11_h200.txt``), and the lines of a healthy run of the crash corpus
(``prefetch_fits``, which ends with DeepSpeed's ``exits successfully``;
``oom_caught_and_retried``, whose retry loop logs the OOMs it caught), the two interleaved
with each log's order kept.
"""

from __future__ import annotations

from pathlib import Path

from oomlens.ingest.log import read_log
from oomlens.session import AnalysisOptions, analyze
from tests.ingest.log._field import paste_path

CRASH = Path(__file__).resolve().parents[3] / "fixtures" / "crash_logs"
LAB = Path(__file__).resolve().parents[2] / "assets" / "logs" / "lab_log_torch2.11_h200.txt"
NO_DEEPSPEED = AnalysisOptions(prefer_deepspeed=False)


def _healthy(run: str = "prefetch_fits") -> list[str]:
    return (CRASH / run / "train.log").read_text().splitlines()


def _interleaved(failure: list[str], healthy: list[str], every: int) -> list[str]:
    """One of the failure's lines after each ``every`` of the healthy run's, from its start."""
    out: list[str] = []
    rest = list(failure)
    for number, line in enumerate(healthy):
        out.append(line)
        if rest and number % every == every - 1:
            out.append(rest.pop(0))
    return out + rest


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def _paste(name: str) -> list[str]:
    return paste_path(name).read_text().splitlines()


def test_an_exception_line_is_raised_whatever_ends_after_it(tmp_path: Path) -> None:
    # Python's own line of an uncaught error (class, then message), its traceback's header lost
    # to the paste, then another run that ends normally
    line = next(x for x in _paste("algoperf-426") if x.startswith("torch.cuda.OutOfMemoryError"))
    path = _write(tmp_path, _interleaved([line], _healthy(), 5))
    facts = read_log(path)
    assert len(facts.oom_events) == 1 and facts.caught_oom_events == ()
    assert facts.completion is not None  # the other run's end is read, and speaks for itself
    assert analyze([str(path)], options=NO_DEEPSPEED).verdict.value == "gpu_oom"


def test_a_bare_oom_message_then_a_normal_end_is_unknown(tmp_path: Path) -> None:
    # str(e) printed alone: a retry loop's print or a crash whose traceback the paste lost
    line = next(x for x in LAB.read_text().splitlines() if "CUDA out of memory" in x)
    bare = line[line.index("CUDA out of memory") :]
    path = _write(tmp_path, _interleaved([bare], _healthy(), 7))
    report = analyze([str(path)], options=NO_DEEPSPEED)
    assert report.verdict.value == "unknown"
    assert "printed bare" in report.verdict_reason


def test_another_runs_line_does_not_end_an_ipython_traceback(tmp_path: Path) -> None:
    # IPython ends its traceback with the class its header names; the other run's
    # "model 1.3b: 1.34B parameters" and "Config: alpha=..." between the frames are not that end
    failure = _paste("pytorch-64586")
    path = _write(tmp_path, _interleaved(failure, _healthy(), 2))
    facts = read_log(path)
    assert [e.message.exception_class for e in facts.oom_events] == ["RuntimeError"]
    assert facts.oom_events[0].traceback is not None
    assert analyze([str(path)], options=NO_DEEPSPEED).verdict.value == "gpu_oom"


def test_a_logger_record_does_not_continue_another_processs_error_message(tmp_path: Path) -> None:
    # an exception message runs on to the next blank line; the other run's records before it
    # ("2026-12-01 10:24:13,851 - WARNING - ... retrying smaller: CUDA out of memory")
    # are its own caught OOMs, not more of that message
    failure = _paste("pytorch-37004")
    path = _write(tmp_path, _interleaved(failure, _healthy("oom_caught_and_retried"), 1))
    facts = read_log(path)
    assert facts.oom_events == () and len(facts.caught_oom_events) == 11
    assert analyze([str(path)], options=NO_DEEPSPEED).verdict.value == "other_failure"


def test_a_logged_oom_then_a_death_of_its_own_is_not_the_failure(tmp_path: Path) -> None:
    # a retry loop logs the OOMs it caught ("retrying smaller: CUDA out of memory..."), then
    # the shell says the process was killed: the run went on after the OOMs and died of the kill
    retries = [x for x in _healthy("oom_caught_and_retried") if "retrying smaller" in x][:5]
    killed = next(x for x in _paste("videollava-13") if x.endswith("]Killed"))
    path = _write(tmp_path, [*retries, killed.rsplit("]", 1)[1]])
    facts = read_log(path)
    assert facts.oom_events == () and len(facts.caught_oom_events) == 5
    assert analyze([str(path)], options=NO_DEEPSPEED).verdict.value == "host_oom"
