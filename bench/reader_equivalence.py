"""Every corpus case gives the same report with this tree's code as with another revision's
(issue 15: the bulk path and the parallel scan change no report).

The other revision's ``oomlens`` package is exported with ``git archive`` into a temporary
directory (nothing in this checkout changes); each side analyzes every case of
``fixtures/crash_logs`` (the case directory) and ``fixtures/field_logs`` (the paste and its
config, as ``tests/corpus/test_field_reading.py`` reads them) in a fresh process, and the JSON
reports are compared whole, less the keys that measure time spent (``TIMING_KEYS``).  Twice:
the inputs read as their size has them (the corpus's logs are small: line by line), then read
as large logs are (the other revision's per-line fast pass against this one's bulk path and
worker processes).

    python bench/reader_equivalence.py [--ref main] [--jobs 2]
    python bench/reader_equivalence.py --padded [--seed 32]

Prints one line per differing case (the first differing paths) and a summary; exits 1 when a
case differs.

``--padded`` (issue 33's class of wrong answers): this tree alone, every field paste analyzed
as it is (read line by line) and padded past 1 MiB with a healthy corpus run's lines before it
(``tests.fuzz.shapes.pad``: read in bulk), the verdicts compared: a failure read as
``no_failure`` or refused, or an OOM read as another verdict at high confidence, is wrong
(``tests.fuzz.oracles.direction``); other changes are listed (the padding is a run's evidence
too: its caught OOMs, its steps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "as_is": "read as their size has them",
    "large": "read as large logs (the bulk path, a batch per block, --jobs worker processes)",
}
TIMING_KEYS = frozenset({"elapsed", "elapsed_s", "seconds", "duration", "duration_s"})

ANALYZE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from oomlens.errors import NoUsableInputError
from oomlens.render.json import report_to_dict
from oomlens.session import AnalysisOptions, analyze

root, jobs, large, out = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "large", {}
if large:  # every log read as a large one is (not line by line): the bulk path at work
    from oomlens.ingest.log import reader
    reader.LINE_BY_LINE_BYTES = 0
    if jobs:
        from oomlens.ingest.log import batches
        batches.PARALLEL_MIN_BYTES, batches.BATCH_BLOCKS = 0, 1
crash, field = root / "fixtures" / "crash_logs", root / "fixtures" / "field_logs"
cases = []
for case in sorted(p for p in crash.iterdir() if (p / "case.json").is_file()):
    options = AnalysisOptions(log_jobs=jobs) if jobs else AnalysisOptions()
    cases.append(("crash/" + case.name, [case], options))
for case in sorted(p for p in field.iterdir() if (p / "case.json").is_file()):
    files = json.loads((case / "case.json").read_text()).get("files") or {}
    names = [files.get("paste", "paste.txt"), *([files["config"]] if files.get("config") else [])]
    paths = [case / n for n in names if (case / n).is_file()]
    cases.append(("field/" + case.name, paths, AnalysisOptions(prefer_deepspeed=False)))
for name, paths, options in cases:
    try:
        out[name] = report_to_dict(analyze(paths, options=options))
    except NoUsableInputError as exc:
        out[name] = {"no_usable_input": str(exc)}
print(json.dumps(out, default=str))
"""


def _reports(package_root: Path, jobs: int, mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", ANALYZE, str(package_root), str(ROOT), str(jobs), mode],
        check=True,
        capture_output=True,
        text=True,
    )
    reports: dict[str, Any] = json.loads(done.stdout)
    return reports


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                found.append(f"{path}/{key}: only in {'ours' if key in a else 'theirs'}")
            else:
                found += _differences(a[key], b[key], f"{path}/{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {str(a)[:80]!r} != {str(b)[:80]!r}"]


PADDED = """
import json, random, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from oomlens.errors import NoUsableInputError
from oomlens.render.json import report_to_dict
from oomlens.session import AnalysisOptions, analyze
from tests.fuzz import seeds, shapes

root, seed, work = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rng = random.Random(seed)
healthy = [r / "train.log" for r in seeds.healthy_runs()]
out = {}

def verdict(path):
    try:
        doc = report_to_dict(analyze([path], options=AnalysisOptions(prefer_deepspeed=False)))
    except NoUsableInputError:
        return None
    top = (doc.get("diagnoses") or [{}])[0]
    return [str(doc["verdict"]), float(top.get("confidence", 0.0))]

for case in sorted(p for p in (root / "fixtures" / "field_logs").iterdir() if p.is_dir()):
    if not (case / "case.json").is_file():
        continue
    files = json.loads((case / "case.json").read_text()).get("files") or {}
    paste = case / files.get("paste", "paste.txt")
    if not paste.is_file():
        continue
    padded = work / (case.name + ".txt")
    padded.write_bytes(shapes.pad(paste.read_bytes(), rng, rng.choice(healthy).read_bytes()))
    out[case.name] = [verdict(paste), verdict(padded)]
print(json.dumps(out))
"""
FAILURES = frozenset({"gpu_oom", "host_oom", "config_error", "other_failure"})


def _wrong(alone: list[Any] | None, padded: list[Any] | None) -> bool:
    """``tests.fuzz.oracles.direction``'s rule for a meaning-preserving change."""
    if alone is None or alone[0] not in FAILURES:
        return False
    if padded is None or padded[0] == "no_failure":
        return True
    oom = alone[0] in ("gpu_oom", "host_oom")
    return oom and padded[0] not in (alone[0], "unknown") and padded[1] >= 0.7


def padded(seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="oomlens-padded-") as work:
        done = subprocess.run(
            [sys.executable, "-c", PADDED, str(ROOT), str(seed), work],
            check=True,
            capture_output=True,
            text=True,
        )
    verdicts: dict[str, list[Any]] = json.loads(done.stdout)
    wrong = changed = 0
    for name, (alone, after) in sorted(verdicts.items()):
        if alone != after:
            changed += 1
            bad = _wrong(alone, after)
            wrong += bad
            print(f"{'WRONG ' if bad else ''}{name}: alone {alone}, padded {after}")
    print(
        f"{len(verdicts)} field pastes, padded past 1 MiB (seed {seed}): {changed} verdicts "
        f"changed, {wrong} in the wrong direction"
    )
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="main", help="the revision to compare with")
    parser.add_argument("--jobs", type=int, default=2, help="this tree's --jobs for the logs")
    parser.add_argument("--padded", action="store_true", help="pastes alone against padded")
    parser.add_argument("--seed", type=int, default=32, help="--padded: the padding's seed")
    args = parser.parse_args()
    if args.padded:
        return padded(args.seed)
    with tempfile.TemporaryDirectory(prefix="oomlens-ref-") as theirs:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.ref, "oomlens"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", theirs], input=archive, check=True)
        # 0: its default (no --jobs before issue 15)
        references = {mode: _reports(Path(theirs), 0, mode) for mode in MODES}
    differing = 0
    for mode, reference in references.items():
        ours = _reports(ROOT, args.jobs, mode)
        here = 0
        for name in sorted(set(ours) | set(reference)):
            found = _differences(_strip(ours.get(name)), _strip(reference.get(name)))
            if found:
                here += 1
                print(f"{mode} {name}: {len(found)} difference(s): " + "; ".join(found[:3]))
        print(
            f"{MODES[mode]}: {len(ours)} cases ({sum(n.startswith('crash/') for n in ours)} "
            f"crash, {sum(n.startswith('field/') for n in ours)} field): {len(ours) - here} the "
            f"same as {args.ref}, {here} differ"
        )
        differing += here
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
