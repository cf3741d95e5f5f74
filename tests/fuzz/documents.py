"""Documents that quote an OOM but are not logs of a run that had one.

A dataset of issues, project notes, a regression test, a saved web page, a test report, a
batch script: each may hold a real CUDA or host OOM message or traceback, quoted.  None is a
log, so none may make a run an OOM (``oracles.direction``).  ``document(quote, rng)`` returns
the file's usual name and its bytes, the quote embedded the way that format embeds text.
"""

from __future__ import annotations

import csv
import html
import io
import random
from xml.sax.saxutils import escape, quoteattr

from tests.fuzz.shapes import crash_start


def quote_of(log: bytes, rng: random.Random) -> str:
    """A real OOM message or traceback cut from a crash log: its crash block (at most 60
    lines), or only the block's last line that names the error."""
    lines = log.decode("utf-8", "replace").rstrip("\n").split("\n")
    block = lines[crash_start([line.encode() for line in lines]) :][:60]
    named = [line for line in block if "memory" in line.lower() or "Error" in line]
    if named and rng.random() < 0.4:
        return named[-1]
    return "\n".join(block)


def _csv(quote: str, rng: random.Random) -> tuple[str, bytes]:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "title", "state", "labels", "body"])
    rows = [
        ["1203", "Loss is NaN after resuming", "closed", "bug", "It goes NaN at step 12k."],
        ["1217", "CUDA out of memory with ZeRO-3 on 8 GPUs", "open", "bug,memory",
         f"When I run the script I get:\n\n```\n{quote}\n```\n\nAny idea?"],
        ["1222", "Docs: typo in README", "closed", "docs", "Fixed in #1223."],
    ]  # fmt: skip
    rng.shuffle(rows)
    writer.writerows(rows)
    return rng.choice(["issues.csv", "dataset.csv", "github_issues.csv"]), out.getvalue().encode()


def _toml(quote: str, rng: random.Random) -> tuple[str, bytes]:
    body = quote.replace("'''", "''\\'")
    text = (
        "# Known failures and what fixed them\n\n"
        '[[failure]]\nname = "activation OOM"\nseen = 2026-11-30\n'
        f"message = '''\n{body}\n'''\n"
        'fix = "halve train_micro_batch_size_per_gpu"\n\n'
        '[[failure]]\nname = "nccl timeout"\nfix = "raise NCCL_TIMEOUT"\n'
    )
    return rng.choice(["known_failures.toml", "notes.toml"]), text.encode()


def _markdown(quote: str, rng: random.Random) -> tuple[str, bytes]:
    text = (
        "# Notes from the 7B runs\n\n"
        "Run 14 died on Tuesday; the message was:\n\n"
        f"```\n{quote}\n```\n\n"
        "We lowered the micro batch to 2 and it has run since. Next: try activation "
        "checkpointing.\n"
    )
    return rng.choice(["NOTES.md", "postmortem.md", "README.md"]), text.encode()


def _python(quote: str, rng: random.Random) -> tuple[str, bytes]:
    body = quote.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    text = (
        '"""Regression test: the message parser reads a real OOM."""\n\n'
        f'MESSAGE = """\\\n{body}\n"""\n\n\n'
        "def test_message_is_parsed():\n    assert parse(MESSAGE).kind == 'gpu_oom'\n"
    )
    return "test_oom_parser.py", text.encode()


def _python_snippet(quote: str, rng: random.Random) -> tuple[str, bytes]:
    comment = "\n".join("# " + line for line in quote.split("\n"))
    text = (
        "import torch\n\n\n"
        "def step(model, batch):\n"
        "    # This used to fail with:\n"
        f"{comment}\n"
        "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "        return model(**batch).loss\n"
    )
    return "train_step.py", text.encode()


def _html(quote: str, rng: random.Random) -> tuple[str, bytes]:
    text = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>CUDA out of memory during training · Issue #1217</title></head>\n<body>\n"
        '<div class="comment-body"><p>When I run the script I get:</p>\n'
        f"<pre><code>{html.escape(quote)}</code></pre>\n"
        "<p>Any idea?</p></div>\n</body></html>\n"
    )
    return rng.choice(["issue-1217.html", "saved_page.html"]), text.encode()


def _junit(quote: str, rng: random.Random) -> tuple[str, bytes]:
    first = quote.strip().split("\n")[-1]
    text = (
        '<?xml version="1.0" encoding="utf-8"?>\n<testsuites>\n'
        '<testsuite name="pytest" errors="0" failures="1" skipped="0" tests="3" time="4.2">\n'
        '<testcase classname="tests.test_train" name="test_step_runs" time="1.1"/>\n'
        '<testcase classname="tests.test_train" name="test_big_batch" time="2.9">'
        f"<failure message={quoteattr(first)}>{escape(quote)}</failure></testcase>\n"
        '<testcase classname="tests.test_train" name="test_resume" time="0.2"/>\n'
        "</testsuite>\n</testsuites>\n"
    )
    return rng.choice(["junit.xml", "report.xml", "test-results.xml"]), text.encode()


def _sbatch(quote: str, rng: random.Random) -> tuple[str, bytes]:
    first = quote.strip().split("\n")[-1].replace("'", "'\\''")
    text = (
        "#!/bin/bash\n#SBATCH --job-name=train-7b\n#SBATCH --nodes=2\n"
        "#SBATCH --gres=gpu:8\n#SBATCH --time=24:00:00\n#SBATCH --output=%x-%j.out\n\n"
        "srun python train.py --deepspeed ds_config.json\n"
        'if grep -q "out of memory" "$SLURM_JOB_NAME-$SLURM_JOB_ID.out"; then\n'
        f"    echo 'the last OOM looked like: {first}' >&2\n"
        "    exit 1\nfi\n"
    )
    return rng.choice(["job.sbatch", "train.sh", "submit.slurm"]), text.encode()


BUILDERS = {
    "csv": _csv,
    "toml": _toml,
    "markdown": _markdown,
    "python": _python,
    "python_snippet": _python_snippet,
    "html": _html,
    "junit": _junit,
    "sbatch": _sbatch,
}


PASTES = frozenset({"markdown", "python_snippet"})
"""Formats that, named alone on the command line, are a ticket's paste (issue 31): Markdown
around a log, a code snippet with the output it printed in its comments; read as the log they
hold (as the field corpus' pytorch-67839 is), not documents that must stay silent.  In a run's
folder they are notes."""


def document(quote: str, rng: random.Random) -> tuple[str, str, bytes]:
    """``(format, name, bytes)``: a document of a random format quoting ``quote``."""
    how = rng.choice(sorted(BUILDERS))
    name, data = BUILDERS[how](quote, rng)
    return how, name, data
