"""``oomlens whatif SNAPSHOT``: replay the recorded allocations under other allocator settings
and memory limits, and say whether the run would have fitted (``oomlens.session.what_if``),
rendered through ``oomlens.render.registry`` like every other report.

Exit status: 0 when the replay ran (whatever it predicts); 2 for an ``--alloc-conf`` torch
would refuse or a bad option; 3 for a snapshot that cannot be read or holds no history.
"""

from __future__ import annotations

import click

from oomlens.cli.params import SIZE, WIDTH_HELP, output_width
from oomlens.render.registry import formats_for
from oomlens.untrusted import one_line


@click.command("whatif")
@click.argument("snapshot", type=click.Path())
@click.option(
    "--alloc-conf",
    "alloc_confs",
    multiple=True,
    metavar="CONF",
    help="A PYTORCH_CUDA_ALLOC_CONF value to replay (repeatable; one row each). Default: "
    "the recorded setting plus expandable segments, a few max_split_size_mb values and "
    "garbage_collection_threshold.",
)
@click.option(
    "--allowed",
    type=SIZE,
    default=None,
    help="Predict under this memory limit (40GiB: a smaller card or a memory fraction) "
    "instead of the one the recording shows.",
)
@click.option(
    "--device",
    type=click.IntRange(min=0),
    default=None,
    help="The device to replay (default: the one that ran out).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice([f.value for f in formats_for("whatif")]),
    default=None,
    help="Output format (default: json for an -o file ending .json, else text).",
)
@click.option("-o", "--output", type=click.Path(), default=None, help="Write to this file instead.")
@click.option("--width", type=click.IntRange(min=0), default=None, metavar="N", help=WIDTH_HELP)
def whatif_command(
    snapshot: str,
    alloc_confs: tuple[str, ...],
    allowed: int | None,
    device: int | None,
    fmt: str | None,
    output: str | None,
    width: int | None,
) -> None:
    """Replay a snapshot's recorded allocations through a model of PyTorch's caching
    allocator under other settings, after checking that the model reproduces the recording."""
    from oomlens.cli.analyze import write_output
    from oomlens.render.registry import Format, RenderOptions, render
    from oomlens.session import what_if

    report = what_if(snapshot, alloc_confs, device=device, allowed=allowed)
    if fmt is None:
        fmt = "json" if output is not None and output.lower().endswith(".json") else "text"
    if output is not None:
        # a file is wrapped only when asked: it is read with grep and diff
        write_output(output, render(report, Format(fmt), RenderOptions(width=width or 0)))
        click.echo(f"oomlens whatif: written to {one_line(output)}", err=True)
        return
    click.echo(render(report, Format(fmt), RenderOptions(width=output_width(width))), nl=False)
