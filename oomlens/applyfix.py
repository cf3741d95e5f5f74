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

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomlens.diagnosis import Diagnosis, Fix
from oomlens.errors import UsageError
from oomlens.facts.memory_model import apply_merge_patch
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
            "the analysis proposes no fix for this run (oomlens analyze shows what it found)"
        )
    return top, next((f for f in top.fixes if applicable(f)), top.fixes[0])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: ``patch`` merged into a copy of ``target`` (the memory model's own)."""
    return apply_merge_patch(target, patch)


def _name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0].lower().replace("-", "_")


def _same_setting(flag: str, other: str) -> bool:
    a, b = _name(flag), _name(other)
    return a == b or (ALIASES.get(a) is not None and ALIASES.get(a) == ALIASES.get(b))


def _is_flag(token: str) -> bool:
    """An option, not a value: ``--x``, ``-x``; a negative number is a value."""
    return token.startswith("-") and not token.startswith("---") and not _NUMBER.match(token)


_NUMBER = re.compile(r"^-\d*\.?\d+(?:[eE][-+]?\d+)?$")


def rewrite_command(
    command: str, arguments: Mapping[str, str], replacements: Mapping[str, str]
) -> tuple[str, list[str]]:
    """``command`` with each argument of ``arguments`` set and each value of
    ``replacements`` (old -> new, a config's path) replaced; and notes for what it could not
    do.  Every occurrence of a flag is set (argparse keeps the last one given); a flag with no
    value after it (a switch, or the command's last word) is left as it is, with a note."""
    try:
        tokens = shlex.split(command)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"--command: cannot split it as a shell would ({exc})") from exc
    notes: list[str] = []
    for flag, value in arguments.items():
        hits = [
            i for i, token in enumerate(tokens) if _is_flag(token) and _same_setting(flag, token)
        ]
        if not hits:
            notes.append(
                f"the command has no argument for {flag} {value}: not added (the program may "
                "not accept it); set it where your script takes it"
            )
            continue
        for hit in hits:
            inline = "=" in tokens[hit]
            if not inline and (hit + 1 >= len(tokens) or _is_flag(tokens[hit + 1])):
                notes.append(
                    f"{tokens[hit]} has no value in the command: left as it is; set it to {value}"
                )
                continue
            at = hit if inline else hit + 1
            current = tokens[at].split("=", 1)[1] if inline else tokens[at]
            updated = _relative(value, current)
            if updated is None:
                notes.append(f"{flag} {value}: the command's value {current!r} is not a count")
                continue
            tokens[at] = tokens[hit].split("=", 1)[0] + "=" + updated if inline else updated
    replaced = False
    for i, token in enumerate(tokens):
        head, eq, tail = token.partition("=") if _is_flag(token) else ("", "", token)
        new = _replacement(tail, replacements)
        if new is not None:
            if tail not in replacements and not any(
                os.path.realpath(tail) == os.path.realpath(old) for old in replacements
            ):
                notes.append(f"{tail} taken for the run's config (the same file name): {new}")
            tokens[i] = head + eq + new
            replaced = True
    if replacements and not replaced:
        for old, new in replacements.items():
            notes.append(f"the command does not name {old}: pass {new} where it takes its config")
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


def _replacement(token: str, replacements: Mapping[str, str]) -> str | None:
    """The new path for ``token`` when it names one of the old paths: as written, the same
    file by another relative path, or a config file of the same name in another folder (the
    command runs where the run ran, not where its files were collected)."""
    if not token:
        return None
    if token in replacements:
        return replacements[token]
    resolved = os.path.realpath(token)
    for old, new in replacements.items():
        if os.path.realpath(old) == resolved:
            return new
    for old, new in replacements.items():
        if token.endswith(".json") and os.path.basename(token) == os.path.basename(old):
            return new
    return None


def _config_file(report: Report) -> str | None:
    return next((i.path for i in report.facts.inputs if i.kind == "ds_config"), None)


def apply_fix(report: Report, out_dir: str, command: str | None = None) -> AppliedFix:
    """Write the top fix's files into ``out_dir`` (created) and rewrite ``command``."""
    diagnosis, fix = top_fix(report)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--write {out_dir}: cannot create it ({exc.strerror or exc})") from exc
    written: list[str] = []
    notes: list[str] = []
    replacements: dict[str, str] = {}
    if fix.config_patch:
        config = report.facts.config
        if config is None:
            # DeepSpeed fills what a config leaves out with its defaults, and Lightning's
            # DeepSpeedStrategy(config=...) adds the batch, accumulation and precision itself
            path = _write(out_dir, "ds_config.json", json.dumps(fix.config_patch, indent=2) + "\n")
            written.append(path)
            notes.append(
                f"the inputs hold no ds_config: {path} holds only the fix's keys; merge them into "
                "the run's config (Lightning: DeepSpeedStrategy(config=PATH) takes the file as "
                "it is)"
            )
        else:
            patched = merge_patch(config.reading.raw, fix.config_patch)
            path = _write(out_dir, "ds_config.json", json.dumps(patched, indent=2) + "\n")
            written.append(path)
            original = _config_file(report)
            if original is not None:
                replacements[original] = path
            else:
                notes.append(
                    f"the run's config file is not among the inputs: pass {path} where the run "
                    "takes its config"
                )
    environment = dict(fix.environment)
    if environment:
        path = _write(
            out_dir,
            "fix.env",
            "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environment.items()),
        )
        written.append(path)
    new_command = None
    if command is not None and fix.arguments:
        pinned = accelerate_config_of(command)
        if pinned is not None:
            written_to, pin_notes = _patch_accelerate_config(pinned, fix.arguments, out_dir)
            notes += pin_notes
            if written_to is not None:
                written.append(written_to)
                replacements[pinned] = written_to
    if command is not None:
        new_command, missing = rewrite_command(command, fix.arguments, replacements)
        notes += missing
        if environment:
            new_command = (
                " ".join(f"{k}={shlex.quote(v)}" for k, v in environment.items())
                + " "
                + new_command
            )
        written.append(_write(out_dir, "command.txt", new_command + "\n"))
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
    written.append(_write(out_dir, "fix.json", json.dumps(record, indent=2, default=str) + "\n"))
    return AppliedFix(diagnosis, fix, tuple(written), new_command, tuple(notes))


def accelerate_config_of(command: str) -> str | None:
    """The config file an ``accelerate launch`` command names (``--config_file PATH`` or
    ``--config_file=PATH``), or None."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    launch = next(
        (
            i
            for i, token in enumerate(tokens)
            if token == "accelerate.commands.launch"
            or (token.endswith("accelerate") and tokens[i + 1 : i + 2] == ["launch"])
        ),
        None,
    )
    if launch is None:
        return None
    for i, token in enumerate(tokens[launch:], launch):
        if token in ("--config_file", "--config-file") and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(("--config_file=", "--config-file=")):
            return token.split("=", 1)[1]
    return None


_YAML_SCALAR = re.compile(
    r"^(?P<head>[ \t]*(?P<key>[A-Za-z_][\w-]*):[ \t]*)"
    r"(?P<value>[^\s#'\"{\[][^#]*?)[ \t]*$"
)
"""A ``key: value`` line of the block YAML ``accelerate config`` writes (``yaml.safe_dump``):
its DeepSpeed plugin keys sit two spaces in, under ``deepspeed_config:``."""


def _patch_accelerate_config(
    path: str, arguments: Mapping[str, str], out_dir: str
) -> tuple[str | None, list[str]]:
    """Set in a copy of the accelerate config at ``path`` every key that names the same
    setting as an argument of the fix: accelerate passes them to DeepSpeed, and transformers
    refuses a run whose TrainingArguments contradict them (``gradient_accumulation_steps: 1``
    pinned there while the script asks for 4).  The copy's path (None when nothing changed)
    and notes."""
    try:
        with open(path, encoding="utf-8", newline="") as text:  # its line endings kept
            lines = text.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as exc:
        return None, [
            f"the accelerate config {path} could not be read ({exc}): set the fix's values "
            "there too (a value it pins must match the script's)"
        ]
    changed: list[str] = []
    for i, line in enumerate(lines):
        match = _YAML_SCALAR.match(line.rstrip("\r\n"))
        if match is None:
            continue
        flag = next((f for f in arguments if _same_setting(f, match["key"])), None)
        if flag is None:
            continue
        updated = _relative(arguments[flag], match["value"])
        if updated is None or updated == match["value"]:
            continue
        ending = line[len(line.rstrip("\r\n")) :]
        lines[i] = match["head"] + updated + ending
        changed.append(f"{match['key']}: {match['value']} -> {updated}")
    if not changed:
        return None, []
    written = _write(out_dir, "accelerate_config.yaml", "".join(lines))
    return written, [
        f"the accelerate config {path} pins what the fix changes: {written} sets "
        + "; ".join(changed)
        + " (the script's own arguments must say the same: transformers refuses a mismatch)"
    ]


def _write(out_dir: str, name: str, text: str) -> str:
    """``text`` written as ``out_dir/name`` (UTF-8; a name's undecodable bytes kept as they
    were); the path, or ``UsageError`` when it cannot be written."""
    path = os.path.join(out_dir, name)
    try:
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as out:
            out.write(text)
    except OSError as exc:
        raise UsageError(f"--write {out_dir}: cannot write {name} ({exc.strerror or exc})") from exc
    return path
