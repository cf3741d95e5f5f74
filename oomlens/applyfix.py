"""Apply a report's top fix to the run's own files, so that it can be run without retyping
(``oomlens fix RUN --write DIR``).

What a fix carries is applied as it is, nothing is decided here: its ds_config merge patch
(RFC 7396) onto the config the run used, written as ``DIR/ds_config.json``; its environment as
``DIR/fix.env``; its command-line arguments into the run's command (``--command``), each
replacing the argument of the command that sets the same thing.  Two flags set the same thing
when their names are the same argument name or aliases of one setting
(``oomlens.ingest.context_lines.ALIASES``: ``--micro-batch`` and
``--per_device_train_batch_size`` both set the micro batch).  A flag the command does not have
is not added (the program may not accept it: the run would not start): the result says so.
``DIR/fix.json`` records the fix, what was written and the predicted peak.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomlens.diagnosis import Diagnosis, Fix
from oomlens.errors import UsageError
from oomlens.ingest.context_lines import ALIASES
from oomlens.report import Report
from oomlens.untrusted import one_line


@dataclass(frozen=True, slots=True)
class AppliedFix:
    """The fix applied: from which diagnosis, the files written, the changed command (None
    without ``--command``) and what could not be applied."""

    diagnosis: Diagnosis
    fix: Fix
    written: tuple[str, ...]
    command: str | None
    notes: tuple[str, ...]


def applicable(fix: Fix) -> bool:
    return bool(fix.config_patch or fix.environment or fix.arguments)


def top_fix(report: Report) -> tuple[Diagnosis, Fix]:
    """The top diagnosis' first machine-applicable fix, else its first fix."""
    top = report.top
    if top is None or not top.fixes:
        raise UsageError(
            "the analysis proposes no fix for this run: run oomlens analyze on it to see what "
            "it found"
        )
    return top, next((f for f in top.fixes if applicable(f)), top.fixes[0])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: ``patch`` merged into a copy of ``target``."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0].lower().replace("-", "_")


def _same_setting(flag: str, other: str) -> bool:
    a, b = _name(flag), _name(other)
    return a == b or (ALIASES.get(a) is not None and ALIASES.get(a) == ALIASES.get(b))


def rewrite_command(
    command: str, arguments: Mapping[str, str], replacements: Mapping[str, str]
) -> tuple[str, list[str]]:
    """``command`` with each argument of ``arguments`` set and each value of
    ``replacements`` (old -> new, a config's path) replaced; and notes for the arguments it
    does not have."""
    tokens = shlex.split(command)
    notes: list[str] = []
    for flag, value in arguments.items():
        hit = next(
            (
                i
                for i, token in enumerate(tokens)
                if token.startswith("-")
                and not token.startswith("---")
                and _same_setting(flag, token)
            ),
            None,
        )
        if hit is None:
            notes.append(
                f"the command has no argument for {flag} {value}: not added (the program may "
                "not accept it); set it where your script takes it"
            )
            continue
        inline = "=" in tokens[hit]
        at = hit if inline else hit + 1
        if at >= len(tokens):
            continue
        current = tokens[at].split("=", 1)[1] if inline else tokens[at]
        new = _relative(value, current)
        if new is None:
            notes.append(f"{flag} {value}: the command's value {current!r} is not a count")
            continue
        tokens[at] = tokens[hit].split("=", 1)[0] + "=" + new if inline else new
    tokens = [_replaced(token, replacements) for token in tokens]
    return shlex.join(tokens), notes


def _relative(value: str, current: str) -> str | None:
    """``value`` itself, or ``/4`` / ``*4`` applied to the command's ``current`` count (a fix
    that knows the factor but not the run's value)."""
    if value[:1] not in ("/", "*"):
        return value
    try:
        count, factor = int(current), int(value[1:])
    except ValueError:
        return None
    if factor < 1 or count < 1:
        return None
    return str(max(1, count // factor) if value[0] == "/" else count * factor)


def _replaced(token: str, replacements: Mapping[str, str]) -> str:
    """A config's path named the way the command names it: the same path, or the same file
    name in another folder (the command runs from elsewhere)."""
    if token in replacements:
        return replacements[token]
    for old, new in replacements.items():
        if token.endswith(".json") and os.path.basename(token) == os.path.basename(old):
            return new
    return token


def _config_file(report: Report) -> str | None:
    return next((i.path for i in report.facts.inputs if i.kind == "ds_config"), None)


def apply_fix(report: Report, out_dir: str, command: str | None = None) -> AppliedFix:
    """Write the top fix's files into ``out_dir`` (created) and rewrite ``command``."""
    diagnosis, fix = top_fix(report)
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []
    notes: list[str] = []
    replacements: dict[str, str] = {}
    if fix.config_patch:
        config = report.facts.config
        if config is None:
            notes.append("the fix patches a ds_config, but the inputs hold none: pass it")
        else:
            patched = merge_patch(config.reading.raw, fix.config_patch)
            path = os.path.join(out_dir, "ds_config.json")
            with open(path, "w", encoding="utf-8") as out:
                json.dump(patched, out, indent=2)
                out.write("\n")
            written.append(path)
            original = _config_file(report)
            if original is not None:
                replacements[original] = path
    environment = dict(fix.environment)
    if environment:
        path = os.path.join(out_dir, "fix.env")
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(f"export {k}={shlex.quote(v)}\n" for k, v in environment.items())
        written.append(path)
    new_command = None
    if command is not None:
        new_command, missing = rewrite_command(command, fix.arguments, replacements)
        notes += missing
        if environment:
            new_command = (
                " ".join(f"{k}={shlex.quote(v)}" for k, v in environment.items())
                + " "
                + new_command
            )
        path = os.path.join(out_dir, "command.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.write(new_command + "\n")
        written.append(path)
    elif fix.arguments:
        notes.append("pass the run's command (--command) to have its arguments rewritten")
    if not applicable(fix):
        notes.append(f"the top fix is not machine-applicable: {one_line(fix.summary)}")
    record = {
        "diagnosis": diagnosis.id,
        "summary": fix.summary,
        "config_patch": fix.config_patch,
        "environment": environment,
        "arguments": dict(fix.arguments),
        "predicted_peak_bytes": fix.predicted_peak_bytes,
        "predicted_saving_bytes": fix.predicted_saving_bytes,
        "command": new_command,
        "written": list(written),
        "notes": notes,
    }
    path = os.path.join(out_dir, "fix.json")
    with open(path, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=2, default=str)
        out.write("\n")
    written.append(path)
    return AppliedFix(diagnosis, fix, tuple(written), new_command, tuple(notes))
