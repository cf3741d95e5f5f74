# ruff: noqa: E501 - the real lines below are kept whole, as the tools print them
"""Multi-rank training logs of the shapes issue 15 measures, generated from the corpus's real lines.

Every line carries ``[rankN]:`` (a 64-rank job's combined output), and the ranks' lines
interleave as processes writing unbuffered (``python -u``) to one stream do: each rank writes
its lines in order, in bursts of a few, cut into by the other ranks.

* ``dense``: every rank, every step, prints the line shapes the debugging advice asks for: the
  training script's ``step S/N loss X (Ts)`` line, a ``see_memory_usage`` block (label,
  ``MA .. Max_MA ..`` and ``CPU Virtual Memory`` lines, DeepSpeed 0.18.3+ ``print`` form) and
  ZeRO-3's allocator cache-flush warning (DeepSpeed logger form), about 144 bytes a line;
* ``sparse``: every rank, every step, nine ordinary DeepSpeed INFO lines and one
  ``MA .. Max_MA ..`` line.

The templates are the real lines of the crash corpus (``fixtures/crash_logs``: the
loss, label, memory and flush lines its runs printed; the INFO lines of every case that hold
none of the reader's anchors); only the numbers vary (step, loss, GiB, time).  ``lines_of(shape, ...)`` yields the
same lines for tests at any size.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "crash_logs"


def _corpus_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(CORPUS.glob("*/train.log")):
        lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return lines


def _ordinary(line: str) -> bool:
    """A line none of the reader's anchors is in (an INFO line that it skips)."""
    from oomlens.ingest.log.bits import ANCHORS

    raw = line.encode()
    return not any(anchor in raw for anchor in ANCHORS) and "{" not in line


class Templates:
    """The real lines the generated logs are made of."""

    def __init__(self) -> None:
        lines = _corpus_lines()
        self.loss = next(
            x for x in lines if re.fullmatch(r"step \d+/\d+ loss [\d.]+ \([\d.]+s\)", x)
        )
        self.label = next(x for x in lines if re.fullmatch(r"after step \d+", x))
        self.memory = next(x for x in lines if x.startswith("MA ") and "Max_MA" in x)
        self.cpu = next(x for x in lines if x.startswith("CPU Virtual Memory:"))
        self.flush = next(x for x in lines if "pytorch allocator cache flushes" in x)
        info = sorted(
            {
                x[26:]
                for x in lines
                if re.match(r"\[[\d -:,]{23}\] \[INFO\] \[", x) and len(x) < 180 and _ordinary(x)
            }
        )
        self.info = info[:: max(1, len(info) // 32)][:32]


def _gib(value: float) -> str:
    return str(round(value, 2))


def _rank_lines(t: Templates, shape: str, rank: int, step: int, total: int) -> list[str]:
    clock = f"2026-11-30 {6 + step // 3600 % 18:02d}:{step // 60 % 60:02d}:{step % 60:02d},{(rank * 7 + step) % 1000:03d}"
    ma = 3.8 + (step % 997) * 0.0061 + rank * 0.001
    if shape == "dense":
        return [
            re.sub(
                r"step \d+/\d+ loss [\d.]+ \([\d.]+s\)",
                f"step {step}/{total} loss {10.6 - (step % 500) * 0.001 - rank * 0.0001:.4f} ({1.1 + step * 0.4:.1f}s)",
                t.loss,
            ),
            f"after step {step}",
            f"MA {_gib(ma)} GB         Max_MA {_gib(ma + 1.37)} GB         CA {_gib(ma + 3.58)} GB         Max_CA {round(ma + 3.58)} GB ",
            f"CPU Virtual Memory:  used = {_gib(4.2 + (step % 50) * 0.01)} GB, percent = {1.7 + (step % 10) * 0.1:.1f}%",
            f"[{clock}] [WARNING] [stage3.py:2940:step] {1 + (step + rank) % 3}{t.flush[t.flush.index(' pytorch allocator') :]}",
        ]
    info = [f"[{clock}] {t.info[(step * 9 + k + rank) % len(t.info)]}" for k in range(9)]
    info.insert(
        (step + rank) % 10,
        f"MA {_gib(ma)} GB         Max_MA {_gib(ma + 1.37)} GB         CA {_gib(ma + 3.58)} GB         Max_CA {round(ma + 3.58)} GB ",
    )
    return info


def lines_of(
    shape: str, ranks: int = 64, steps: int | None = None, seed: int = 15, total: int = 10**6
) -> Iterator[str]:
    """The lines (no newline) of a ``dense`` or ``sparse`` log, step after step."""
    t = Templates()
    rng = random.Random(seed)
    step = 1
    while steps is None or step <= steps:
        pending = [_rank_lines(t, shape, r, step, total) for r in range(ranks)]
        cursor = [0] * ranks
        live = list(range(ranks))
        rank = rng.choice(live)
        while live:
            if rng.random() < 0.35 or cursor[rank] >= len(pending[rank]):
                rank = rng.choice(live)
            yield f"[rank{rank}]:{pending[rank][cursor[rank]]}"
            cursor[rank] += 1
            if cursor[rank] >= len(pending[rank]):
                live.remove(rank)
        step += 1


def generate(path: Path, size: int, shape: str, ranks: int = 64, seed: int = 15) -> dict[str, int]:
    """Write a log of about ``size`` bytes; returns its byte and line counts."""
    written = lines = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 22) as out:
        batch: list[str] = []
        for line in lines_of(shape, ranks, seed=seed):
            batch.append(line)
            if len(batch) >= 4096:
                text = "\n".join(batch) + "\n"
                out.write(text)
                written += len(text)
                lines += len(batch)
                batch.clear()
                if written >= size:
                    break
    return {"bytes": written, "lines": lines}
