"""How workers died when they printed no error of their own: signals, exit codes, launchers.

A process killed by a signal prints nothing; what is left is a launcher's report of it and the
shell's word.  Negative exit codes are signals (torchrun, DeepSpeed's launcher, Python's
``subprocess``: ``-9``), a shell reports ``128 + N`` (137), and some launchers report the byte
``256 - N`` (247).  What each signal usually means on a training node:

* SIGKILL (9): the kernel's OOM killer (host memory), a scheduler's limit, or ``kill -9``;
* SIGBUS (7): a shared-memory mapping that could not be backed: /dev/shm too small (Docker's
  64 MB default) for DataLoader workers or NCCL;
* SIGSEGV (11): a crash in native code, not a lack of memory;
* SIGABRT (6): an abort (``terminate called``, NCCL's watchdog), not a lack of memory.

``signal_deaths(facts)`` lists every such death the inputs show; ``silent_death(facts)`` says
whether a worker died with no error printed at all (DeepSpeed's launcher "Killing subprocess",
torchrun's closing signals, with no exception, OOM or config error anywhere);
``host_memory_pressure(facts)`` is DeepSpeed's last node-wide ``CPU Virtual Memory`` figure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from oomlens.facts import SourceRef
from oomlens.facts.kernel import FatalSignalKind
from oomlens.facts.log import ClosingSignal, MemorySample
from oomlens.facts.run import RunFacts
from oomlens.facts.signals import (
    NormalEnd,
    SchedulerEnd,
    SignalDeath,
    SilentDeath,
    UnseenError,
)

_BY_NUMBER = {9: "SIGKILL", 7: "SIGBUS", 11: "SIGSEGV", 6: "SIGABRT"}


def signal_of_exit(code: int | None) -> str | None:
    """The signal an exit code reports (``-N``, ``128 + N``, ``256 - N``), if it is one of the
    four that matter here."""
    if code is None or code in (0, 1, 2):
        return None
    for number, name in _BY_NUMBER.items():
        if code in (-number, 128 + number, 256 - number):
            return name
    return None


def signal_deaths(facts: RunFacts) -> list[SignalDeath]:
    """Every signal death the inputs report, launcher lines first, then shells' words."""
    found: list[SignalDeath] = []
    for exit_line in facts.ranks.launcher_exits:
        name = signal_of_exit(exit_line.return_code)
        if name is not None:
            found.append(
                SignalDeath(
                    name, exit_line.source, f"exits with return code = {exit_line.return_code}"
                )
            )
    for log in facts.logs:
        for failure in log.process_failures:
            name = failure.signal if failure.signal in _BY_NUMBER.values() else None
            name = name or signal_of_exit(failure.exitcode)
            if name is not None:
                found.append(
                    SignalDeath(name, failure.source, f"exitcode {failure.exitcode} ({name})")
                )
        found.extend(
            SignalDeath(line.kind.value, line.source, line.text)
            for line in log.fatal_signals
            if line.kind.value in _BY_NUMBER.values()
        )
    for status in facts.ranks.ranks:
        name = status.signal if status.signal in _BY_NUMBER.values() else None
        name = name or signal_of_exit(status.exitcode)
        if name is not None and not any(d.signal == name for d in found):
            found.append(
                SignalDeath(
                    name, status.first_source, f"rank {status.rank} exitcode {status.exitcode}"
                )
            )
    return found


def silent_death(facts: RunFacts) -> SilentDeath | None:
    """The launcher tore the job down (DeepSpeed's ``Killing subprocess``, torchrun's closing
    signals) and no worker printed an exception, an OOM message or a config error: one of them
    died of a signal."""
    if facts.oom_events() or any(not e.peer_failure for e in facts.exceptions()):
        return None
    if any(log.batch_assertions or log.config_errors for log in facts.logs):
        return None
    if any(
        x.return_code != 0 and signal_of_exit(x.return_code) is None
        for x in facts.ranks.launcher_exits
    ):
        return None  # an exit code of its own (1): a Python error, printed where we cannot see
    for log in facts.logs:
        if log.killed_subprocesses:
            kill = log.killed_subprocesses[0]
            return SilentDeath(kill.source, f"Killing subprocess {kill.pid}")
        if log.closing_signals:
            closing = log.closing_signals[0]
            return SilentDeath(closing.source, _stopped_survivors(log.closing_signals))
    return None


def unseen_errors(facts: RunFacts) -> list[UnseenError]:
    """Workers a launcher reports exited with a code of their own (1: an uncaught Python error)
    when no worker's error is in the inputs: no OOM, no exception other than the launcher's own
    ``ChildFailedError`` and peers' broken collectives, no error file, no message quoted in the
    launcher's failure table.  The error is on the worker's stderr, which the inputs lack."""
    if facts.oom_events() or facts.error_files:
        return []
    if any(
        not e.peer_failure and not e.exception_class.endswith("ChildFailedError")
        for e in facts.exceptions()
    ):
        return []
    failures = [f for log in facts.logs for f in log.process_failures]
    if any(f.message and f.signal is None and f.origin != "signal_line" for f in failures):
        return []  # the launcher quoted a worker's error
    found: list[UnseenError] = []
    seen: set[object] = set()
    # the failure table names the global rank; the agent's own line only the local one
    for failure in sorted(failures, key=lambda f: f.origin != "torchrun_summary"):
        code = failure.exitcode
        if code is None or code <= 0 or failure.signal is not None or signal_of_exit(code):
            continue
        if failure.origin not in ("torchrun_summary", "torchrun_agent", "mp_spawn"):
            continue
        rank = failure.rank if failure.rank is not None else failure.local_rank
        key = failure.pid if failure.pid is not None else (rank, code)
        if key in seen:
            continue
        seen.add(key)
        found.append(UnseenError(rank, code, failure.source, failure.unrecorded))
    for exit_line in facts.ranks.launcher_exits:
        code = exit_line.return_code
        if code > 0 and signal_of_exit(code) is None and (None, code) not in seen:
            seen.add((None, code))
            found.append(UnseenError(None, code, exit_line.source, False))
    for log in facts.logs:  # srun: "task N: Exited with exit code C"
        for line in log.fatal_signals:
            exited = _TASK_EXIT_CODE.search(line.text)
            if line.kind is not FatalSignalKind.TASK_EXITED or exited is None:
                continue
            code = int(exited.group(1))
            if code > 0 and signal_of_exit(code) is None and (None, code) not in seen:
                seen.add((None, code))
                found.append(UnseenError(None, code, line.source, False))
    found.sort(key=lambda u: not u.unrecorded)
    return found


def normal_end(facts: RunFacts) -> NormalEnd | None:
    """Positive evidence that the run ended normally: a launcher's ``exits with return code =
    0``, a completion line (DeepSpeed's ``exits successfully``, torchrun's ``worker group
    finished``, the HF Trainer's ``train_runtime``, Lightning's ``fit stopped``, a script's
    ``training finished``), a last progress line that completes a known total (``step 3/3``;
    not a tqdm bar, which loading shards prints too), or every captured rank's exit 0."""
    for exit_line in facts.ranks.launcher_exits:
        if exit_line.return_code == 0:
            return NormalEnd("exits with return code = 0", exit_line.source)
    for log in facts.logs:
        if log.completion is not None:
            return NormalEnd(log.completion.text, log.completion.source)
    for log in facts.logs:
        last = log.steps.last
        if (
            last is not None
            and last.kind != "tqdm"
            and last.step is not None
            and last.total
            and last.step >= last.total
        ):
            return NormalEnd(f"step {last.step} of {last.total}, the last", last.source)
    if facts.captures and all(c.exit_code == 0 for c in facts.captures):
        return NormalEnd("every captured rank exited with status 0", facts.captures[0].source)
    return None


_TASK_EXIT_CODE = re.compile(r"Exited with exit code (\d{1,3})")
_DUE_TO = re.compile(r"DUE TO ([A-Z][A-Z ]{0,40}?) ?\*\*\*")
_REASONS = {
    "TIME LIMIT": "its time limit",
    "PREEMPTION": "preemption",
    "NODE FAILURE": "a node failure",
    "JOB REQUEUE": "a requeue",
}


def scheduler_end(facts: RunFacts) -> SchedulerEnd | None:
    """Slurm's cancellation of the job or step (``... CANCELLED AT T DUE TO <REASON> ***``),
    the reason in words."""
    for log in facts.logs:
        for line in log.fatal_signals:
            if line.kind is FatalSignalKind.SCHEDULER_CANCELLED:
                due = _DUE_TO.search(line.text)
                reason = None
                if due is not None:
                    said = due.group(1).strip()
                    reason = _REASONS.get(said, said.lower())
                return SchedulerEnd(reason, line.source, line.text)
    return None


def _stopped_survivors(closing: Sequence[ClosingSignal]) -> str:
    """torchrun's closing signals in words: they go to the workers still alive, so the one
    that died is not among them, and a single pid missing from a run of consecutive ones
    (workers started one after the other) is most likely it."""
    first = closing[0]
    text = f"Sending process {first.pid} closing signal {first.signal}"
    pids = sorted({c.pid for c in closing})
    if len(pids) > 1:
        text += f" and {len(pids) - 1} more: the launcher stopping the workers still alive"
        if pids[-1] - pids[0] == len(pids):  # one gap in the run
            gap = next(a + 1 for a, b in zip(pids, pids[1:], strict=False) if b - a == 2)
            text += f"; pid {gap}, missing from them, is most likely the one that died"
    return text


def host_memory_pressure(facts: RunFacts) -> MemorySample | None:
    """The last ``see_memory_usage`` sample that carries DeepSpeed's node-wide CPU figure."""
    last: MemorySample | None = None
    for series in facts.memory_series():
        for sample in series.samples:
            if sample.cpu_percent is None:
                continue
            if last is None or (sample.source.line or 0) >= (last.source.line or 0):
                last = sample
    return last


_SHM_DENIED = re.compile(r"(?:shm_open|/dev/shm|shared memory)[^\n]{0,80}Permission denied", re.I)


def shm_permission_denied(facts: RunFacts) -> SourceRef | None:
    """Where the log says opening shared memory was refused (``shm_open failed : Permission
    denied``): a permission, not /dev/shm running out."""
    for log in facts.logs:
        for number, text in log.tail:
            if _SHM_DENIED.search(text):
                return SourceRef(log.path, number, log.layout_rank)
        for line in log.fatal_signals:
            if _SHM_DENIED.search(line.text):
                return line.source
    return None
