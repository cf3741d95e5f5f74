"""Gather a run's inputs and read each with the reader of its kind.

``collect_inputs(paths, config=...)`` turns what the user gave (files and run directories) into
``FoundInput``\\ s, each recognised by content (``oomlens.ingest.detect``), plus the lines for
what could not be used.  ``read_inputs(found, options)`` reads them kind by kind, in the
registry's order, each with its kind's reader (``oomlens.ingest.kinds``), and yields one
``InputRead`` per file: its facts for the kind's slot, or the one-line problem that kept it out.
Nothing here raises for a bad file; the others are still read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from oomlens.errors import InputError
from oomlens.facts.run import InputReport
from oomlens.ingest import kinds
from oomlens.ingest.detect import accept, detect_kind, discover_run
from oomlens.ingest.kinds import FoundInput, InputKind, ReadOptions, kind

UNREADABLE = "unreadable"
"""``InputReport.kind`` of a file whose kind could not be told."""


@dataclass(frozen=True, slots=True)
class InputRead:
    """One file read (or not): ``facts`` go to ``kind.slot``; ``report`` lists the file."""

    found: FoundInput
    facts: tuple[object, ...]
    report: InputReport

    @property
    def kind(self) -> InputKind:
        return self.found.kind


def collect_inputs(
    paths: Sequence[str | os.PathLike[str]], *, config: str | os.PathLike[str] | None = None
) -> tuple[list[FoundInput], list[InputReport]]:
    """The files to read among ``paths`` (run directories are searched), and a report line for
    each path that gives nothing.  ``config`` is the ds_config named on the command line: it
    is the run's, whatever else is found."""
    files: list[FoundInput] = []
    reports: list[InputReport] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                found = discover_run(path)
            except InputError as exc:
                reports.append(InputReport(exc.path, "directory", exc.problem, problem=exc.message))
                continue
            if not found.files:
                shown = os.fspath(path)
                names = [k.label.split(" ", 1)[1] for k in kinds.KINDS]
                reports.append(
                    InputReport(
                        shown,
                        "directory",
                        "nothing recognisable",
                        problem=f"{shown}: holds no {', '.join(names[:-1])} or {names[-1]}; "
                        "point oomlens at the run's output directory",
                    )
                )
            files.extend(found.files)
        else:
            shown = os.fspath(path)
            try:
                detection = detect_kind(path)
            except InputError as exc:
                reports.append(InputReport(exc.path, UNREADABLE, exc.problem, problem=exc.message))
                continue
            except Exception as exc:  # noqa: BLE001 - see read_one
                reports.append(failed_input(shown, UNREADABLE, exc))
                continue
            accepted = accept(detection, named_by_user=True, name=os.path.basename(shown))
            if accepted is None:
                problem = InputError(
                    shown,
                    f"is not an input oomlens reads: {detection.reason}",
                    "pass " + ", ".join(k.label for k in kinds.KINDS),
                )
                reports.append(
                    InputReport(shown, UNREADABLE, problem.problem, problem=problem.message)
                )
                continue
            files.append(FoundInput(shown, accepted[0], accepted[1]))
    if config is not None:
        shown = os.fspath(config)
        files = [f for f in files if os.path.abspath(f.path) != os.path.abspath(shown)]
        files.insert(0, FoundInput(shown, kind("ds_config"), "named with --config"))
    return files, reports


def read_inputs(files: Iterable[FoundInput], options: ReadOptions) -> Iterator[InputRead]:
    """Read ``files`` kind by kind (the registry's order), in their order within a kind."""
    files = list(files)
    for input_kind in kinds.KINDS:
        first: FoundInput | None = None
        for found in (f for f in files if f.kind is input_kind):
            if first is not None and input_kind.one_per_run:
                yield InputRead(
                    found,
                    (),
                    InputReport(
                        found.path,
                        input_kind.id,
                        "ignored",
                        problem=f"{found.path}: a second {input_kind.id}; only {first.path} is "
                        f"used ({input_kind.one_per_run})",
                    ),
                )
                continue
            first = first or found
            yield read_one(found, options)


def failed_input(path: str, kind_id: str, exc: BaseException) -> InputReport:
    """The report line of an input that oomlens failed on (a bug, not the file's fault): the
    other inputs are still analyzed, and the line says what to report."""
    return InputReport(
        path,
        kind_id,
        "internal error",
        problem=f"{path}: internal error while reading it: {type(exc).__name__}: "
        f"{str(exc)[:200]} (a bug in oomlens; please report it with the file)",
    )


def read_one(found: FoundInput, options: ReadOptions) -> InputRead:
    """Read one file with its kind's reader; a failure becomes the report's problem."""
    kind_id = found.kind.id
    try:
        reading = found.kind.read(found, options)
    except InputError as exc:
        return InputRead(
            found, (), InputReport(found.path, kind_id, exc.problem, problem=exc.message)
        )
    except OSError as exc:
        return InputRead(
            found,
            (),
            InputReport(
                found.path,
                kind_id,
                "unreadable",
                problem=f"{found.path}: cannot be read ({exc.strerror or exc})",
            ),
        )
    except Exception as exc:  # noqa: BLE001 - a reader's bug costs its own input, not the run
        return InputRead(found, (), failed_input(found.path, kind_id, exc))
    report = InputReport(
        found.path,
        kind_id,
        reading.detail,
        problem=reading.problem,
        notes=reading.notes,
        rank=reading.rank,
    )
    return InputRead(found, reading.facts, report)
