"""``PYTORCH_CUDA_ALLOC_CONF`` as torch 2.11 parses it, and the settings a snapshot recorded.

:func:`parse_alloc_conf` reads a config string the way torch 2.11's two parsers do between
them (``c10::CachingAllocator::AcceleratorAllocatorConfig::parseArgs`` for the device-generic
keys, ``CUDAAllocatorConfig::parseArgs`` for the CUDA ones):

* the string is cut into tokens at ``,`` ``:`` ``[`` ``]`` (each its own token), whitespace is
  dropped, the rest are words; the tokens must read ``key:value`` (or ``key:[a:b,c:d]``)
  separated by commas;
* ``max_split_size_mb`` / ``max_non_split_rounding_mb``: an integer number of MiB, at least 20
  ("... too small, must be >= 20"); ``garbage_collection_threshold``: a number strictly between
  0 and 1; ``expandable_segments``: exactly ``True`` or ``False``;
* ``roundup_power2_divisions``: either one power of two for every size interval, or a list of
  ``MiB:divisions`` pairs whose first entry also fills the intervals below it, with ``>:N``
  filling every interval above the last one named (16 intervals, [1 MiB, 2 MiB) ... [32 GiB, inf));
* a key neither parser knows is refused with torch's "Unrecognized key" message; keys that do
  not change how device memory is laid out (pinned-memory options, ``release_lock_on_cudamalloc``
  ...) are accepted and listed in :attr:`AllocConf.inert`.

Each call starts from torch's defaults, as a fresh process reading its environment does.  A
string torch would refuse raises :class:`AllocConfError` with the message torch gives.

:func:`recorded_conf` turns the ``allocator_settings`` table a snapshot stores (torch >= 2.3;
2.11 keeps the parsed values, including the roundup table) into the same :class:`AllocConf`.
The table wins over the raw string it also stores: it is what the allocator was using.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from oomlens.facts.snapshot import AllocatorSettings

MiB = 1024**2
SIZE_T_MAX = 2**64 - 1
ROUNDUP_INTERVALS = 16
"""``roundup_power2_divisions`` intervals: [1 MiB, 2 MiB), [2, 4) ... [32 GiB, inf)."""
DEFAULT_LARGE_SEGMENT = 20 * MiB
"""``kLargeBuffer``: the segment for 1-10 MiB requests, the large expandable page, and the
default reuse tolerance of oversize blocks (``max_non_split_rounding_mb``)."""

# Keys torch 2.11 accepts.  The device-generic parser's keys:
_LAYOUT_KEYS = frozenset(
    {
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "expandable_segments",
        "large_segment_size_mb",
    }
)
# Keys accepted that do not change where device blocks go.
_INERT_KEYS = frozenset(
    {
        "pinned_use_background_threads",
        "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "pinned_num_register_threads",
        "pinned_reserve_segment_size_mb",
        "graph_capture_record_stream_reuse",
    }
)
# Accepted by torch, but outside what the model can replay.
_UNMODELLED_KEYS = frozenset({"backend", "per_process_memory_fraction"})
KNOWN_KEYS = _LAYOUT_KEYS | _INERT_KEYS | _UNMODELLED_KEYS


class AllocConfError(ValueError):
    """A config string torch would refuse (the message is torch's), or one the model cannot
    replay (``backend:cudaMallocAsync``, ``per_process_memory_fraction``)."""


@dataclass(frozen=True, slots=True)
class AllocConf:
    """The caching-allocator settings that decide where blocks go.

    ``max_split_size`` is None when unlimited (torch's default: every block may be split).
    ``roundup_power2_divisions`` holds the 16 division counts by interval (0 or 1: plain
    512-byte rounding).  ``garbage_collection_threshold`` is 0.0 when off.  ``text`` is the
    config string as given (``""`` for torch's defaults); ``inert`` the accepted keys that
    change nothing here.
    """

    text: str = ""
    expandable_segments: bool = False
    max_split_size: int | None = None
    max_non_split_rounding: int = DEFAULT_LARGE_SEGMENT
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    large_segment_size: int = DEFAULT_LARGE_SEGMENT
    inert: tuple[str, ...] = ()

    def describe(self) -> str:
        """The settings in ``PYTORCH_CUDA_ALLOC_CONF`` form; ``torch defaults`` when none."""
        return self.canonical() or "torch defaults"

    def canonical(self) -> str:
        """The non-default settings as a config string torch accepts (``""`` for defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding != DEFAULT_LARGE_SEGMENT:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if any(value > 1 for value in self.roundup_power2_divisions):
            pairs = ",".join(
                f"{1 << index}:{value}" for index, value in enumerate(self.roundup_power2_divisions)
            )
            parts.append(f"roundup_power2_divisions:[{pairs}]")
        if self.large_segment_size != DEFAULT_LARGE_SEGMENT:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
        return ",".join(parts)

    def with_text(self, text: str) -> AllocConf:
        return replace(self, text=text)


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    word: list[str] = []
    for char in text:
        if char in ",:[]":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(char)
        elif not char.isspace():
            word.append(char)
    if word:
        tokens.append("".join(word))
    return tokens


_LEADING_UINT = re.compile(r"[+-]?\d+")
_LEADING_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class _Reader:
    """Walks the tokens as torch's ``ConfigTokenizer`` does (``checkToken``, ``toSizeT`` ...)."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)

    def at(self, index: int) -> str:
        if index >= len(self.tokens):
            raise AllocConfError(
                f"the allocator config ends after {self.tokens[-1]!r} where a value is expected"
                if self.tokens
                else "the allocator config is empty where a value is expected"
            )
        return self.tokens[index]

    def expect(self, index: int, token: str) -> None:
        found = self.at(index)
        if found != token:
            raise AllocConfError(f"expected {token!r} in the allocator config but found {found!r}")

    def size_t(self, index: int) -> int:
        """``std::stoull``: the leading digits; a leading minus wraps around as in C++."""
        token = self.at(index)
        match = _LEADING_UINT.match(token)
        if match is None:
            raise AllocConfError(f"expected a number in the allocator config but found {token!r}")
        value = int(match.group())
        return value % (SIZE_T_MAX + 1)

    def double(self, index: int) -> float:
        token = self.at(index)
        match = _LEADING_FLOAT.match(token)
        if match is None:
            raise AllocConfError(f"expected a number in the allocator config but found {token!r}")
        return float(match.group())

    def boolean(self, index: int) -> bool:
        token = self.at(index)
        if token == "True":
            return True
        if token == "False":
            return False
        raise AllocConfError(
            f"Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{token}'"
        )

    def skip_value(self, index: int) -> int:
        """Index of the last token of the value after the key at ``index`` (``skipKey``)."""
        self.expect(index + 1, ":")
        index += 2
        if self.at(index) != "[":
            return index
        while index + 1 < len(self.tokens) and self.tokens[index + 1] != "]":
            index += 1
        index += 1
        self.at(index)
        return index


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _split_size(reader: _Reader, index: int, key: str) -> int:
    value = reader.size_t(index)
    if value < DEFAULT_LARGE_SEGMENT // MiB:
        raise AllocConfError(
            f"CachingAllocator option {key} too small, must be >= {DEFAULT_LARGE_SEGMENT // MiB}"
        )
    return min(value, SIZE_T_MAX // MiB) * MiB


def _roundup(reader: _Reader, index: int) -> tuple[tuple[int, ...], int]:
    table = [0] * ROUNDUP_INTERVALS
    if reader.at(index) != "[":
        value = reader.size_t(index)
        if not _is_power_of_two(value):
            raise AllocConfError("For roundups, the divisions has to be power of 2 ")
        return (value,) * ROUNDUP_INTERVALS, index
    first = True
    last_index = 0
    while index + 1 < len(reader.tokens) and reader.tokens[index + 1] != "]":
        index += 1
        boundary_token = reader.at(index)
        reader.expect(index + 1, ":")
        value = reader.size_t(index + 2)
        index += 2
        if value != 0 and not _is_power_of_two(value):
            raise AllocConfError(
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
            )
        if boundary_token == ">":
            for position in range(last_index + 1, ROUNDUP_INTERVALS):
                table[position] = value
        else:
            boundary = reader.size_t(index - 2)
            if not _is_power_of_two(boundary):
                raise AllocConfError("For roundups, the intervals have to be power of 2 ")
            position = min(boundary.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for below in range(position):
                    table[below] = value
                first = False
            table[position] = value
            last_index = position
        if reader.at(index + 1) != "]":
            reader.expect(index + 1, ",")
            index += 1
    index += 1
    reader.expect(index, "]")
    return tuple(table), index


def parse_alloc_conf(text: str) -> AllocConf:
    """Parse ``text`` as torch 2.11 parses ``PYTORCH_CUDA_ALLOC_CONF``; see the module docstring.

    Raises :class:`AllocConfError` (torch's own wording where torch refuses the string).
    """
    reader = _Reader(text)
    conf = AllocConf(text=text)
    inert: list[str] = []
    index = 0
    tokens = reader.tokens
    while index < len(tokens):
        key = tokens[index]
        if key not in KNOWN_KEYS:
            raise AllocConfError(f"Unrecognized key '{key}' in CUDA allocator config.")
        if key == "expandable_segments":
            reader.expect(index + 1, ":")
            index += 2
            conf = replace(conf, expandable_segments=reader.boolean(index))
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb"):
            reader.expect(index + 1, ":")
            index += 2
            size = _split_size(reader, index, key)
            if key == "max_split_size_mb":
                conf = replace(conf, max_split_size=size)
            elif key == "max_non_split_rounding_mb":
                conf = replace(conf, max_non_split_rounding=size)
            else:
                conf = replace(conf, large_segment_size=size)
        elif key == "garbage_collection_threshold":
            reader.expect(index + 1, ":")
            index += 2
            threshold = reader.double(index)
            if not 0.0 < threshold < 1.0:
                raise AllocConfError("garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
            conf = replace(conf, garbage_collection_threshold=threshold)
        elif key == "roundup_power2_divisions":
            reader.expect(index + 1, ":")
            table, index = _roundup(reader, index + 2)
            conf = replace(conf, roundup_power2_divisions=table)
        elif key == "backend":
            reader.expect(index + 1, ":")
            index += 2
            backend = reader.at(index)
            if backend not in ("native", "cudaMallocAsync"):
                raise AllocConfError(
                    "Unknown allocator backend, options are native and cudaMallocAsync"
                )
            if backend == "cudaMallocAsync":
                raise AllocConfError(
                    "backend:cudaMallocAsync replaces the caching allocator this replay models "
                    "(it keeps no segments and records no history)"
                )
        elif key == "per_process_memory_fraction":
            raise AllocConfError(
                "per_process_memory_fraction is a memory limit, not a layout setting: give the "
                "limit with --allowed instead"
            )
        else:
            index = reader.skip_value(index)
            inert.append(key)
        if index + 1 < len(tokens):
            reader.expect(index + 1, ",")
            index += 1
        index += 1
    return replace(conf, inert=tuple(inert))


def recorded_conf(settings: AllocatorSettings | None) -> tuple[AllocConf, tuple[str, ...]]:
    """The settings a snapshot recorded, and remarks on what had to be assumed.

    Without an ``allocator_settings`` table (torch < 2.3) torch's defaults are assumed, unless
    the raw config string alone can be parsed.  ``max_non_split_rounding_mb`` is not in 2.11's
    table: it is read from the raw string when set there.
    """
    if settings is None:
        return AllocConf(), ("the snapshot records no allocator settings: torch defaults assumed",)
    notes: list[str] = []
    from_text = AllocConf(text=settings.raw_config)
    try:
        from_text = parse_alloc_conf(settings.raw_config)
    except AllocConfError as err:
        notes.append(f"the recorded config string does not parse as torch 2.11's: {err}")
    table = [0] * ROUNDUP_INTERVALS
    for lower_mib, divisions in settings.roundup_power2_divisions:
        if lower_mib > 0 and divisions > 0:
            position = lower_mib.bit_length() - 1
            if 0 <= position < ROUNDUP_INTERVALS:
                table[position] = divisions
    expandable = settings.expandable_segments
    threshold = settings.garbage_collection_threshold
    conf = replace(
        from_text,
        expandable_segments=from_text.expandable_segments if expandable is None else expandable,
        max_split_size=settings.max_split_size,
        garbage_collection_threshold=from_text.garbage_collection_threshold
        if threshold is None
        else threshold,
        roundup_power2_divisions=tuple(table)
        if settings.roundup_power2_divisions
        else from_text.roundup_power2_divisions,
    )
    try:
        parse_alloc_conf(conf.canonical())
    except AllocConfError as err:
        # a damaged snapshot: a setting no run of torch could have had
        notes.append(f"the recorded settings table holds what torch refuses ({err}): ignored")
        try:
            parse_alloc_conf(from_text.canonical())
        except AllocConfError:
            return AllocConf(), (*notes, "torch defaults assumed")
        return from_text, tuple(notes)
    return conf, tuple(notes)
