"""Out-of-memory errors the program caught and recovered from.

Automatic batch-size finders (accelerate's ``find_executable_batch_size``, Lightning's
``scale_batch_size``, a script's own retry loop) provoke OOMs on purpose, catch them, and go on
with a smaller batch; some print the full torch message as a warning.  Such an OOM did not end
the run.  ``recovered_ooms(logs)`` finds them: an OOM printed without an uncaught exception
(no traceback, no exception class before the message), followed in the same log by a training
progress line, in a log that shows no failure after it (no uncaught exception, no failed
worker, no launcher reporting a non-zero exit, not cut inside a traceback).
"""

from __future__ import annotations

from collections.abc import Sequence

from oomlens.facts import SourceRef
from oomlens.facts.log import LogFacts, OomEvent


def _caught(event: OomEvent) -> bool:
    return (
        event.origin == "log"
        and event.traceback is None
        and event.message.exception_class is None
        and event.source.line is not None
    )


def _failure_lines(log: LogFacts) -> list[int]:
    """Lines of the log that say the run (or a worker) failed."""
    lines = [e.source.line for e in log.exceptions if not e.peer_failure]
    lines += [e.source.line for e in log.oom_events if not _caught(e)]
    lines += [f.source.line for f in log.process_failures]
    lines += [s.source.line for s in log.failure_summaries]
    lines += [x.source.line for x in log.launcher_exits if x.return_code != 0]
    lines += [k.source.line for k in log.kernel_oom_kills]
    lines += [s.source.line for s in log.fatal_signals]
    return [line for line in lines if line is not None]


def recovered_ooms(logs: Sequence[LogFacts]) -> tuple[SourceRef, ...]:
    """Where the OOMs the program recovered from were printed (see the module docstring)."""
    found: list[SourceRef] = []
    for log in logs:
        caught = [e for e in log.oom_events if _caught(e)]
        if not caught or log.ended_in_traceback:
            continue
        progress = [
            s.source.line
            for s in (*log.steps.samples, log.steps.last)
            if s is not None and s.source.line is not None
        ]
        if not progress:
            continue
        failures = _failure_lines(log)
        for event in caught:
            line = event.source.line
            assert line is not None
            went_on = any(p > line for p in progress)
            failed_after = any(f >= line for f in failures)
            if went_on and not failed_after:
                found.append(event.source)
    return tuple(found)
