# ruff: noqa: E501 - the real lines below are kept whole, as the tools print them
"""Multi-rank logs in the line shapes of every framework and launcher issue 32 names, made by code
from the real lines of ``fixtures/crash_logs`` and ``fixtures/field_logs``.

A *shape* is a launcher form (how each line is prefixed) and a family of progress and memory
lines (what the training stack prints).  The bodies are corpus lines, found by what they are
(``_Bodies``), whose numbers are varied per step and rank; the prefixes are applied as the
launchers apply them:

* torchrun ``--tee``: ``[rankN]:`` (torch < 2.4) and ``[rankN]: `` (the space later torch
  prints), ``[defaultN]:`` (elastic agent role prefix);
* srun ``--label``: the task id right-aligned to the widest id's digits, then ``": "``
  (``srun``'s ``%*d: ``);
* pdsh: ``host: `` before the line (the corpus's ``worker-5: [rank22]: ...``);
* Lightning's ``rank_prefixed_message``: ``[rank: N] ``; accelerate's ``[RANK N] ``.

Families: DeepSpeed ``print`` (``see_memory_usage`` printed, the script's step line, the
ZeRO-3 flush warning), DeepSpeed logger (the same as logger records, ``step=`` and
ThroughputTimer lines), a training script's step line with more fields (the corpus's
``step S/N batch B loss X (Ts)``), Lightning progress bars, HF Trainer log dicts and tqdm bars
rewritten with carriage returns, Megatron's memory report, python-logging lines
(``MM/DD/YYYY HH:MM:SS - LEVEL - name - message`` as the HF examples configure it).  Where the
corpus holds no line of a family (HF's dict, Megatron's iteration line) the line is made as the
library's code makes it (``Trainer``: ``str(logs)``; Megatron ``training_log``'s
``' iteration {:8d}/{:8d} |'`` fields) -- said in ``SYNTHETIC``.

``dense``: every line of a rank's step is a progress, memory or flush line; ``sparse``: one in
ten, the others ordinary INFO lines of the corpus (no anchor in them).  Ranks interleave in
bursts as unbuffered writers to one stream.  ``random_shape(seed)`` draws a launcher form and a
set of bodies at random (the seed printed by the bench), so that no one text can be tuned for.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = (ROOT / "fixtures" / "crash_logs", ROOT / "fixtures" / "field_logs")
SYNTHETIC = ("hf_dict", "megatron_iteration")
"""Families with no line in the corpus: made as the library's code prints them."""


def _corpus_lines() -> list[str]:
    lines: list[str] = []
    for corpus in CORPORA:
        for path in sorted(corpus.glob("*/*")):
            if path.suffix in (".log", ".txt") and path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                lines.extend(text.splitlines())
    return lines


def _first(lines: list[str], pattern: str) -> str:
    found = re.compile(pattern)
    return next(x for x in lines if found.search(x))


Body = Callable[[int, int, random.Random], str]
"""A body made for (step, rank): the text after the launcher prefix."""


class _Bodies:
    """The corpus lines each family is made of, and a maker per kind of line."""

    def __init__(self) -> None:
        lines = _corpus_lines()
        self.memory = _first(lines, r"^MA [\d.]+ GB +Max_MA")
        self.cpu = _first(lines, r"^CPU Virtual Memory:")
        self.flush = _first(lines, r"\] \d+ pytorch allocator cache flushes")
        self.ds_step = _first(lines, r"\[logging\.py:\d+:log_dist\] \[Rank \d+\] step=")
        self.throughput = _first(lines, r"global_step=\d+, .*MemAllocated=")
        self.logger_memory = _first(lines, r"see_memory_usage\] MA ")
        self.script_step = _first(lines, r"^step \d+/\d+ loss [\d.]+ \([\d.]+s\)$")
        self.ranked_step = _first(lines, r"^(?:\[default\d+\]:)?rank \d+ step \d+ loss [\d.]+$")
        self.lightning_bar = _first(lines, r"^Epoch \d+: +\d+% \d+/\d+ \[.*it/s, loss=")
        self.tqdm_bar = _first(lines, r"^ +\d+%\|.*\| \d+/\d+ \[\d\d:\d\d<")
        self.megatron_memory = _first(lines, r"memory \(MB\) \| allocated: ")
        self.pylogging = _first(lines, r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d - INFO - __main__ - ")
        self.info = sorted(
            {
                x[26:]
                for x in lines
                if re.match(r"\[[\d -:,]{23}\] \[INFO\] \[", x) and len(x) < 180 and _plain(x)
            }
        )[::3][:48]

    def makers(self) -> dict[str, Body]:
        """Each kind of line, its numbers set by step and rank."""

        def clock(step: int, rank: int) -> str:
            return f"2026-11-30 {6 + step // 3600 % 18:02d}:{step // 60 % 60:02d}:{step % 60:02d},{(rank * 7 + step) % 1000:03d}"

        def ma(step: int, rank: int) -> float:
            return round(3.8 + (step % 997) * 0.0061 + rank * 0.001, 2)

        def loss(step: int, rank: int) -> str:
            return f"{10.6 - (step % 500) * 0.001 - rank * 0.0001:.4f}"

        def memory(s: int, r: int, _: random.Random) -> str:
            m = ma(s, r)
            return re.sub(
                r"MA [\d.]+ GB +Max_MA [\d.]+ GB +CA [\d.]+ GB +Max_CA [\d.]+ GB",
                f"MA {m} GB         Max_MA {round(m + 1.37, 2)} GB         CA {round(m + 3.58, 2)} GB         Max_CA {round(m + 3.58)} GB",
                self.memory,
            )

        def cpu(s: int, r: int, _: random.Random) -> str:
            return re.sub(r"used = [\d.]+ GB", f"used = {4.2 + (s % 50) * 0.01:.2f} GB", self.cpu)

        def flush(s: int, r: int, _: random.Random) -> str:
            tail = self.flush[self.flush.index(" pytorch allocator") :]
            return f"[{clock(s, r)}] [WARNING] [stage3.py:2940:step] {1 + (s + r) % 3}{tail}"

        def ds_step(s: int, r: int, _: random.Random) -> str:
            body = re.sub(r"step=\d+", f"step={s}", self.ds_step)
            return f"[{clock(s, r)}]" + body[body.index("]") + 1 :]

        def throughput(s: int, r: int, _: random.Random) -> str:
            body = re.sub(r"global_step=\d+", f"global_step={s}", self.throughput)
            body = re.sub(r"MemAllocated=[\d.]+GB", f"MemAllocated={ma(s, r)}GB", body)
            return f"[{clock(s, r)}]" + body[body.index("]") + 1 :]

        def logger_memory(s: int, r: int, rng: random.Random) -> str:
            head = self.logger_memory[: self.logger_memory.index("MA ")]
            return f"[{clock(s, r)}]" + head[head.index("]") + 1 :] + memory(s, r, rng)

        def script_step(s: int, r: int, _: random.Random) -> str:
            return f"step {s}/1000000 loss {loss(s, r)} ({1.1 + s * 0.4:.1f}s)"

        def script_step_fields(s: int, r: int, _: random.Random) -> str:
            # the corpus script's own f-string: step {step}/{steps} batch {batch} loss {loss:.4f} ({t:.1f}s)
            return f"step {s}/1000000 batch {8 + r % 4} loss {loss(s, r)} ({1.1 + s * 0.4:.1f}s)"

        def ranked_step(s: int, r: int, _: random.Random) -> str:
            return f"rank {r} step {s} loss {loss(s, r)}"

        def lightning_bar(s: int, r: int, _: random.Random) -> str:
            return re.sub(
                r"(\d+)% (\d+)/(\d+) \[",
                lambda m: f"{s * 100 // 1000003}% {s}/1000003 [",
                self.lightning_bar.replace("loss=2.089", f"loss={loss(s, r)[:5]}"),
            )

        def tqdm_bar(s: int, r: int, _: random.Random) -> str:
            # tqdm rewrites the bar in place: many \r-separated rewrites on one line
            bar = self.tqdm_bar[: self.tqdm_bar.index("]") + 1]
            rewrites = [re.sub(r"\| \d+/(\d+) \[", f"| {s * 4 + k}/\\1 [", bar) for k in range(4)]
            return "\r".join(rewrites)

        def hf_dict(s: int, r: int, _: random.Random) -> str:
            # transformers' Trainer.log -> ProgressCallback.on_log: print/write(str(logs))
            logs = {
                "loss": float(loss(s, r)),
                "grad_norm": round(0.8 + (s % 7) * 0.01, 4),
                "learning_rate": 5e-05 * (1 - s / 2e6),
                "epoch": round(s / 10000, 2),
            }
            return str(logs)

        def megatron_iteration(s: int, r: int, _: random.Random) -> str:
            # megatron.training.training.training_log's log_string
            return (
                f" iteration {s:8d}/{500000:8d} | consumed samples: {s * 64:12d} | "
                f"elapsed time per iteration (ms): {1234.5 + s % 17:.1f} | learning rate: "
                f"{1.5e-4:.6E} | global batch size: {64:5d} | lm loss: {float(loss(s, r)):.6E} | "
                f"loss scale: {65536.0:.1f} | grad norm: {0.8 + (s % 7) * 0.01:.3f} | "
                f"number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
            )

        def megatron_memory(s: int, r: int, _: random.Random) -> str:
            m = ma(s, r) * 1024 * 13
            return re.sub(
                r"\(after \d+ iterations\) memory \(MB\) \| allocated: [\d.]+ \| max allocated: [\d.]+",
                f"(after {s} iterations) memory (MB) | allocated: {m} | max allocated: {m * 1.3}",
                self.megatron_memory,
            )

        def pylogging(s: int, r: int, _: random.Random) -> str:
            head = self.pylogging[: self.pylogging.index(" - INFO - __main__ - ") + 21]
            return f"{head}step {s}: loss {loss(s, r)}, memory allocated {ma(s, r)} GB"

        return {
            name: value
            for name, value in locals().items()
            if callable(value) and name not in ("clock", "ma", "loss", "self")
        }


def _plain(line: str) -> bool:
    """A line none of the reader's anchors is in (an INFO line that it skips)."""
    from oomlens.ingest.log.bits import ANCHORS

    raw = line.encode()
    return not any(anchor in raw for anchor in ANCHORS) and "{" not in line


Prefix = Callable[[int, int, str], str]
"""(rank, ranks, host) -> the text a launcher puts before a line."""


def _srun(rank: int, ranks: int, host: str) -> str:
    return f"{rank:>{len(str(ranks - 1))}}: "


PREFIXES: dict[str, Prefix] = {
    "none": lambda r, n, h: "",
    "torchrun": lambda r, n, h: f"[rank{r}]:",
    "torchrun_space": lambda r, n, h: f"[rank{r}]: ",
    "default": lambda r, n, h: f"[default{r}]:",
    "srun": _srun,
    "pdsh": lambda r, n, h: f"{h}: [rank{r}]: ",
    "lightning": lambda r, n, h: f"[rank: {r}] ",
    "accelerate": lambda r, n, h: f"[RANK {r}] ",
}


@dataclass(frozen=True)
class Shape:
    prefix: str
    bodies: tuple[str, ...]
    """Per step and rank, these kinds of line (``_Bodies.makers``) in order."""


SHAPES: dict[str, Shape] = {
    "ds_print": Shape("torchrun", ("script_step", "memory", "cpu", "flush")),
    "ds_logger": Shape("torchrun_space", ("ds_step", "logger_memory", "throughput", "flush")),
    "script_fields": Shape("torchrun_space", ("script_step_fields", "memory", "flush")),
    "default": Shape("default", ("ranked_step", "memory", "cpu")),
    "srun": Shape("srun", ("ds_step", "memory", "cpu", "flush")),
    "pdsh": Shape("pdsh", ("script_step", "memory", "flush")),
    "lightning": Shape("lightning", ("lightning_bar", "memory")),
    "accelerate": Shape("accelerate", ("script_step_fields", "memory")),
    "hf": Shape("none", ("hf_dict", "tqdm_bar")),
    "megatron": Shape("none", ("megatron_iteration", "megatron_memory")),
    "pylogging": Shape("none", ("pylogging",)),
}


def random_shape(seed: int) -> Shape:
    """A launcher form and two to four kinds of line drawn at random."""
    rng = random.Random(seed)
    kinds = sorted(_Bodies().makers())
    return Shape(rng.choice(sorted(PREFIXES)), tuple(rng.sample(kinds, rng.randint(2, 4))))


def lines_of(shapes: list[Shape], density: str, ranks: int = 64, seed: int = 32) -> Iterator[str]:
    """The lines (no newline) of a log of ``shapes`` (one per rank, round robin: the mixed log
    gives each rank its own), ``dense`` or ``sparse``, step after step."""
    bodies = _Bodies()
    makers = bodies.makers()
    rng = random.Random(seed)
    hosts = [f"worker-{r // 8}" for r in range(ranks)]
    step = 1
    while True:
        pending: list[list[str]] = []
        for rank in range(ranks):
            shape = shapes[rank % len(shapes)]
            prefix = PREFIXES[shape.prefix](rank, ranks, hosts[rank])
            texts = [makers[b](step, rank, rng) for b in shape.bodies]
            if density == "sparse":
                info = [
                    f"[2026-11-30 06:00:{step % 60:02d},000] {bodies.info[(step * 9 + k + rank) % len(bodies.info)]}"
                    for k in range(9 * len(texts))
                ]
                for k, text in enumerate(texts):
                    info.insert((step + rank + 10 * k) % (len(info) + 1), text)
                texts = info
            pending.append([prefix + t for t in texts])
        cursor = [0] * ranks
        live = list(range(ranks))
        rank = rng.choice(live)
        while live:
            if rng.random() < 0.35 or cursor[rank] >= len(pending[rank]):
                rank = rng.choice(live)
            yield pending[rank][cursor[rank]]
            cursor[rank] += 1
            if cursor[rank] >= len(pending[rank]):
                live.remove(rank)
        step += 1


def generate(
    path: Path, size: int, shapes: list[Shape], density: str, ranks: int = 64, seed: int = 32
) -> dict[str, int]:
    """Write a log of about ``size`` bytes; returns its byte and line counts."""
    written = lines = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 22) as out:
        batch: list[str] = []
        for line in lines_of(shapes, density, ranks, seed):
            batch.append(line)
            if len(batch) >= 4096:
                text = "\n".join(batch) + "\n"
                out.write(text)
                written += len(text.encode())
                lines += len(batch)
                batch.clear()
                if written >= size:
                    break
    return {"bytes": written, "lines": lines}
