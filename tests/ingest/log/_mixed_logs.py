"""Multi-rank logs mixed from real lines, for the bulk path's equivalence tests.

The high-frequency lines are those of ``bench/multirank_log.py`` (the corpus's see_memory_usage
blocks, cache-flush warnings and loss lines); around them, the crash corpus's and the lab
sample's other lines, the reference lines, and the shapes that must leave the bulk path:
tracebacks and OOM messages cut by block ends, a DeepSpeed config dump, tqdm bars, glued
lines, lines with control characters or full-width prefixes, the older logger rendering of
see_memory_usage, CPU lines apart from their memory line, DeepSpeed ``step=`` lines.  Every
line is a real one or a real one with its numbers or prefix changed; ``mixed_log(seed)`` is
deterministic.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

from bench.multirank_log import Templates, _rank_lines

ROOT = Path(__file__).resolve().parents[3]
ASSETS = ROOT / "tests" / "assets" / "logs"
CORPUS = ROOT / "fixtures" / "crash_logs"


@cache
def _sources() -> dict[str, list[str]]:
    lab = (ASSETS / "lab_log_torch2.11_h200.txt").read_text().splitlines()
    start = lab.index("Traceback (most recent call last):")
    end = next(i for i in range(start, len(lab)) if lab[i].startswith("torch.OutOfMemoryError"))
    corpus: list[str] = []
    for path in sorted(CORPUS.glob("*/train.log")):
        corpus.extend(path.read_text(errors="replace").splitlines())
    dump_start = next(i for i, x in enumerate(corpus) if "DeepSpeedEngine configuration" in x)
    dump_end = next(i for i in range(dump_start, len(corpus)) if corpus[i].strip() == "}")
    return {
        "traceback": lab[start : end + 1],
        "reference": (ASSETS / "reference_lines.txt").read_text().splitlines(),
        "corpus": [x for x in corpus if x and len(x) < 600],
        "dump": corpus[dump_start : dump_end + 1],
        "ds_step": [x for x in corpus if "step=" in x and "skipped=" in x],
    }


def _prefix(rng: random.Random, rank: int, style: str) -> str:
    if style == "rank":
        return f"[rank{rank}]:"
    if style == "rank_space":
        return f"[rank{rank}]: "
    if style == "default":
        return f"[default{rank}]:"
    if style == "pdsh":  # pdsh -S: "host: " before the line (the corpus's worker-5: [rank22]:)
        return f"worker-{rank // 8}: [rank{rank}]: "
    if style == "lightning":  # lightning_utilities' rank_prefixed_message
        return f"[rank: {rank}] "
    return ""


def _odd_line(rng: random.Random, rank: int, t: Templates, step: int) -> list[str]:
    """Lines the bulk path must leave to the per-line path (or read exactly as it does)."""
    src = _sources()
    choice = rng.randrange(16)
    if choice == 0:
        return src["traceback"]
    if choice == 1:
        return [rng.choice(src["reference"])]
    if choice == 2:
        return [rng.choice(src["corpus"])]
    if choice == 3:
        return src["dump"][: rng.randrange(2, len(src["dump"]) + 1)]
    if choice == 4:
        return [f" {step % 100}%|#####     | {step % 1000}/1000 [12:10<14:52,  1.62s/it]"]
    if choice == 5:
        return [f"step {step}/9 loss 1.{step} ([rank{rank + 1}]:step {step}/9 loss 2.5"]
    if choice == 6:
        return ["MA 1.5 GB         Max_MA 2.5 GB         CA 3.5 GB         Max_CA 4 GB \r"]
    if choice == 7:
        return ["［rank1］：after step 3", "\u00a0after step 4"]
    if choice == 8:
        return [
            "[2023-04-07 13:08:55,469] [INFO] [utils.py:829:see_memory_usage] after step 5",
            f"[2023-04-07 13:08:55,469] [INFO] [utils.py:830:see_memory_usage] MA {step}.76 GB"
            "         Max_MA 11.76 GB         CA 11.77 GB         Max_CA 12 GB",
            "[2023-04-07 13:08:55,470] [INFO] [utils.py:831:see_memory_usage] CPU Virtual "
            "Memory:  used = 12.3 GB, percent = 10.2%",
        ]
    if choice == 9:
        return [rng.choice(src["ds_step"])]
    if choice == 10:
        return [f"CPU Virtual Memory:  used = 4.{step % 100} GB, percent = 1.7%"]
    if choice == 11:
        return [f"rank {rank} step {step} loss 10.{step:04d}"]
    if choice == 12:
        return [f"eval step {step} loss 3.2", "step 7/9 loss nan"]
    if choice == 13:
        return ["MA 99999999999 GB         Max_MA 1 GB         CA 1 GB         Max_CA 1 GB "]
    if choice == 14:
        return [
            "[2026-02-30 05:00:00,500] [WARNING] [stage3.py:2391:step] 2 pytorch allocator "
            "cache flushes since last step. this happens when there is high memory pressure"
        ]
    return ["", "\x1b[32mafter step 9\x1b[0m", "node-1: [rank0]: after step 9"]


def mixed_log(seed: int, ranks: int = 8, steps: int = 40, odd: float = 0.05) -> str:
    """A log of ``steps`` steps of ``ranks`` ranks, dense or sparse lines, interleaved in
    bursts, with odd lines at the rate ``odd``."""
    rng = random.Random(seed)
    t = Templates()
    style = rng.choice(("rank", "rank_space", "default", "none", "mixed", "pdsh", "lightning"))
    shape = rng.choice(("dense", "sparse"))
    out: list[str] = []
    for step in range(1, steps + 1):
        pending = []
        for rank in range(ranks):
            lines = _rank_lines(t, shape, rank, step, 1000)
            if rng.random() < odd * 4:
                lines.insert(rng.randrange(len(lines) + 1), "<odd>")
            pending.append(lines)
        cursor = [0] * ranks
        live = list(range(ranks))
        rank = rng.choice(live)
        while live:
            if rng.random() < 0.35 or cursor[rank] >= len(pending[rank]):
                rank = rng.choice(live)
            line = pending[rank][cursor[rank]]
            here = style if style != "mixed" else rng.choice(("rank", "rank_space", "none", "pdsh"))
            if line == "<odd>":
                prefix = _prefix(rng, rank, here)
                out.extend(prefix + odd_line for odd_line in _odd_line(rng, rank, t, step))
            else:
                out.append(_prefix(rng, rank, here) + line)
            cursor[rank] += 1
            if cursor[rank] >= len(pending[rank]):
                live.remove(rank)
    text = "\n".join(out)
    return text if rng.random() < 0.2 else text + "\n"
