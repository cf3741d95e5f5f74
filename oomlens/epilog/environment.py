"""What a SLURM Epilog knows about the job: its environment, parsed and checked.

slurmd and slurmctld run the Epilog with a small environment built from scratch (no ``PATH``,
``HOME`` or ``LANG``).  What is in it was measured on Slurm 22.05
(``shared/docs/slurm-one-node-recipe.md``):

* ``SLURM_JOB_EXIT_CODE`` and ``SLURM_JOB_DERIVED_EC`` are raw ``wait()`` statuses (``256`` is
  exit 1, ``9`` is SIGKILL); ``SLURM_JOB_EXIT_CODE2`` is ``exit:signal``.
* ``SLURM_JOB_STDOUT`` / ``SLURM_JOB_STDERR`` hold the sbatch pattern unexpanded, and are absent
  when ``-o`` / ``-e`` were not given.
* The slurmd Epilog (``SLURM_SCRIPT_CONTEXT=epilog_slurmd``) has ``SLURMD_NODENAME`` and
  ``SLURM_NODELIST`` but no job name and no array ids; the slurmctld one
  (``epilog_slurmctld``) has ``SLURM_JOB_NAME``, ``SLURM_JOB_NODELIST`` and ``SLURM_ARRAY_*``.

Parsing never raises: a value that cannot be read becomes None and a problem string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

# Slurm writes ids and codes in ASCII digits; a str pattern's \d (and str.isdigit) also takes
# Arabic-Indic and other Unicode digits, which int() reads but which would name a directory.
_DIGITS = re.compile(r"[0-9]{1,10}")
_EXIT_CODE2 = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_MAX_VALUE_CHARS = 4096
"""Longer values are refused: no real job id, user name or path is that long."""


class ScriptContext(StrEnum):
    """Who runs the script (``SLURM_SCRIPT_CONTEXT``)."""

    EPILOG_SLURMD = "epilog_slurmd"
    EPILOG_SLURMCTLD = "epilog_slurmctld"
    UNKNOWN = "unknown"
    """Not set (run by hand) or a value oomlens does not know."""


@dataclass(frozen=True, slots=True)
class WaitStatus:
    """A raw ``wait()`` status as Slurm passes it: exit code and terminating signal."""

    raw: int

    @property
    def signal(self) -> int:
        """The signal that killed the process, 0 when it exited."""
        return self.raw & 0x7F

    @property
    def exit_code(self) -> int:
        """The exit code, 0 when a signal killed the process."""
        return (self.raw >> 8) & 0xFF if self.signal == 0 else 0

    @property
    def failed(self) -> bool:
        return self.raw != 0

    def describe(self) -> str:
        """``exit 1``, ``signal 9``, ``ok``."""
        if self.signal:
            return f"signal {self.signal}"
        return f"exit {self.exit_code}" if self.exit_code else "ok"

    def as_dict(self) -> dict[str, int]:
        return {"raw": self.raw, "exit_code": self.exit_code, "signal": self.signal}


@dataclass(frozen=True, slots=True)
class ExitPair:
    """``SLURM_JOB_EXIT_CODE2``: ``exit:signal`` as scontrol prints it."""

    exit_code: int
    signal: int

    @property
    def failed(self) -> bool:
        return self.exit_code != 0 or self.signal != 0

    def __str__(self) -> str:
        return f"{self.exit_code}:{self.signal}"


@dataclass(frozen=True, slots=True)
class JobEnvironment:
    """The job as the Epilog's environment describes it; None where a value is absent or bad."""

    job_id: str | None
    """Digits only (checked: the id names a spool directory)."""
    user: str | None
    uid: int | None
    gid: int | None
    exit_status: WaitStatus | None
    """``SLURM_JOB_EXIT_CODE``: the batch script's raw wait status."""
    exit_pair: ExitPair | None
    """``SLURM_JOB_EXIT_CODE2``."""
    derived_status: WaitStatus | None
    """``SLURM_JOB_DERIVED_EC``: the highest raw status of the job's srun steps."""
    stdout_pattern: str | None
    stderr_pattern: str | None
    work_dir: str | None
    nodelist: str | None
    """``SLURM_JOB_NODELIST``, else ``SLURM_NODELIST`` (both are the job's nodes)."""
    node_name: str | None
    """``SLURMD_NODENAME``: the node this Epilog runs on (slurmd context only)."""
    context: ScriptContext
    job_name: str | None
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    problems: tuple[str, ...] = ()
    """What could not be read, one line each (``SLURM_JOB_UID='x': not a number``)."""
    invalid_job_id: str | None = None
    """The job id the environment gave when it is not one (``../x``; at most 40 characters):
    then :attr:`job_id` is None although Slurm did set it."""
    spool_suffix: str = ""
    """Added to the spool key when an earlier job with the same id holds ``<id>/`` already
    (``.t20261201T093000``: job ids repeat after MaxJobId wraps or the controller lost its
    state)."""

    @property
    def failed(self) -> bool:
        """Whether the job failed: the script's or any step's status is not success.

        A job cancelled with scancel shows ``0:0`` to the Epilog and so counts as not failed.
        When neither status is known, ``SLURM_JOB_EXIT_CODE2`` decides; when nothing is known
        the job does not count as failed (oomlens has no reason to act).
        """
        if self.exit_status is not None or self.derived_status is not None:
            return bool(
                (self.exit_status is not None and self.exit_status.failed)
                or (self.derived_status is not None and self.derived_status.failed)
            )
        return self.exit_pair is not None and self.exit_pair.failed

    @property
    def spool_key(self) -> str | None:
        """The name of this job's spool directory: ``<id>``, or ``<id>.r<n>`` for a requeued run,
        followed by :attr:`spool_suffix`."""
        if self.job_id is None:
            return None
        base = self.job_id if self.restart_count == 0 else f"{self.job_id}.r{self.restart_count}"
        return base + self.spool_suffix

    def identity(self) -> dict[str, object]:
        """What both Epilogs of one job (slurmd's and slurmctld's) see alike, and a later job
        that reuses the id almost never matches: recorded when the job's spool directory is
        claimed, compared when the claim finds the directory taken."""
        return {
            "id": self.job_id,
            "restart_count": self.restart_count,
            "uid": self.uid,
            "work_dir": self.work_dir,
            "stdout": self.stdout_pattern,
            "stderr": self.stderr_pattern,
            "exit_raw": None if self.exit_status is None else self.exit_status.raw,
            "derived_raw": None if self.derived_status is None else self.derived_status.raw,
        }

    def describe_exit(self) -> str:
        """``1:0`` when known (what scontrol shows), else the decoded raw status."""
        if self.exit_pair is not None:
            text = str(self.exit_pair)
        elif self.exit_status is not None:
            text = f"{self.exit_status.exit_code}:{self.exit_status.signal}"
        else:
            text = "?"
        if self.derived_status is not None and self.derived_status.failed:
            text += f" (a step: {self.derived_status.describe()})"
        return text


def parse_job_environment(environ: Mapping[str, str]) -> JobEnvironment:
    """Read the job from an Epilog environment (``os.environ`` or a test's dict); never raises."""
    problems: list[str] = []

    def text(name: str) -> str | None:
        value = environ.get(name)
        if value is None or value == "" or value == "(null)":
            return None
        if len(value) > _MAX_VALUE_CHARS or "\x00" in value:
            problems.append(f"{name}: value too long or not text; ignored")
            return None
        return value

    def number(name: str) -> int | None:
        value = text(name)
        if value is None:
            return None
        if not _DIGITS.fullmatch(value):
            problems.append(f"{name}={value[:40]!r}: not a number; ignored")
            return None
        return int(value)

    def status(name: str) -> WaitStatus | None:
        value = number(name)
        return None if value is None else WaitStatus(value)

    given_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    job_id = text("SLURM_JOB_ID") or text("SLURM_JOBID")
    if job_id is not None and not _DIGITS.fullmatch(job_id):
        problems.append(f"SLURM_JOB_ID={job_id[:40]!r}: not a job id; ignored")
        job_id = None
    invalid_job_id = None
    if job_id is None and given_id not in (None, "", "(null)"):
        invalid_job_id = given_id[:40]

    exit_pair = None
    pair_text = text("SLURM_JOB_EXIT_CODE2")
    if pair_text is not None:
        match = _EXIT_CODE2.fullmatch(pair_text)
        if match is None:
            problems.append(f"SLURM_JOB_EXIT_CODE2={pair_text[:40]!r}: not exit:signal; ignored")
        else:
            exit_pair = ExitPair(int(match.group(1)), int(match.group(2)))

    uid = number("SLURM_JOB_UID")
    if uid is None:
        uid = number("SLURM_UID")

    context_text = text("SLURM_SCRIPT_CONTEXT")
    try:
        context = ScriptContext(context_text) if context_text else ScriptContext.UNKNOWN
    except ValueError:
        context = ScriptContext.UNKNOWN

    return JobEnvironment(
        job_id=job_id,
        user=text("SLURM_JOB_USER"),
        uid=uid,
        gid=number("SLURM_JOB_GID"),
        exit_status=status("SLURM_JOB_EXIT_CODE"),
        exit_pair=exit_pair,
        derived_status=status("SLURM_JOB_DERIVED_EC"),
        stdout_pattern=text("SLURM_JOB_STDOUT"),
        stderr_pattern=text("SLURM_JOB_STDERR"),
        work_dir=text("SLURM_JOB_WORK_DIR"),
        nodelist=text("SLURM_JOB_NODELIST") or text("SLURM_NODELIST"),
        node_name=text("SLURMD_NODENAME"),
        context=context,
        job_name=text("SLURM_JOB_NAME"),
        array_job_id=_digits_or_none(text("SLURM_ARRAY_JOB_ID")),
        array_task_id=_digits_or_none(text("SLURM_ARRAY_TASK_ID")),
        restart_count=number("SLURM_JOB_RESTART_COUNT") or 0,
        problems=tuple(problems),
        invalid_job_id=invalid_job_id,
    )


def _digits_or_none(value: str | None) -> str | None:
    return value if value is not None and _DIGITS.fullmatch(value) else None


def first_host(nodelist: str) -> str | None:
    """The first node of a Slurm hostlist expression, or None when it cannot be read.

    ``node[07-09,12],gpu1`` -> ``node07``; ``rack[1-2]-n[01-04]`` -> ``rack1-n01``.  Slurm
    lists a job's nodes in node-table order and starts the batch script on the first, so this
    is the node that ran the batch script and wrote its output.
    """
    depth = 0
    end = len(nodelist)
    for index, char in enumerate(nodelist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            end = index
            break
    item = nodelist[:end].strip()
    if not item:
        return None
    host: list[str] = []
    position = 0
    while position < len(item):
        open_at = item.find("[", position)
        if open_at < 0:
            host.append(item[position:])
            break
        close_at = item.find("]", open_at)
        if close_at < 0:
            return None
        host.append(item[position:open_at])
        first_range = item[open_at + 1 : close_at].split(",", 1)[0]
        first_value = first_range.split("-", 1)[0].strip()
        if not (first_value.isascii() and first_value.isdigit()):
            return None
        host.append(first_value)
        position = close_at + 1
    name = "".join(host)
    return name or None
