"""``python -m tests.golden [--update] [CASE...]``: compare (or rewrite) the golden reports.

Without ``--update`` it lists the outputs that differ from their golden files and exits 1 when
any does; with ``--update`` it rewrites them (and removes golden files no case produces any
more, when every case is rendered).
"""

from __future__ import annotations

import argparse
import difflib
import sys

from tests.golden._outputs import GOLDEN_DIR, cases, golden_outputs, stored_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__)
    parser.add_argument("--update", action="store_true", help="rewrite the golden files")
    parser.add_argument("cases", nargs="*", help="only these cases (default: all)")
    args = parser.parse_args(argv)
    chosen = args.cases or cases()
    produced: set[str] = set()
    differ = 0
    for case in chosen:
        for relative, produce in golden_outputs(case):
            produced.add(relative)
            path = GOLDEN_DIR / relative
            text = produce()
            old = path.read_text(encoding="utf-8") if path.exists() else None
            if old == text:
                continue
            differ += 1
            if args.update:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                print(f"{'wrote' if old is not None else 'new'} {relative}")
            else:
                print(f"differs: {relative}")
                diff = difflib.unified_diff(
                    (old or "").splitlines(), text.splitlines(), "golden", "now", lineterm="", n=1
                )
                print("\n".join(list(diff)[:40]))
    if not args.cases:
        for stale in sorted(stored_files() - produced):
            if args.update:
                (GOLDEN_DIR / stale).unlink()
                print(f"removed {stale}")
            else:
                differ += 1
                print(f"stale: {stale}")
    print(f"{differ} output(s) {'rewritten' if args.update else 'differ'}", file=sys.stderr)
    return 0 if args.update or not differ else 1


if __name__ == "__main__":
    sys.exit(main())
