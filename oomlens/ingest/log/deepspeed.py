"""Parse DeepSpeed's log lines: logger records, ``see_memory_usage``, cache-flush warnings,
the config dump, the batch-size assertion, launcher lines and the world size.

Pure functions over one line of text (prefixes already stripped), plus ``ConfigDumpCollector``
which gathers the multi-line startup dump.  Formats (DeepSpeed 0.5 to 0.19, see the reference
notes, section 1):

* logger: ``[YYYY-mm-dd HH:MM:SS,mmm] [LEVEL] [file.py:N:func] message``; ``log_dist`` adds
  ``[Rank N] `` to the message;
* ``see_memory_usage``: a label line, ``MA 0.72 GB         Max_MA 2.02 GB         CA 0.73 GB
  Max_CA 2 GB `` and ``CPU Virtual Memory:  used = 12.3 GB, percent = 10.2%``, with the
  logger prefix up to 0.18.2 and plain ``print`` since 0.18.3 (``GB`` means GiB);
* ``N pytorch allocator cache flushes since last step``;
* ``DeepSpeedEngine configuration:`` then ``  key ....... value`` lines then
  ``  json = {`` ... ``}`` (unprefixed continuation lines);
* ``Check batch related parameters. ... A != B * C * D`` (``world_sizeA`` before DS PR 1734);
* launcher ``exits with return code = N``, ``Killing subprocess N``,
  ``process N spawned with command: [...]``, ``WORLD INFO DICT: {...}``,
  ``dist_world_size=N``; config ``Config mesh_device ... world_size = N``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from oomlens.lazyregex import lazy_regex

MEMORY_ANCHORS: tuple[bytes, ...] = (b"Max_MA ",)
CPU_ANCHORS: tuple[bytes, ...] = (b"CPU Virtual Memory",)
FLUSH_ANCHORS: tuple[bytes, ...] = (b"cache flushes since last step",)
CONFIG_DUMP_ANCHORS: tuple[bytes, ...] = (b"DeepSpeedEngine configuration",)
BATCH_ANCHORS: tuple[bytes, ...] = (b"Check batch related parameters",)
CONFIG_ERROR_ANCHORS: tuple[bytes, ...] = (
    b"is not defined",
    b"needs to be provided",
    b"mismatch TrainingArguments",
    b"Maximum supported ZeRO stage",
    b"has to be greater than 0",
    b"must be divisible by micro-batch",
)
LAUNCHER_ANCHORS: tuple[bytes, ...] = (
    b"exits with return code",
    b"Killing subprocess",
    b"spawned with command",
)
WORLD_ANCHORS: tuple[bytes, ...] = (b"WORLD INFO DICT", b"world_size")
ANCHORS: tuple[bytes, ...] = (
    MEMORY_ANCHORS
    + CPU_ANCHORS
    + FLUSH_ANCHORS
    + CONFIG_DUMP_ANCHORS
    + BATCH_ANCHORS
    + CONFIG_ERROR_ANCHORS
    + LAUNCHER_ANCHORS
    + WORLD_ANCHORS
)
"""Literals one of which every line these parsers understand contains, by kind."""

_GIB = 1024**3

_LOGGER = lazy_regex(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[(?P<level>[A-Z]{1,10})\] "
    r"\[(?P<file>[^\]:\n]{1,120}):(?P<lineno>\d{1,7}):(?P<func>[^\]\n]{1,120})\] ?"
)
_RANK_TAG = lazy_regex(r"\[Rank (?P<rank>-?\d{1,6})\] ")
_MEMORY = lazy_regex(
    r"MA (?P<ma>\d{1,9}(?:\.\d{1,6})?) GB\s{1,40}Max_MA (?P<max_ma>\d{1,9}(?:\.\d{1,6})?) GB\s{1,"
    r"40}"
    r"CA (?P<ca>\d{1,9}(?:\.\d{1,6})?) GB\s{1,40}Max_CA (?P<max_ca>\d{1,9}(?:\.\d{1,6})?) GB"
)
_CPU = lazy_regex(
    r"CPU Virtual Memory:\s{1,10}used = (?P<used>\d{1,9}(?:\.\d{1,6})?) GB, percent = (?P<pct>\d{"
    r"1,3}(?:\.\d{1,6})?)%"
)
_CACHE_FLUSH = lazy_regex(r"(?P<n>\d{1,12}) pytorch allocator cache flushes since last step")
_BATCH = lazy_regex(
    r"Check batch related parameters\. train_batch_size is not equal to micro_batch_per_gpu \* "
    r"gradient_acc_step \* world_size ?(?P<tb>[\d.]{1,20}) != (?P<mb>[\d.]{1,20}) \* (?P<ga>[\d.]"
    r"{1,20}) \* (?P<ws>[\d.]{1,20})"
)
_CONFIG_ERRORS = lazy_regex(
    r"DeepSpeedConfig: \w{1,60} is not defined|Either train_batch_size or train_micro_batch_size_"
    r"per_gpu "
    r"needs to be provided|Please correct the following DeepSpeed config values that mismatch "
    r"TrainingArguments values|Maximum supported ZeRO stage is \d|Train batch size: [\d.]{1,20} h"
    r"as to be greater than 0|"
    r"Micro batch size per gpu: [\d.]{1,20} has to be greater than 0|Gradient accumulation steps:"
    r" [\d.]{1,20} has to be greater than 0|"
    r"Train batch size must be divisible by micro-batch data parallelism"
)
_EXIT = lazy_regex(r"exits with return code = (?P<rc>-?\d{1,6})")
_CMD_LOCAL_RANK = lazy_regex(r"--local_rank=(?P<lr>\d{1,6})")
_KILLING = lazy_regex(r"Killing subprocess (?P<pid>\d{1,10})")
_SPAWNED = lazy_regex(r"process (?P<pid>\d{1,10}) spawned with command: ")
_WORLD_INFO = lazy_regex(r"WORLD INFO DICT: (?P<dict>\{.{0,20000}\})")
_DIST_WORLD = lazy_regex(r"dist_world_size=(?P<n>\d{1,7})")
_CONFIG_WORLD = lazy_regex(
    r"Config mesh_device \S{1,200} world_size = (?P<n>\d{1,7}(?:\.\d{1,4})?)"
)
_DUMP_ENTRY = lazy_regex(r"  (?P<key>[A-Za-z_][\w]{0,80}) (?:\.{1,40} |\s)(?P<value>.*)")
_INT_LIST = lazy_regex(r"\[(?P<items>[\d,\s]{0,20000})\]")


@dataclass(frozen=True, slots=True)
class LoggerRecord:
    """A DeepSpeed logger line, split: time, level, emitting ``file:line:func``, message
    (``[Rank N] `` removed and kept as ``rank``)."""

    timestamp: datetime
    level: str
    filename: str
    lineno: int
    function: str
    message: str
    rank: int | None


def parse_logger_line(text: str) -> LoggerRecord | None:
    match = _LOGGER.match(text)
    if match is None:
        return None
    message = text[match.end() :]
    rank = None
    tag = _RANK_TAG.match(message)
    if tag is not None:
        rank = int(tag.group("rank"))
        message = message[tag.end() :]
        if rank < 0:
            rank = None
    stamp = match.group("ts")
    try:
        when = datetime(
            int(stamp[0:4]),
            int(stamp[5:7]),
            int(stamp[8:10]),
            int(stamp[11:13]),
            int(stamp[14:16]),
            int(stamp[17:19]),
            int(stamp[20:23]) * 1000,
        )
    except ValueError:
        return None
    return LoggerRecord(
        timestamp=when,
        level=match.group("level"),
        filename=match.group("file"),
        lineno=int(match.group("lineno")),
        function=match.group("func"),
        message=message,
        rank=rank,
    )


def strip_logger(text: str) -> str:
    """The message of a logger line (``text`` itself when it is not one)."""
    match = _LOGGER.match(text)
    return text[match.end() :] if match else text


@dataclass(frozen=True, slots=True)
class MemoryReading:
    allocated: int
    max_allocated: int
    reserved: int
    max_reserved: int


def _gib(value: str) -> int:
    return round(float(value) * _GIB)


def parse_memory_line(text: str) -> MemoryReading | None:
    """``MA x GB  Max_MA x GB  CA x GB  Max_CA x GB`` in bytes."""
    match = _MEMORY.search(text)
    if match is None:
        return None
    return MemoryReading(
        _gib(match.group("ma")),
        _gib(match.group("max_ma")),
        _gib(match.group("ca")),
        _gib(match.group("max_ca")),
    )


def parse_cpu_line(text: str) -> tuple[int, float] | None:
    """``CPU Virtual Memory:  used = x GB, percent = y%`` as (bytes used, percent)."""
    match = _CPU.search(text)
    if match is None:
        return None
    return _gib(match.group("used")), float(match.group("pct"))


def parse_cache_flush(text: str) -> int | None:
    match = _CACHE_FLUSH.search(text)
    return int(match.group("n")) if match else None


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


@dataclass(frozen=True, slots=True)
class BatchNumbers:
    train_batch_size: int | float
    micro_batch_per_gpu: int | float
    gradient_accumulation_steps: int | float
    world_size: int | float


def parse_batch_assertion(text: str) -> BatchNumbers | None:
    match = _BATCH.search(text)
    if match is None:
        return None
    return BatchNumbers(
        _number(match.group("tb")),
        _number(match.group("mb")),
        _number(match.group("ga")),
        _number(match.group("ws")),
    )


def parse_config_error(text: str) -> str | None:
    """The text of another DeepSpeed config rejection, if the line holds one."""
    match = _CONFIG_ERRORS.search(text)
    return text[match.start() : match.start() + 500] if match else None


@dataclass(frozen=True, slots=True)
class LauncherLine:
    """One DeepSpeed launcher line: ``kind`` is ``exit`` (return code), ``killing`` (pid),
    ``spawned`` (pid and local rank)."""

    kind: str
    return_code: int | None = None
    pid: int | None = None
    local_rank: int | None = None


def parse_launcher_line(text: str) -> LauncherLine | None:
    match = _EXIT.search(text)
    if match is not None:
        local = _CMD_LOCAL_RANK.search(text, 0, match.start())
        return LauncherLine(
            "exit",
            return_code=int(match.group("rc")),
            local_rank=int(local.group("lr")) if local else None,
        )
    match = _KILLING.search(text)
    if match is not None:
        return LauncherLine("killing", pid=int(match.group("pid")))
    match = _SPAWNED.search(text)
    if match is not None:
        local = _CMD_LOCAL_RANK.search(text, match.end())
        return LauncherLine(
            "spawned",
            pid=int(match.group("pid")),
            local_rank=int(local.group("lr")) if local else None,
        )
    return None


def parse_world_size(text: str) -> tuple[int | float, str] | None:
    """``(world size, origin)`` from a launcher or config line; see ``WorldSize``."""
    match = _WORLD_INFO.search(text)
    if match is not None:
        total = 0
        for items in _INT_LIST.finditer(match.group("dict")):
            total += len([item for item in items.group("items").split(",") if item.strip()])
        return (total, "world_info") if total else None
    match = _DIST_WORLD.search(text)
    if match is not None:
        return int(match.group("n")), "dist_world_size"
    match = _CONFIG_WORLD.search(text)
    if match is not None:
        return _number(match.group("n")), "config"
    return None


MAX_DUMP_ENTRIES = 400
MAX_DUMP_VALUE_CHARS = 4000
MAX_DUMP_JSON_CHARS = 256 * 1024
MAX_DUMP_JSON_LINES = 5000


class ConfigDumpCollector:
    """Gathers the ``DeepSpeedEngine configuration:`` dump from the lines that follow it.

    Feed every line of the dumping stream (prefixes stripped); ``feed`` returns False when
    the dump has ended (that line is not part of it).  Entries are logger lines whose
    message is ``  key ..... value``; multi-line JSON values and the ``json = {`` block
    continue on unprefixed lines.  Bounded in entries and characters.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []
        self.json_lines: list[str] | None = None
        self.json_chars = 0
        self.json_closed = False
        self.complete = False
        self.overflow = False
        self._open_value = 0  # depth of a multi-line {...} value being continued

    def feed(self, text: str) -> bool:
        if self.json_lines is not None:
            if self.json_chars < MAX_DUMP_JSON_CHARS and len(self.json_lines) < MAX_DUMP_JSON_LINES:
                self.json_lines.append(text)
                self.json_chars += len(text) + 1
            else:
                self.overflow = True
            if text.rstrip() == "}":
                self.json_closed = True
                self.complete = not self.overflow
                return False
            return True
        message = strip_logger(text)
        is_record = message is not text
        if is_record and message.startswith("  json = "):
            self.json_lines = [message[len("  json = ") :]]
            self.json_chars = len(self.json_lines[0])
            if self.json_lines[0].strip() in ("{}", ""):
                self.complete = True
                return False
            return True
        if is_record:
            entry = _DUMP_ENTRY.match(message)
            if entry is None:
                return False
            self._open_value = entry.group("value").count("{") - entry.group("value").count("}")
            if len(self.entries) < MAX_DUMP_ENTRIES:
                self.entries.append(
                    (entry.group("key"), entry.group("value")[:MAX_DUMP_VALUE_CHARS])
                )
            else:
                self.overflow = True
            return True
        if self._open_value > 0 and self.entries:
            key, value = self.entries[-1]
            if len(value) < MAX_DUMP_VALUE_CHARS:
                self.entries[-1] = (key, (value + "\n" + text)[:MAX_DUMP_VALUE_CHARS])
            self._open_value += text.count("{") - text.count("}")
            return True
        return False

    @property
    def json_text(self) -> str | None:
        return "\n".join(self.json_lines) if self.json_lines is not None else None
