#!/usr/bin/env python3
"""oomlens on the field corpus: how often it names the cause the thread established.

Runs ``oomlens analyze <paste.txt> [ds_config.json] --format json`` on every case of
``fixtures/field_logs/`` (each in its own process, as a user would run it) and prints, held-back
test split first:

- top-1 and top-2 accuracy against ``label.diagnosis`` (or one of ``label.accepted``), and the
  verdict's accuracy, per split (test, development, whole labelled corpus);
- crashes (exit 1), pastes of a crash called ``no_failure``, OOM numbers that differ from the
  message (``oom_numbers`` as printed, converted here independently of oomlens);
- the confusion matrix (label x top-1) of the labelled cases, and every miss;
- a reliability table of the labelled cases shown: the top diagnosis' confidence, in buckets,
  against how often it is the thread's cause (``insufficient_evidence`` first, which names no
  cause, on its own line), and how many wrong answers are confident (0.6 or more);
- files that are not training logs (this repository's README, pyproject.toml, a source file,
  a CSV): each must be refused (exit 3) or answered ``unknown``, never a verdict read from prose.

A benchmark: it prints figures and asserts nothing (the corpus tests hold each case).

Usage: python bench/field_accuracy.py [--split test|dev|all] [--json FILE] [--jobs N]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "field_logs"
UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
NUMBER = re.compile(r"^\s*([0-9][0-9.,]*)\s*([A-Za-z]+)\s*$")
NOT_LOGS = ("README.md", "pyproject.toml", "oomlens/units.py", "docs/triage.md")


def printed_bytes(text: str) -> int | None:
    """``"978.00 MiB"`` -> bytes, as the message means it (independent of oomlens)."""
    match = NUMBER.match(text.replace("\u00a0", " "))
    if not match:
        return None
    unit = UNITS.get(match.group(2).lower())
    if unit is None:
        return None
    return round(float(match.group(1).replace(",", "")) * unit)


def analyze(paths: list[Path]) -> tuple[int, dict[str, Any] | None, str]:
    done = subprocess.run(
        [sys.executable, "-m", "oomlens", "analyze", *map(str, paths), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except ValueError:
        report = None
    lines = done.stderr.strip().splitlines()
    return done.returncode, report, lines[-1] if lines else ""


def case_inputs(case: Path, manifest: dict[str, Any]) -> list[Path]:
    files = manifest.get("files") or {}
    names = [files.get("paste", "paste.txt")]
    if files.get("config"):
        names.append(files["config"])
    return [case / name for name in names if (case / name).is_file()]


def run_case(case: Path) -> dict[str, Any]:
    manifest = json.loads((case / "case.json").read_text())
    code, report, last_error = analyze(case_inputs(case, manifest))
    label = manifest.get("label") or {}
    diagnoses = [d.get("id") for d in (report or {}).get("diagnoses", [])]
    events = (report or {}).get("oom_events") or []
    numbers_ok, numbers_detail = check_numbers(manifest.get("oom_numbers"), events)
    return {
        "id": case.name,
        "exit": code,
        "error": last_error if code not in (0, 3) else "",
        "verdict": (report or {}).get("verdict"),
        "top": diagnoses[:3],
        "confidence": ((report or {}).get("diagnoses") or [{}])[0].get("confidence"),
        "label_verdict": label.get("verdict"),
        "label": label.get("diagnosis"),
        "accepted": [label.get("diagnosis"), *(label.get("accepted") or [])],
        "numbers_ok": numbers_ok,
        "numbers_detail": numbers_detail,
    }


def check_numbers(
    expected: dict[str, Any] | None, events: list[dict[str, Any]]
) -> tuple[bool | None, str]:
    if not expected:
        return None, ""
    if not events:
        return False, "no OOM event read"
    event = events[0]
    wrong = []
    for key, printed in expected.items():
        if key == "device":
            if event.get("device") != printed:
                wrong.append(f"device {event.get('device')} != {printed}")
            continue
        want = printed_bytes(str(printed))
        if want is None:
            continue
        got = event.get(key)
        if got != want:
            wrong.append(f"{key} {got} != {printed}")
    return (not wrong), "; ".join(wrong)


def accuracy(rows: list[dict[str, Any]], k: int) -> tuple[int, int]:
    hits = sum(1 for r in rows if set(r["top"][:k]) & set(r["accepted"]))
    return hits, len(rows)


def pct(hits: int, total: int) -> str:
    return f"{hits}/{total} = {hits / total:.0%}" if total else "0/0"


BUCKETS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.8, 1.01)
"""Confidence buckets of the reliability table: [low, high)."""
CONFIDENT = 0.6
"""A wrong top answer at or above this confidence is the worst outcome (the corpus tests)."""


def print_reliability(rows: list[dict[str, Any]]) -> None:
    """Top-1 confidence bucket -> accuracy: is a confidence what it claims?"""
    print("\nreliability (top-1 confidence -> how often it is the thread's cause):")
    undecided = [r for r in rows if r["top"][:1] == ["insufficient_evidence"]]
    named = [r for r in rows if r not in undecided and r["top"]]
    for low, high in zip(BUCKETS, BUCKETS[1:], strict=False):
        inside = [r for r in named if low <= (r["confidence"] or 0.0) < high]
        hits = sum(1 for r in inside if r["top"][0] in r["accepted"])
        shown = f"{low:.1f}-{min(high, 1.0):.1f}"
        print(f"  {shown:9} {pct(hits, len(inside)):>14}")
    print(f"  no cause named (insufficient_evidence first): {len(undecided)}")
    wrong = [
        r["id"]
        for r in named
        if r["top"][0] not in r["accepted"] and (r["confidence"] or 0.0) >= CONFIDENT
    ]
    print(f"  wrong at confidence >= {CONFIDENT}: {len(wrong)} {wrong}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", choices=("test", "dev", "all"), default="all")
    parser.add_argument("--json", default=None, help="write every case's result here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    split = json.loads((CORPUS / "split.json").read_text())
    second = CORPUS / "split2.json"
    split2 = json.loads(second.read_text()) if second.is_file() else {"test": [], "dev": []}
    # both held-back splits are "test", both development splits "dev"
    split = {
        **split,
        "test1": split["test"],
        "dev1": split["dev"],
        "test": split["test"] + split2["test"],
        "dev": split["dev"] + split2["dev"],
    }
    cases = sorted(p for p in CORPUS.iterdir() if (p / "case.json").is_file())
    if args.split != "all":
        # Only the chosen split (and the unlabelled cases, kept for parsing): tuning on the
        # development split must not show the held-back cases' results.
        other = set(split["dev" if args.split == "test" else "test"])
        cases = [p for p in cases if p.name not in other]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_case, cases))
    by_id = {r["id"]: r for r in results}
    labelled = [r for r in results if r["label"] not in (None, "unknown")]
    if args.split != "all":
        chosen = set(split[args.split])
        labelled = [r for r in labelled if r["id"] in chosen]
    groups = {
        "test (held back)": [by_id[i] for i in split["test1"] if i in by_id],
        "test2 (held back, new)": [by_id[i] for i in split2["test"] if i in by_id],
        "development": [by_id[i] for i in split["dev1"] if i in by_id],
        "dev2 (development, new)": [by_id[i] for i in split2["dev"] if i in by_id],
        "all labelled": labelled,
    }
    print(f"field corpus: {len(results)} cases run, {len(labelled)} labelled in the split shown")
    for name, rows in groups.items():
        if args.split == "test" and not name.startswith("test"):
            continue
        if args.split == "dev" and not name.startswith("dev"):
            continue
        verdicts = sum(1 for r in rows if r["verdict"] == r["label_verdict"])
        print(
            f"  {name:24} top-1 {pct(*accuracy(rows, 1)):>14}   "
            f"top-2 {pct(*accuracy(rows, 2)):>14}   verdict {pct(verdicts, len(rows)):>14}"
        )
    crashes = [r for r in results if r["exit"] not in (0, 3)]
    no_failure = [r for r in results if r["verdict"] == "no_failure"]
    numbers = [r for r in results if r["numbers_ok"] is not None]
    wrong_numbers = [r for r in numbers if not r["numbers_ok"]]
    print(f"  crashes (exit not 0/3): {len(crashes)}")
    for r in crashes:
        print(f"    {r['id']}: exit {r['exit']}: {r['error'][:160]}")
    print(f"  crash text called no_failure: {len(no_failure)} {[r['id'] for r in no_failure]}")
    exact = len(numbers) - len(wrong_numbers)
    print(f"  OOM messages with numbers: {len(numbers)}, exact: {exact}")
    for r in wrong_numbers:
        print(f"    {r['id']}: {r['numbers_detail'][:200]}")

    print("\nnot training logs (must be exit 3 or verdict unknown):")
    for name in NOT_LOGS:
        code, report, _ = analyze([ROOT / name])
        verdict = (report or {}).get("verdict")
        ok = code == 3 or verdict == "unknown"
        print(f"  {'ok ' if ok else 'BAD'} {name}: exit {code}, verdict {verdict}")

    print("\nconfusion (label -> top-1), labelled cases:")
    confusion: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in labelled:
        confusion[r["label"]][r["top"][0] if r["top"] else "(none)"] += 1
    for label in sorted(confusion):
        cells = ", ".join(f"{pred} {n}" for pred, n in confusion[label].most_common())
        print(f"  {label:26} {cells}")

    print_reliability(labelled)

    test_ids = set(split["test"])
    new_ids = set(split2["test"]) | set(split2["dev"])
    print("\nmisses (top-1 not the thread's label), test split first:")
    misses = [r for r in labelled if not set(r["top"][:1]) & set(r["accepted"])]
    for r in sorted(misses, key=lambda r: (r["id"] not in test_ids, r["id"])):
        where = ("test" if r["id"] in test_ids else "dev ") + ("2" if r["id"] in new_ids else " ")
        print(
            f"  [{where}] {r['id']:34} label {r['label']:24} got {r['top'][:2]} "
            f"({r['verdict']}, {r['confidence']})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
