"""Logs in an envelope (UTF-16, kubectl --timestamps, CRI files, Docker json-file, JSON lines)
are read as the log they carry.

The carried logs are real runs of the crash corpus (a GPU OOM under torchrun, a host OOM kill
under the DeepSpeed launcher), wrapped by code the way each tool wraps lines, read at paste size
and, behind the steps of a healthy run, above ``LINE_BY_LINE_BYTES`` (the bulk scan).  Read
through its envelope, a log must give the facts its plain text gives.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from oomlens.facts.log import LogFacts
from oomlens.ingest.detect import detect_kind
from oomlens.ingest.envelope import Envelope, sniff_envelopes, unwrap
from oomlens.ingest.log import read_log
from oomlens.ingest.log.reader import LINE_BY_LINE_BYTES
from oomlens.ingest.textstream import open_text
from oomlens.session import AnalysisOptions, analyze

CRASH = Path(__file__).resolve().parents[2] / "fixtures" / "crash_logs"
CARRIED = {
    "gpu_oom": CRASH / "activation_memory" / "train.log",
    "host_kill": CRASH / "checkpoint_save_host_oom" / "train.log",
}
VERDICTS = {"gpu_oom": "gpu_oom", "host_kill": "host_oom"}
_START = datetime(2025, 3, 14, 9, 26, 53)


def _stamp(i: int) -> str:
    """Go's RFC3339Nano: trailing zeros of the fraction dropped, and the dot with them."""
    fraction = f"{(i * 1_234_567) % 1_000_000_000:09d}".rstrip("0")
    when = (_START + timedelta(seconds=i // 7)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{when}.{fraction}Z" if fraction else f"{when}Z"


def _kubectl(lines: list[str]) -> bytes:
    return "".join(f"{_stamp(i)} {line}\n" for i, line in enumerate(lines)).encode()


def _cri(lines: list[str], part: int = 97) -> bytes:
    """containerd's files: a line over the runtime's buffer goes in ``P`` parts and a last
    ``F``; parts small here so that every long line of a real log is split."""
    out = []
    for i, line in enumerate(lines):
        pieces = [line[j : j + part] for j in range(0, len(line), part)] or [""]
        for k, piece in enumerate(pieces):
            tag = "F" if k == len(pieces) - 1 else "P"
            out.append(f"{_stamp(i)} {'stderr' if i % 3 else 'stdout'} {tag} {piece}\n")
    return "".join(out).encode()


def _docker(lines: list[str], part: int = 89) -> bytes:
    """json-file: one entry per line, split like Docker splits lines over its buffer."""
    out = []
    for i, line in enumerate(lines):
        text = line + "\n"
        for j in range(0, len(text), part):
            entry = {"log": text[j : j + part], "stream": "stderr", "time": _stamp(i)}
            out.append(json.dumps(entry, separators=(",", ":")) + "\n")
    return "".join(out).encode()


def _json_lines(lines: list[str]) -> bytes:
    """A structured logger's records (zap/logrus ``msg``, python-json-logger ``message``,
    loguru ``text``), with commas in every line, the shape a CSV sniffer takes for a table."""
    keys = ("msg", "message", "text")
    records = [
        {"ts": _stamp(i), "level": "info", keys[i % 3]: line, "caller": "train.py:81"}
        for i, line in enumerate(lines)
    ]
    return "".join(
        json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(records)
    ).encode()


def _utf16(data: bytes, codec: str, bom: bool) -> bytes:
    text = data.decode("utf-8")
    return (("\ufeff" if bom else "") + text).encode(codec)


def _holey_utf16(lines: list[str]) -> bytes:
    """UTF-16 without a mark, with holes of zeros where a crashed writer left them: one longer
    than the sniffed head at the start, one of an odd count of characters before a line."""
    text = "".join(line + "\n" for line in lines)
    middle = text.index("\n", len(text) // 2) + 1
    holey = "\x00" * 150_001 + text[:middle] + "\x00" * 3_001 + text[middle:]
    return holey.encode("utf-16-le")


WRAP: dict[str, Callable[[list[str]], bytes]] = {
    "kubectl_timestamps": _kubectl,
    "cri_file": _cri,
    "docker_json_file": _docker,
    "json_lines": _json_lines,
    "powershell_utf16le_bom": lambda lines: _utf16(_plain(lines), "utf-16-le", True),
    "utf16le_no_bom": lambda lines: _utf16(_plain(lines), "utf-16-le", False),
    "utf16be_bom": lambda lines: _utf16(_plain(lines), "utf-16-be", True),
    "utf16_of_kubectl": lambda lines: _utf16(_kubectl(lines), "utf-16-le", True),
    "utf16le_no_bom_with_holes": _holey_utf16,
    "cri_of_json_lines": lambda lines: _cri(_json_lines(lines).decode().splitlines()),
}


def _plain(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _carried(case: str, size: str) -> list[str]:
    lines = CARRIED[case].read_text(encoding="utf-8").splitlines()
    if size == "paste":
        return lines
    steps: list[str] = []
    total = 0
    while total < LINE_BY_LINE_BYTES:
        line = f"step {len(steps) + 1}/9000 loss 10.{len(steps) % 9973:04d} (1.4s)"
        steps.append(line)
        total += len(line) + 1
    return steps + lines


def _facts(log: LogFacts) -> tuple[object, ...]:
    return (
        [(e.source.line, e.source.rank, e.message.text) for e in log.oom_events],
        [(s.source.line, s.kind) for s in log.fatal_signals],
        [(e.source.line, e.return_code) for e in log.launcher_exits],
        [(k.source.line, k.pid) for k in log.killed_subprocesses],
        [(e.source.line, e.exception_class) for e in log.exceptions],
        log.ranks_seen,
        log.lines,
    )


@pytest.mark.parametrize("size", ["paste", "bulk"])
@pytest.mark.parametrize("case", sorted(CARRIED))
@pytest.mark.parametrize("wrap", sorted(WRAP))
def test_an_enveloped_log_reads_as_the_log_it_carries(
    tmp_path: Path, wrap: str, case: str, size: str
) -> None:
    lines = _carried(case, size)
    plain = tmp_path / "plain.log"
    plain.write_bytes(_plain(lines))
    wrapped = tmp_path / "wrapped.log"
    wrapped.write_bytes(WRAP[wrap](lines))
    for path in (plain, wrapped):
        assert (path.stat().st_size > LINE_BY_LINE_BYTES) is (size == "bulk")
    assert detect_kind(wrapped).kind_id == "training_log"
    expected, got = read_log(plain), read_log(wrapped)
    assert _facts(got) == _facts(expected)
    assert expected.oom_events or expected.launcher_exits  # the crash is there to be found
    assert any(note.startswith("read as the log it carries") for note in got.notes)


@pytest.mark.parametrize("case", sorted(CARRIED))
@pytest.mark.parametrize(
    "wrap", ["kubectl_timestamps", "docker_json_file", "powershell_utf16le_bom"]
)
def test_the_verdict_of_an_enveloped_log(tmp_path: Path, wrap: str, case: str) -> None:
    wrapped = tmp_path / "pod.log"
    wrapped.write_bytes(WRAP[wrap](_carried(case, "paste")))
    report = analyze([str(wrapped)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == VERDICTS[case]


def test_a_traceback_logged_with_a_record_is_read(tmp_path: Path) -> None:
    """python-json-logger and structlog put ``logger.exception``'s traceback in a field of its
    own; the records around it carry the steps."""
    crash = CARRIED["gpu_oom"].read_text().splitlines()
    traceback = "\n".join(
        line.removeprefix("[rank0]: ") for line in crash if line.startswith("[rank0]: ")
    )
    records = [
        {"asctime": _stamp(i), "levelname": "INFO", "message": f"step {i} loss 9.{i}"}
        for i in range(40)
    ]
    records.append(
        {
            "asctime": _stamp(41),
            "levelname": "ERROR",
            "message": "step failed",
            "exc_info": traceback,
        }
    )
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "gpu_oom"


def _chunked(data: bytes, rng: random.Random) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 300)
        yield data[pos : pos + step]
        pos += step


@pytest.mark.parametrize(
    "wrap", ["kubectl_timestamps", "cri_file", "docker_json_file", "json_lines"]
)
def test_unwrapping_does_not_depend_on_how_the_stream_is_cut(wrap: str) -> None:
    data = WRAP[wrap](CARRIED["gpu_oom"].read_text().splitlines())
    envelopes = sniff_envelopes(data[:65536])
    assert envelopes
    whole = b"".join(unwrap(envelopes, iter((data,))))
    rng = random.Random(7)
    for _ in range(5):
        assert b"".join(unwrap(envelopes, _chunked(data, rng))) == whole
    assert whole == _plain(CARRIED["gpu_oom"].read_text().splitlines())


@pytest.mark.parametrize(
    "text",
    [
        # dmesg --time-format iso: a comma before the fraction, an offset
        "2025-03-14T09:26:53,123456+01:00 Out of memory: Killed process 4242 (python)\n" * 3,
        # a torchelastic error file: one JSON object with a 'message' is a document
        json.dumps({"message": "CUDA out of memory", "extraInfo": {"timestamp": "1"}}) + "\n",
        # an oomlens capture file's header and a record
        '{"oomlens_capture": 1, "file": "events"}\n{"t": 1.5, "event": "step", "msg": "x"}\n',
        # a training log whose lines start with an ISO time and no Z (Python logging)
        "2025-03-14 09:26:53,123 INFO step 1\n" * 3,
    ],
)
def test_what_no_envelope_wraps_is_read_as_it_is(tmp_path: Path, text: str) -> None:
    path = tmp_path / "input"
    path.write_text(text)
    source = open_text(path)
    assert source.plain and source.envelopes == ()
    assert b"".join(block.data for block in source.blocks()) == text.encode()


def test_random_bytes_after_a_utf16_mark_are_no_text(tmp_path: Path) -> None:
    rng = random.Random(3)
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\xff\xfe" + bytes(rng.randrange(256) for _ in range(20000)))
    assert open_text(path).plain
    assert detect_kind(path).kind is None


def test_a_cri_file_joins_partial_lines_into_the_one_the_program_wrote(tmp_path: Path) -> None:
    crash = CARRIED["gpu_oom"].read_text().splitlines()
    longest = max(crash, key=len)
    path = tmp_path / "0.log"
    path.write_bytes(_cri(crash, part=50))
    source = open_text(path)
    assert source.envelopes == (Envelope.CRI,)
    assert longest in [text for _, text in source.lines()]


def test_a_cri_file_whose_line_ends_became_crlf_joins_its_parts_without_the_cr(
    tmp_path: Path,
) -> None:
    # a CR before each entry's line end (the file copied through Windows): inside a joined
    # line it would read as a carriage-return redraw and drop the line's start
    crash = CARRIED["gpu_oom"].read_text().splitlines()
    longest = max(crash, key=len)
    path = tmp_path / "0.log"
    path.write_bytes(_cri(crash, part=50).replace(b"\n", b"\r\n"))
    source = open_text(path)
    assert source.envelopes == (Envelope.CRI,)
    assert longest in [text for _, text in source.lines()]
    assert analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False)).verdict.value == (
        "gpu_oom"
    )


def test_utf16_of_a_rich_traceback_is_text(tmp_path: Path) -> None:
    # rich draws its box with U+2500 ("─"), whose low byte is zero: a zero in the half of
    # UTF-16LE that ASCII leaves non-zero, in one character of ten here (rich renders a real
    # exception, with a lab run's OOM message, its frames without their source lines)
    import io

    from rich.console import Console
    from rich.traceback import Traceback

    lab = Path(__file__).resolve().parents[1] / "assets" / "logs" / "lab_log_torch2.11_h200.txt"
    line = next(x for x in lab.read_text().splitlines() if "CUDA out of memory" in x)
    message = line[line.index("CUDA out of memory") :]

    def step() -> None:
        raise RuntimeError(message)

    console = Console(file=io.StringIO(), width=100, color_system=None)
    try:
        step()
    except RuntimeError:
        console.print(Traceback(extra_lines=0))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\u2500" * 20 in text
    path = tmp_path / "train.log"
    path.write_bytes(text.encode("utf-16-le"))  # no mark, as some Windows tools write it
    assert detect_kind(path).kind_id == "training_log"
    report = analyze([str(path)], options=AnalysisOptions(prefer_deepspeed=False))
    assert report.verdict.value == "gpu_oom"
