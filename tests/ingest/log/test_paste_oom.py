"""OOM messages as people paste them, every number exact: wrapped at any column (inside words,
numbers and units), cut at their start, quoted, coloured, CRLF, NBSP, full-width, two ranks on
one line.  Each input is a real message of the field corpus or a code transformation of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlens.facts.log import OomKind, OomMessage
from oomlens.ingest.log import read_log
from oomlens.ingest.log.torch_oom import parse_oom_message, parse_oom_messages
from tests.ingest.log._field import expected_numbers, line_with, paste, paste_path

# (case, a substring of its first message's line): pre-2.2, 2.1 ("capacty"), 2.4+ with private
# pools and a "Process N has" clause
MESSAGES = [
    ("deepspeed-3869", "Tried to allocate 978.00 MiB"),
    ("diffusers-8560", "Tried to allocate 48.00 MiB"),
    ("swift-7826", "Tried to allocate 20.00 MiB"),
]


def _message(case: str, needle: str) -> str:
    line = line_with(case, needle)
    return line[line.index("torch.") :]


def _numbers(message: OomMessage) -> dict[str, int | None]:
    return {
        "device": message.device,
        "tried_to_allocate": message.tried_to_allocate,
        "total_capacity": message.total_capacity,
        "free": message.free,
        "process_in_use": message.process_in_use,
        "allocated_by_pytorch": message.allocated_by_pytorch,
        "reserved_unallocated": message.reserved_unallocated,
        "reserved_total": message.reserved_total,
        "allowed": message.allowed,
        "private_pools": message.private_pools,
    }


def _assert_exact(message: OomMessage | None, case: str) -> None:
    assert message is not None
    got = _numbers(message)
    for key, value in expected_numbers(case).items():
        assert got[key] == value, (case, key)


@pytest.mark.parametrize(("case", "needle"), MESSAGES)
def test_every_wrap_column_reads_every_number(case: str, needle: str) -> None:
    message = _message(case, needle)
    for width in range(1, len(message)):
        # a terminal cuts at the column, wherever it falls (inside a number, a unit, a word)
        hard = "\n".join(message[i : i + width] for i in range(0, len(message), width))
        _assert_exact(parse_oom_message(hard), case)
    for width in range(8, 120):
        # a paste box wraps at a space and drops it
        lines, current = [], ""
        for word in message.split(" "):
            if current and len(current) + 1 + len(word) > width:
                lines.append(current)
                current = word
            else:
                current = f"{current} {word}" if current else word
        _assert_exact(parse_oom_message("\n".join([*lines, current])), case)


@pytest.mark.parametrize(("case", "needle"), MESSAGES)
def test_a_wrapped_message_in_a_pasted_traceback_is_one_complete_event(
    tmp_path: Path, case: str, needle: str
) -> None:
    message = _message(case, needle)
    lines = [
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        "    loss.backward()",
        *(message[i : i + 37] for i in range(0, len(message), 37)),
        "[2023-07-04 17:31:27,755] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 9538",
    ]
    target = tmp_path / "paste.txt"
    target.write_text("\n".join(lines) + "\n")
    facts = read_log(target)
    assert len(facts.oom_events) == 1
    event = facts.oom_events[0]
    _assert_exact(event.message, case)
    assert event.message.complete and event.source.line == 4


@pytest.mark.parametrize(
    ("case", "start", "known"),
    [
        ("deepspeed-3869", "Tried to allocate", None),
        ("deepspeed-3869", "(GPU 0;", "tried_to_allocate"),
        ("deepspeed-3869", "1.68 GiB already", "capacity"),
        ("swift-7826", "Tried to allocate", None),
        ("swift-7826", "GPU 3 has a total", "tried_to_allocate"),
        ("swift-7826", "CUDA out of memory", None),
    ],
)
def test_a_paste_that_starts_mid_message_keeps_what_is_left(
    tmp_path: Path, case: str, start: str, known: str | None
) -> None:
    message = _message(case, "Tried to allocate")
    cut = message[message.index(start) :]
    target = tmp_path / "paste.txt"
    target.write_text(cut + "\n")
    facts = read_log(target)
    assert len(facts.oom_events) == 1
    got = _numbers(facts.oom_events[0].message)
    lost = {known}
    if known == "capacity":  # cut after the device and the capacity
        lost = {"device", "tried_to_allocate", "total_capacity"}
    for key, value in expected_numbers(case).items():
        if key in lost:
            assert got[key] is None, key
        else:
            assert got[key] == value, key


def _decorated(text: str, how: str) -> bytes:
    if how == "quoted":
        return "".join(f"> {line}\n" for line in text.splitlines()).encode()
    if how == "fenced":
        return f"```text\n{text}\n```\n".encode()
    if how == "ansi":
        return "".join(f"\x1b[31m{line}\x1b[0m\n" for line in text.splitlines()).encode()
    if how == "crlf":
        return text.replace("\n", "\r\n").encode() + b"\r\n"
    if how == "nbsp":
        return text.replace(" ", "\u00a0").encode() + b"\n"
    assert how == "full_width"
    table = {ord(c): ord(c) + 0xFEE0 for c in "():;,"}
    return text.translate(table).encode() + b"\n"


@pytest.mark.parametrize("how", ["quoted", "fenced", "ansi", "crlf", "nbsp", "full_width"])
@pytest.mark.parametrize(("case", "needle"), MESSAGES)
def test_decorations_of_a_paste_keep_every_number(
    tmp_path: Path, case: str, needle: str, how: str
) -> None:
    message = _message(case, needle)
    wrapped = "\n".join(message[i : i + 80] for i in range(0, len(message), 80))
    target = tmp_path / "paste.txt"
    target.write_bytes(_decorated(wrapped, how))
    facts = read_log(target)
    assert len(facts.oom_events) == 1, how
    _assert_exact(facts.oom_events[0].message, case)


def test_two_ranks_printed_into_one_line_are_two_messages() -> None:
    # lte-3: "torch.cudatorch.cuda..OutOfMemoryErrorOutOfMemoryError: : CUDA out of memory. ...
    # PYTORCH_CUDA_ALLOC_CONFCUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; ..."
    facts = read_log(paste_path("lte-3"))
    assert [e.message.device for e in facts.oom_events] == [0, 3]
    _assert_exact(facts.oom_events[0].message, "lte-3")
    assert facts.oom_events[1].message.free == round(355.31 * 2**20)
    assert all(e.message.backend == "CUDA" for e in facts.oom_events)


def test_the_job_itself_listed_under_its_container_pid_is_not_another_process() -> None:
    # swift-7826: no "this process has" clause, one "Process 566680 has 79.00 GiB", PyTorch
    # holds 77.41 + 0.05 GiB of it
    message = parse_oom_message(_message("swift-7826", "Tried to allocate"))
    assert message is not None and message.listed_self is not None
    assert message.listed_self.pid == 566680
    assert message.process_in_use == round(79.00 * 2**30)
    assert message.other_processes == ()


def test_a_listed_process_smaller_than_pytorchs_own_memory_is_another_process() -> None:
    real = _message("swift-7826", "Tried to allocate")
    # the same message with the listed process holding less than PyTorch alone: not this one
    smaller = real.replace("Process 566680 has 79.00 GiB", "Process 566680 has 1.50 GiB")
    message = parse_oom_message(smaller)
    assert message is not None and message.listed_self is None
    assert message.process_in_use is None
    assert [(p.pid, p.bytes) for p in message.other_processes] == [(566680, round(1.5 * 2**30))]
    # cut right after the list, a "this process has" clause may have followed: no guess
    cut = real[: real.index("memory in use.") + len("memory in use.")]
    message = parse_oom_message(cut)
    assert message is not None and message.listed_self is None and message.process_in_use is None


def test_a_message_cut_before_its_numbers_still_names_a_torch_oom(tmp_path: Path) -> None:
    message = _message("swift-7826", "Tried to allocate")
    for cut in ("torch.OutOfMemoryError: CUDA out of mem", "torch.OutOfMemoryError:"):
        parsed = parse_oom_message(cut)
        assert parsed is not None and parsed.message_format == "class_only", cut
        assert not parsed.complete and message.startswith(cut)
    # a script printing the class is not an OOM (the lab log's probe line)
    assert parse_oom_message("OutOfMemoryError: <class 'torch.OutOfMemoryError'> True") is None


def test_other_frameworks_allocators_in_the_same_job() -> None:
    # jax-788 (XLA, its "Out of memory" wrapped by the paste), mxnet-6798 (cut "out of mem")
    xla = read_log(paste_path("jax-788")).oom_events
    assert [(e.message.kind, e.message.message_format) for e in xla] == [(OomKind.FRAMEWORK, "xla")]
    assert xla[0].message.tried_to_allocate == 5520758552
    mxnet = read_log(paste_path("mxnet-6798")).oom_events
    assert [(e.message.kind, e.message.message_format) for e in mxnet] == [
        (OomKind.FRAMEWORK, "mxnet")
    ]
    # dallemini-185: a CUDA runtime call's own "out of memory"
    driver = parse_oom_message(paste("dallemini-185"))
    assert driver is not None and driver.kind is OomKind.DRIVER


def test_malloc_async_message_wrapped_and_indented() -> None:
    text = paste("pytorch-110194")
    block = text[: text.index("17179869184.00 GiB") + len("17179869184.00 GiB")]
    for width in (23, 41, 64):
        rewrapped = "\n".join(
            piece[i : i + width]
            for piece in block.splitlines()
            for i in range(0, len(piece), width)
        )
        message = parse_oom_message(rewrapped)
        assert message is not None and message.kind is OomKind.ALLOCATOR_ASYNC
        _assert_exact(message, "pytorch-110194")
        assert message.allowed is None and message.complete  # SIZE_MAX: no fraction set


def test_several_messages_are_split_only_at_a_new_message() -> None:
    one = _message("deepspeed-3869", "Tried to allocate")
    assert len(parse_oom_messages(one)) == 1
    two = parse_oom_messages(one + " " + one.replace("(GPU 0;", "(GPU 1;"))
    assert [m.device for m in two] == [0, 1]


@pytest.mark.parametrize("width", [40, 80, 133])
def test_a_ranks_message_wrapped_by_the_terminal_keeps_its_rank(tmp_path: Path, width: int) -> None:
    # swift-7826's "[rank3]: torch.OutOfMemoryError: ..." line: the terminal prints the prefix
    # once, the wrapped rest of the line has none
    line = line_with("swift-7826", "Tried to allocate")
    target = tmp_path / "paste.txt"
    target.write_text("\n".join(line[i : i + width] for i in range(0, len(line), width)) + "\n")
    [event] = read_log(target).oom_events
    assert event.source.rank == 3 and event.message.complete
    _assert_exact(event.message, "swift-7826")
