"""Read a DeepSpeed config the way DeepSpeed 0.19.8 reads it: from a file, or from the
configuration dump DeepSpeed prints at startup.

Files.  DeepSpeed loads a path with ``hjson.load(open(path), object_pairs_hook=
dict_raise_error_on_duplicate_keys)``.  ``read_ds_config`` accepts JSON with comments and
trailing commas itself (with the line of every key), gives numbers the values hjson gives
(``5e8`` -> int), rejects duplicate keys, and hands anything else to the ``hjson`` module when it
is installed (it comes with the ``deepspeed`` extra).  Bad input is an ``InputError`` naming the
file, line and column.

Resolving a file's settings to the values DeepSpeed uses (defaults, aliases, ``"auto"``) is
analysis: ``oomlens.analysis.ds_resolve``.

Dumps.  At startup rank 0 logs ``DeepSpeedEngine configuration:``, one ``  key ..... value``
line per engine attribute (pydantic reprs for ``zero_config`` and the precision configs), then
``  json = {...}``: the user's config after HF's ``"auto"`` substitution, printed by
``ScientificNotationEncoder`` (numbers above 1e3 as ``5.000000e+08`` - only 7 significant
digits -, lines ending in ``", "``, bare ``inf``/``nan``).  ``ConfigDumpScanner`` finds these
blocks in a stream of log lines; ``ConfigDump.effective`` turns one into an
``EffectiveDsConfig`` whose values are the engine's exact ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from oomlens.errors import InputError, ResourceLimitError
from oomlens.facts import SourceRef
from oomlens.facts.config import (
    BatchSettings,
    ConfigDocument,
    ConfigValue,
    EffectiveDsConfig,
    OffloadOptimizerSettings,
    OffloadParamSettings,
    OptimizerSettings,
    Origin,
    PrecisionSettings,
    ZeroSettings,
    settings_fields,
)
from oomlens.facts.ds_keys import canonical_dtype
from oomlens.facts.ds_schema import (
    BF16,
    FP16,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    ZERO,
    FieldSpec,
    ModelSpec,
    given_key,
)
from oomlens.ingest._jsonpos import DuplicateKeyError, JsonSyntaxError, parse_json_with_positions
from oomlens.ingest._pyrepr import parse_model_repr, parse_scalar
from oomlens.ingest.files import open_regular

#: A ds_config is a few KiB; anything this large is not one.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Lines a dump block may span before the scanner gives up on it (0.19.8 prints ~130).
MAX_DUMP_LINES = 4000
MAX_DUMP_LINE_CHARS = 200_000

_HJSON_HINT = (
    "DeepSpeed reads ds_config files as Hjson (JSON plus comments and trailing commas); "
    "fix the syntax there"
)

# -- documents -------------------------------------------------------------------------------


def parse_ds_config_text(text: str, path: str) -> ConfigDocument:
    """Decode ``text`` as DeepSpeed decodes a config file; ``path`` is only for messages.

    Raises ``InputError`` for bad syntax (with line and column), duplicate keys, a top level
    that is not an object.
    """
    syntax = "json"
    try:
        parsed = parse_json_with_positions(text)
        if _has_comments_or_trailing_commas(text):
            syntax = "json+comments"
        data, key_lines = parsed.value, parsed.key_lines
    except JsonSyntaxError as err:
        data = _try_hjson(text, path, err)
        key_lines = {}
        syntax = "hjson"
    if not isinstance(data, dict):
        raise InputError(
            path,
            f"the top-level value is a {type(data).__name__}, not an object",
            'a ds_config is a JSON object such as {"train_batch_size": 8, ...}',
        )
    return ConfigDocument(path=path, data=data, key_lines=key_lines, syntax=syntax)


def _has_comments_or_trailing_commas(text: str) -> bool:
    return bool(regex.search(r"(?:^|[\s,{\[])(?:#|//|/\*)|,\s*[}\]]", text, timeout=1.0))


def _try_hjson(text: str, path: str, json_error: JsonSyntaxError) -> object:
    """Second chance for Hjson-only syntax, when the hjson module is there; else the
    original error (which has the better position)."""
    if isinstance(json_error, DuplicateKeyError):
        raise InputError(path, str(json_error), "remove one of the two entries") from None
    try:
        import hjson  # type: ignore[import-untyped]
    except ImportError:
        raise InputError(
            path,
            f"not valid JSON: {json_error}",
            _HJSON_HINT + " (install oomlens[deepspeed] to accept other Hjson syntax)",
        ) from None

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result: dict[str, object] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    try:
        return hjson.loads(text, object_pairs_hook=no_duplicates)
    except (ValueError, OverflowError, RecursionError, IndexError):
        raise InputError(path, f"not valid JSON or Hjson: {json_error}", _HJSON_HINT) from None


def read_ds_config(path: str | Path, *, max_bytes: int = MAX_CONFIG_BYTES) -> ConfigDocument:
    """Read a ds_config file.  Raises ``InputError`` when it is missing, unreadable, larger than
    ``max_bytes`` (``ResourceLimitError``), not UTF-8, or not a config DeepSpeed would load."""
    name = str(path)
    try:
        with open_regular(path, display=name, what="a ds_config file") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as err:
        raise InputError(
            name, f"cannot read the file: {err.strerror or err}", "check the path"
        ) from None
    if len(raw) > max_bytes:
        raise ResourceLimitError(
            name,
            f"larger than {max_bytes} bytes, which no ds_config is",
            "pass the ds_config.json file",
        )
    binary = _binary_kind(raw)
    if binary is not None:
        raise InputError(
            name,
            f"{binary}, not a DeepSpeed config",
            "pass the ds_config.json file the run was started with",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(name, f"line {line}: not UTF-8 text", "save the config as UTF-8") from None
    if not text.lstrip("\ufeff").strip():
        # hjson reads nothing as {}, so DeepSpeed would only complain of a missing batch size;
        # an empty file is a failed write or the wrong path, and is said as such.
        raise InputError(
            name,
            "the file is empty" if not raw else "the file holds only white space",
            "pass the ds_config.json file with its settings",
        )
    return parse_ds_config_text(text, name)


def _binary_kind(raw: bytes) -> str | None:
    """What a file that is no text at all holds, told by its first bytes; None for text (a
    config that is merely not UTF-8 is told so by its line)."""
    if raw[:1] == b"\x80" and raw[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle (a memory snapshot?)"
    if raw[:2] == b"\x1f\x8b":
        return "gzip-compressed data"
    if raw[:4] == b"PK\x03\x04":
        return "a zip archive"
    if b"\x00" in raw[:4096] and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16
        return "binary data"
    return None


def document_from_mapping(
    data: Mapping[str, object], path: str = "<config dict>"
) -> ConfigDocument:
    """A config given as a mapping (as HF passes one to ``deepspeed.initialize``)."""
    return ConfigDocument(path=path, data=dict(data), key_lines={}, syntax="mapping")


# -- the startup dump ------------------------------------------------------------------------

_LOGGER_PREFIX = regex.compile(r"^\[[^\]\n]{1,64}\] \[[A-Z]{3,8}\] \[[^\]\n]{1,200}\] ")
_DUMP_HEADER = "DeepSpeedEngine configuration:"
_KEY_LINE = regex.compile(r"^  (?P<key>[A-Za-z_][A-Za-z0-9_]{0,100}) (?:\.{1,40})? ?(?P<value>.*)$")
_JSON_START = "  json = "


def strip_logger_prefix(text: str) -> tuple[str, bool]:
    """``[2026-..] [INFO] [config.py:678:print]   key ... v`` -> (``  key ... v``, True)."""
    match = _LOGGER_PREFIX.match(text, timeout=1.0)
    if match is None:
        return text, False
    return text[match.end() :], True


@dataclass(frozen=True, slots=True)
class ConfigDump:
    """One ``DeepSpeedEngine configuration:`` block from a log.

    ``fields`` maps engine attribute names (``zero_config``, ``train_batch_size``,
    ``world_size``, ...) to their printed text and the line it was on.  ``user_config`` is the
    ``json = {...}`` part (the user's config after HF's ``"auto"`` substitution; numbers above
    1e3 only 7 significant digits precise), None when missing or unreadable.  ``complete`` is
    False when the block was cut (truncated log, interleaved output).  ``problems`` says what
    could not be read.
    """

    header: SourceRef
    fields: Mapping[str, tuple[str, SourceRef]]
    user_config: ConfigDocument | None
    complete: bool
    problems: tuple[str, ...] = ()

    def value_of(self, name: str) -> object:
        """The parsed scalar of an engine line (``train_batch_size`` -> 32), None if absent."""
        entry = self.fields.get(name)
        return None if entry is None else parse_scalar(entry[0])

    def effective(self) -> EffectiveDsConfig:
        """The config the engine ran with, every value ``Origin.LOG_DUMP`` with the line it was
        printed on.  Key paths use the user's spelling where the ``json`` part has the key."""
        return _dump_to_effective(self)


class ConfigDumpScanner:
    """Finds ``DeepSpeedEngine configuration:`` blocks in a stream of log lines.

    Feed it ``(SourceRef, text)`` for each line, in order, with transport prefixes (pdsh
    ``host: ``, torchrun ``[default0]:``) already removed; the DeepSpeed logger prefix may stay.
    ``feed`` returns a finished ``ConfigDump`` when a block closes; call ``finish`` at the end
    for a block cut short.  Memory is bounded by one block (``MAX_DUMP_LINES``).
    """

    def __init__(self) -> None:
        self._block: list[tuple[SourceRef, str]] | None = None
        self._in_json = False

    def feed(self, ref: SourceRef, text: str) -> ConfigDump | None:
        if self._block is None and _DUMP_HEADER not in text:
            return None  # the common case: a line outside any dump, skipped without a regex
        if len(text) > MAX_DUMP_LINE_CHARS:
            text = text[:MAX_DUMP_LINE_CHARS]
        body, _ = strip_logger_prefix(text.rstrip("\r\n"))
        if body.rstrip() == _DUMP_HEADER or body.endswith(" " + _DUMP_HEADER):
            finished = self.finish()
            self._block = [(ref, body)]
            self._in_json = False
            return finished
        if self._block is None:
            return None
        self._block.append((ref, body))
        if body.startswith(_JSON_START):
            self._in_json = True
            if body.rstrip().endswith("}") and body.count("{") == body.count("}"):
                return self.finish()
        elif self._in_json and body.rstrip() == "}":
            return self.finish()
        if len(self._block) >= MAX_DUMP_LINES:
            return self.finish()
        return None

    def finish(self) -> ConfigDump | None:
        block, self._block, self._in_json = self._block, None, False
        if block is None:
            return None
        return parse_config_dump(block)


def scan_log_for_config_dumps(path: str | Path) -> Iterator[ConfigDump]:
    """Every config dump in a log file, streaming (bounded memory).  Raises ``InputError`` when
    the file cannot be read."""
    scanner = ConfigDumpScanner()
    name = str(path)
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                dump = scanner.feed(SourceRef(name, number), raw.decode("utf-8", "replace"))
                if dump is not None:
                    yield dump
    except OSError as err:
        raise InputError(
            name, f"cannot read the file: {err.strerror or err}", "check the path"
        ) from None
    last = scanner.finish()
    if last is not None:
        yield last


def parse_config_dump(lines: Iterable[tuple[SourceRef, str]]) -> ConfigDump:
    """Parse one dump block: the header line, the ``  key .... value`` lines (with the
    unprefixed continuation lines of multi-line values), and the ``  json = {`` part.

    Lines may still carry the DeepSpeed logger prefix.  Never raises on odd content: what
    cannot be read is listed in ``ConfigDump.problems``.
    """
    items = [(ref, strip_logger_prefix(text.rstrip("\r\n"))[0]) for ref, text in lines]
    if not items:
        raise ValueError("empty dump block")
    header = items[0][0]
    fields: dict[str, tuple[str, SourceRef]] = {}
    problems: list[str] = []
    json_lines: list[str] = []
    json_ref: SourceRef | None = None
    json_closed = False
    multiline_open = False
    index = 1
    while index < len(items):
        ref, body = items[index]
        index += 1
        if json_ref is not None:
            json_lines.append(body)
            if body.rstrip() == "}":
                json_closed = True
                break
            continue
        if body.startswith(_JSON_START):
            json_ref = ref
            json_lines.append(body[len(_JSON_START) :])
            if body.rstrip().endswith("}") and body.count("{") == body.count("}"):
                json_closed = True
                break
            continue
        if multiline_open:
            if body.rstrip() == "}":
                multiline_open = False
            continue
        match = _KEY_LINE.match(body, timeout=1.0)
        if match is None:
            continue  # interleaved output from another process
        key, value = match.group("key"), match.group("value")
        fields.setdefault(key, (value, ref))
        if value.rstrip() == "{":
            multiline_open = True
    user_config: ConfigDocument | None = None
    if json_ref is None:
        problems.append(
            "no 'json = {...}' part: the user's config was not printed or the log was cut"
        )
    else:
        text = "\n".join(json_lines)
        try:
            parsed = parse_json_with_positions(text, dump_syntax=True)
        except JsonSyntaxError as err:
            problems.append(
                f"the 'json = {{...}}' part at {json_ref.describe()} is unreadable: {err}"
            )
        else:
            if isinstance(parsed.value, dict):
                base = json_ref.line or 0
                lines_map = (
                    {k: base + v - 1 for k, v in parsed.key_lines.items()} if json_ref.line else {}
                )
                user_config = ConfigDocument(
                    path=json_ref.path, data=parsed.value, key_lines=lines_map, syntax="log_dump"
                )
    if "zero_config" not in fields:
        problems.append("no zero_config line in the dump")
    complete = json_closed and "zero_config" in fields
    return ConfigDump(
        header=header,
        fields=fields,
        user_config=user_config,
        complete=complete,
        problems=tuple(problems),
    )


def _dump_to_effective(dump: ConfigDump) -> EffectiveDsConfig:
    user = dump.user_config
    user_data = user.data if user is not None else {}

    def ref_of(name: str) -> SourceRef | None:
        entry = dump.fields.get(name)
        return entry[1] if entry else None

    zero_entry = dump.fields.get("zero_config")
    zero_fields = parse_model_repr(zero_entry[0]) if zero_entry else {}
    zero_ref = zero_entry[1] if zero_entry else None
    user_zero = (
        user_data.get("zero_optimization")
        if isinstance(user_data.get("zero_optimization"), dict)
        else {}
    )
    assert isinstance(user_zero, dict)

    def dumped(
        spec: ModelSpec,
        values: Mapping[str, object],
        prefix: str,
        user_block: Mapping[str, object],
        ref: SourceRef | None,
    ) -> dict[str, ConfigValue[Any]]:
        out: dict[str, ConfigValue[Any]] = {}
        for fspec in spec.fields:
            key, _ = given_key(fspec, user_block)
            path = f"{prefix}.{key or fspec.json_key}"
            if fspec.name in values:
                value = values[fspec.name]
                note = (
                    "set in the config"
                    if key is not None
                    else "not in the config: DeepSpeed's value"
                )
                out[fspec.name] = ConfigValue(
                    _normalise_dump_value(fspec, value), path, Origin.LOG_DUMP, ref, note
                )
            else:
                out[fspec.name] = ConfigValue(
                    fspec.default,
                    path,
                    Origin.DEFAULT,
                    None,
                    "not printed in the dump: DeepSpeed 0.19.8 default",
                )
        return out

    zvals = dumped(ZERO, zero_fields, "zero_optimization", user_zero, zero_ref)
    offload: dict[str, dict[str, ConfigValue[Any]]] = {}
    for name, spec in (("offload_param", OFFLOAD_PARAM), ("offload_optimizer", OFFLOAD_OPTIMIZER)):
        raw = zero_fields.get(name)
        user_block = user_zero.get(name) if isinstance(user_zero.get(name), dict) else {}
        assert isinstance(user_block, dict)
        if isinstance(raw, dict):
            offload[name] = dumped(spec, raw, f"zero_optimization.{name}", user_block, zero_ref)
        else:
            offload[name] = dumped(
                spec,
                {"device": "none"} if name in zero_fields else {},
                f"zero_optimization.{name}",
                user_block,
                zero_ref,
            )

    fp16_enabled, bf16_enabled, fp16_vals, bf16_vals = _dump_precision(dump)
    batch = BatchSettings(
        train_batch_size=_dump_scalar(dump, "train_batch_size", "train_batch_size"),
        micro_batch_per_gpu=_dump_scalar(
            dump, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu"
        ),
        gradient_accumulation_steps=_dump_scalar(
            dump, "gradient_accumulation_steps", "gradient_accumulation_steps"
        ),
    )
    gad_raw = dump.value_of("grad_accum_dtype")
    cdt_raw = dump.value_of("communication_data_type")
    precision = PrecisionSettings(
        fp16_enabled=fp16_enabled,
        bf16_enabled=bf16_enabled,
        grad_accum_dtype=ConfigValue(
            canonical_dtype(gad_raw),
            "data_types.grad_accum_dtype",
            Origin.LOG_DUMP,
            ref_of("grad_accum_dtype"),
        ),
        communication_data_type=ConfigValue(
            canonical_dtype(cdt_raw),
            "communication_data_type",
            Origin.LOG_DUMP,
            ref_of("communication_data_type"),
        ),
        fp16_master_weights_and_grads=fp16_vals.get(
            "fp16_master_weights_and_grads",
            _default_value(FP16, "fp16_master_weights_and_grads", "fp16"),
        ),
        bf16_master_weights_and_grads=bf16_vals.get(
            "bf16_master_weights_and_grads",
            _default_value(BF16, "bf16_master_weights_and_grads", "bf16"),
        ),
        bf16_optimizer_states=bf16_vals.get(
            "bf16_optimizer_states", _default_value(BF16, "bf16_optimizer_states", "bf16")
        ),
        torch_autocast_enabled=_dump_scalar(
            dump, "torch_autocast_enabled", "torch_autocast.enabled", default=False
        ),
    )
    opt_name = dump.value_of("optimizer_name")
    optimizer = OptimizerSettings(
        type=ConfigValue(
            None if opt_name is None else str(opt_name),
            "optimizer.type",
            Origin.LOG_DUMP,
            ref_of("optimizer_name"),
        ),
        zero_force_ds_cpu_optimizer=_dump_scalar(
            dump, "zero_force_ds_cpu_optimizer", "zero_force_ds_cpu_optimizer", default=True
        ),
    )
    zero = ZeroSettings(
        **{
            name: zvals[name]
            for name in ZeroSettings.__dataclass_fields__
            if name not in ("offload_param", "offload_optimizer")
        },
        offload_param=OffloadParamSettings(
            **settings_fields(offload["offload_param"], OffloadParamSettings)
        ),
        offload_optimizer=OffloadOptimizerSettings(
            **settings_fields(offload["offload_optimizer"], OffloadOptimizerSettings)
        ),
    )
    world = dump.fields.get("world_size")
    return EffectiveDsConfig(
        source=dump.header,
        zero=zero,
        precision=precision,
        batch=batch,
        optimizer=optimizer,
        world_size=ConfigValue(parse_scalar(world[0]), "world_size", Origin.LOG_DUMP, world[1])
        if world
        else None,
        auto_keys=(),
    )


def _default_value(spec: ModelSpec, name: str, prefix: str) -> ConfigValue[Any]:
    fspec = spec.field_named(name)
    return ConfigValue(
        fspec.default, f"{prefix}.{fspec.json_key}", Origin.DEFAULT, None, "not in the dump"
    )


def _normalise_dump_value(fspec: FieldSpec, value: object) -> object:
    if fspec.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if fspec.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if fspec.kind == "device" and isinstance(value, str):
        return value.split(".")[-1]  # OffloadDeviceEnum.cpu -> cpu
    if fspec.kind == "path" and value is not None:
        return str(value)
    return value


def _dump_scalar(
    dump: ConfigDump, name: str, key_path: str, default: object = None
) -> ConfigValue[Any]:
    entry = dump.fields.get(name)
    if entry is None:
        return ConfigValue(default, key_path, Origin.DEFAULT, None, "not in the dump")
    value = parse_scalar(entry[0])
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        value = int(value)
    return ConfigValue(value, key_path, Origin.LOG_DUMP, entry[1])


def _dump_precision(
    dump: ConfigDump,
) -> tuple[
    ConfigValue[Any], ConfigValue[Any], dict[str, ConfigValue[Any]], dict[str, ConfigValue[Any]]
]:
    fp16_vals: dict[str, ConfigValue[Any]] = {}
    bf16_vals: dict[str, ConfigValue[Any]] = {}
    for attr, spec, prefix, out in (
        ("float16_config", FP16, "fp16", fp16_vals),
        ("bfloat16_config", BF16, "bf16", bf16_vals),
    ):
        entry = dump.fields.get(attr)
        if entry is None:
            continue
        parsed = parse_model_repr(entry[0])
        for fspec in spec.fields:
            if fspec.name in parsed:
                out[fspec.name] = ConfigValue(
                    parsed[fspec.name], f"{prefix}.{fspec.json_key}", Origin.LOG_DUMP, entry[1]
                )
    if "enabled" in fp16_vals:
        fp16_enabled = fp16_vals["enabled"]
    else:
        fp16_enabled = _dump_scalar(dump, "fp16_enabled", "fp16.enabled", default=False)
    if "enabled" in bf16_vals:
        bf16_enabled = bf16_vals["enabled"]
    else:
        bf16_enabled = _dump_scalar(dump, "bfloat16_enabled", "bf16.enabled", default=False)
    return fp16_enabled, bf16_enabled, fp16_vals, bf16_vals
