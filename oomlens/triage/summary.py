"""Counts of a triage table: per verdict, per diagnosis, per group, largest first."""

from __future__ import annotations

import pandas

from oomlens.render.wrap import wrap
from oomlens.triage.table import VERDICT_ORDER
from oomlens.untrusted import shown

GROUP_COLUMNS = ("group", "verdict", "diagnosis", "knob", "call_site", "runs", "newest", "example")


def verdict_counts(table: pandas.DataFrame) -> list[tuple[str, int]]:
    """``(verdict, runs)`` for every verdict present, worst verdict first."""
    counts = table["verdict"].fillna("unknown").value_counts()
    rank = {verdict: i for i, verdict in enumerate(VERDICT_ORDER)}
    return sorted(
        ((str(v), int(n)) for v, n in counts.items()),
        key=lambda item: (rank.get(item[0], 99), item[0]),
    )


def diagnosis_counts(table: pandas.DataFrame) -> list[tuple[str, int]]:
    """``(top diagnosis, runs)``, most runs first; runs without a diagnosis are left out."""
    counts = table["diagnosis"].dropna().value_counts()
    return sorted(((str(d), int(n)) for d, n in counts.items()), key=lambda x: (-x[1], x[0]))


def group_table(table: pandas.DataFrame) -> pandas.DataFrame:
    """One row per group (``GROUP_COLUMNS``): failures before healthy runs, then most runs
    first, then most recent first.  ``example`` is the group's newest run."""
    if table.empty:
        return pandas.DataFrame(columns=list(GROUP_COLUMNS))
    rows = []
    for label, members in table.groupby("group", sort=False, dropna=False):
        members = members.sort_values(["time", "run"], ascending=[False, True], kind="stable")
        first = members.iloc[0]
        rows.append(
            {
                "group": label,
                "verdict": first["verdict"],
                "diagnosis": first["diagnosis"],
                "knob": first["knob"],
                "call_site": first["call_site"],
                "runs": len(members),
                "newest": first["time"],
                "example": first["run"],
            }
        )
    groups = pandas.DataFrame(rows, columns=list(GROUP_COLUMNS))
    healthy = groups["verdict"] == "no_failure"
    groups = groups.assign(_healthy=healthy).sort_values(
        ["_healthy", "runs", "newest", "group"],
        ascending=[True, False, False, True],
        kind="stable",
    )
    return groups.drop(columns="_healthy").reset_index(drop=True)


def render_summary(table: pandas.DataFrame, *, max_groups: int = 15, width: int = 0) -> str:
    """The terminal summary: totals, verdicts, diagnoses, and the largest groups; wrapped at
    ``width`` columns (0: one line each), a group's continuation under its label."""
    total = len(table)
    lines = [f"{total} run{'s' if total != 1 else ''}"]
    if total == 0:
        return lines[0] + "\n"
    errors = int(table["error"].notna().sum())
    verdicts = ", ".join(f"{n} {v}" for v, n in verdict_counts(table))
    lines[0] += f": {verdicts}"
    if errors:
        lines[0] += f"; {errors} could not be analyzed"
    diagnoses = diagnosis_counts(table)
    if diagnoses:
        lines.append("")
        lines.append("Top diagnoses:")
        digits = len(str(diagnoses[0][1]))
        lines.extend(f"  {n:>{digits}}  {d}" for d, n in diagnoses)
    groups = group_table(table)
    hang = 4
    if not groups.empty:
        lines.append("")
        lines.append("Groups, largest first (failures before healthy runs):")
        digits = len(str(int(groups["runs"].max())))
        hang = 4 + digits
        for _, group in groups.head(max_groups).iterrows():
            lines.append(
                f"  {int(group['runs']):>{digits}}  {group['group']}"
                f"  (newest: {shown(str(group['example']))})"
            )
        if len(groups) > max_groups:
            lines.append(f"  ... and {len(groups) - max_groups} more groups")
    text = printable("\n".join(lines))
    if width:
        text = "\n".join(
            piece for line in text.split("\n") for piece in wrap(line, width, hang=hang)
        )
    return text + "\n"


def printable(text: str) -> str:
    """``text`` with control characters shown escaped, so that they cannot drive the terminal;
    newlines are kept.  A name inside a line is escaped on its own first (``untrusted.shown``):
    a line feed in a directory's name must not start a line of the summary."""
    return "".join(ch if ch.isprintable() or ch == "\n" else ascii(ch)[1:-1] for ch in text)
