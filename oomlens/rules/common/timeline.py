"""When and where in the run a failure happened: its phase (derived once,
``RunFacts.signals``), the steps before it, whether training had started.
"""

from __future__ import annotations

from oomlens.facts import SourceRef
from oomlens.facts.log import (
    LogFacts,
    OomEvent,
    Phase,
)
from oomlens.facts.run import RunFacts


def phase(facts: RunFacts, event: OomEvent) -> Phase:
    """The failure's phase: the reader's, or what the innermost frames show when it has none
    (derived once: ``RunFacts.signals.place``)."""
    return facts.signals.place(event).phase


CUT_PLACE_CONFIDENCE = 0.3
"""How sure a family is named from where a cut traceback stops, the failure itself lost: a base
rate, stated as such.  In the field corpus' development split, every cut traceback placed in
evaluation, generation, a checkpoint save or model loading whose thread established a verdict
was an out-of-memory (6 of 6); that is a corpus of memory threads, so the figure stays low."""


def steps_completed_before(facts: RunFacts, event: OomEvent) -> int | None:
    """The last step counter printed before the OOM in its log (None: no step lines)."""
    best: int | None = None
    for log in facts.logs:
        if log.path != event.source.path:
            continue
        for sample in log.steps.samples:
            if sample.step is None or sample.source.line is None or event.source.line is None:
                continue
            if sample.source.line < event.source.line:
                best = sample.step if best is None else max(best, sample.step)
    return best


def any_steps(facts: RunFacts) -> bool:
    return any(log.steps.total for log in facts.logs)


def log_of(facts: RunFacts, source: SourceRef) -> LogFacts | None:
    for log in facts.logs:
        if log.path == source.path:
            return log
    return None


def first_step_optimizer_oom(facts: RunFacts, event: OomEvent) -> bool:
    """The OOM happened in the optimizer step before any step completed: the optimizer's
    states (created lazily at the first step) did not fit."""
    if phase(facts, event) is not Phase.OPTIMIZER_STEP:
        return False
    return failed_before_training(facts, event)


def optimizer_state_init(event: OomEvent) -> bool:
    """The failing allocation creates optimizer state (torch ``_init_group``, DeepSpeed
    ``initialize_optimizer_states`` / ``_create_fp32_partitions``)."""
    if event.traceback is None:
        return False
    names = {f.function for f in event.traceback.frames[-6:]}
    return bool(
        names
        & {
            "_init_group",
            "initialize_optimizer_states",
            "_create_fp32_partitions",
            "_init_state",
            "init_state",
        }
    )


def failed_before_training(facts: RunFacts, event: OomEvent) -> bool:
    """The failure came before any training step completed, as far as the log can tell: no
    progress line before it where the log has progress lines, or, where it has none, a log
    that shows the job starting (a parameter count, DeepSpeed's config dump or world info).
    A paste of the error alone says nothing about when it came."""
    done = steps_completed_before(facts, event)
    if done is not None:
        return done == 0
    log = log_of(facts, event.source)
    if log is None or log.steps.total:
        return False
    return any(fact is not None for fact in (log.param_count, log.config_dump, log.world_size))


def printed_line(facts: RunFacts, source: SourceRef) -> str | None:
    """The text of the line at ``source`` when the log kept it (its last lines), else None."""
    log = log_of(facts, source)
    if log is None or source.line is None:
        return None
    for number, text in log.tail:
        if number == source.line:
            return text
    return None
