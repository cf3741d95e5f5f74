"""``oomlens check``: pre-flight a ds_config before burning GPU hours.

The command line of ``oomlens.session.check_config`` (``oomlens.analysis.preflight`` says what
it checks), rendered by the same renderers as ``analyze``.  Exit status: 0 when the config is
valid and fits, 4 when it is invalid, cannot fit or cannot be read (an empty file included),
so it can gate a launch script, 2 for a bad command line.
"""

from __future__ import annotations

from pathlib import Path

import click

from oomlens.cli.params import COUNT, SIZE, SIZE_HELP, SIZE_OR_ZERO, WIDTH_HELP, output_width
from oomlens.errors import ExitCode, InputError, OomlensError
from oomlens.facts.memory_model import DEFAULT_PROCESS_BASELINE_BYTES
from oomlens.render.registry import formats_for


@click.command("check")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--params", type=COUNT, help="Total parameter count, with its suffix: 7B, 350M (or 7e9)."
)
@click.option(
    "--trainable-params", type=COUNT, help="Trainable parameters, if fewer (LoRA, frozen layers)."
)
@click.option(
    "--largest-layer", type=COUNT, help="Parameters of the largest module (often the embedding)."
)
@click.option(
    "--hidden-size", type=int, help='Model hidden size: resolves HF "auto" bucket values.'
)
@click.option(
    "--gpus", type=click.IntRange(min=1), help="Data-parallel GPUs (the DeepSpeed world size)."
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    help="GPUs per host (default: --gpus, at most 8).",
)
@click.option("--gpu-memory", type=SIZE, help=f"Memory of one GPU: 80GiB. {SIZE_HELP}")
@click.option(
    "--host-memory",
    type=SIZE,
    help=f"RAM of one host, or its container limit: 512GiB. {SIZE_HELP}",
)
@click.option(
    "--host-baseline",
    type=SIZE_OR_ZERO,
    default=DEFAULT_PROCESS_BASELINE_BYTES,
    show_default="1.2 GB, measured on torch 2.11/CUDA 13",
    help="Host memory each rank uses besides DeepSpeed's buffers (Python, libraries, CUDA). "
    + SIZE_HELP,
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    help='Training precision, to resolve "auto" in fp16/bf16 (the HF Trainer\'s --bf16/--fp16).',
)
@click.option(
    "--integration",
    type=click.Choice(["hf", "accelerate", "deepspeed"]),
    help="Who launches with this config: the HF Trainer, Accelerate, or DeepSpeed directly.",
)
@click.option(
    "--validator",
    type=click.Choice(["auto", "deepspeed", "oomlens"]),
    default="auto",
    show_default=True,
    help="Validate with DeepSpeed's models (when installed) or oomlens' restatement of them.",
)
@click.option(
    "--seq-len", type=click.IntRange(min=1), help="Sequence length (activation estimate)."
)
@click.option(
    "--layers", type=click.IntRange(min=1), help="Transformer layers (activation estimate)."
)
@click.option("--vocab-size", type=click.IntRange(min=1), help="Vocabulary size (logits estimate).")
@click.option(
    "--micro-batch",
    type=click.IntRange(min=1),
    help='Micro batch per GPU, when the config\'s is "auto" (activation estimate).',
)
@click.option(
    "--activation-checkpointing",
    is_flag=True,
    help="The model checkpoints every layer's activations (activation estimate).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice([f.value for f in formats_for("check")]),
    default="text",
    show_default=True,
)
@click.option("--width", type=click.IntRange(min=0), default=None, metavar="N", help=WIDTH_HELP)
def check(
    config: Path,
    params: int | None,
    trainable_params: int | None,
    largest_layer: int | None,
    hidden_size: int | None,
    gpus: int | None,
    gpus_per_node: int | None,
    gpu_memory: int | None,
    host_memory: int | None,
    host_baseline: int,
    precision: str | None,
    integration: str | None,
    validator: str,
    seq_len: int | None,
    layers: int | None,
    vocab_size: int | None,
    micro_batch: int | None,
    activation_checkpointing: bool,
    output_format: str,
    width: int | None,
) -> None:
    """Check a DeepSpeed config before launch: validity, batch arithmetic, memory budget.

    Exits 0 when the config is valid and fits, 4 when it is invalid, cannot fit, or cannot be
    read (missing, empty, not JSON/Hjson).
    """
    if trainable_params is not None and params is not None and trainable_params > params:
        raise click.BadParameter("--trainable-params is larger than --params")
    if largest_layer is not None and params is not None and largest_layer > params:
        raise click.BadParameter("--largest-layer is larger than --params")
    from oomlens.render.registry import Format, RenderOptions, render
    from oomlens.session import check_config

    try:
        check = check_config(
            str(config),
            params=params,
            trainable_params=trainable_params,
            largest_layer=largest_layer,
            hidden_size=hidden_size,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            gpu_memory=gpu_memory,
            host_memory=host_memory,
            precision=precision,
            integration=integration,
            validator=validator,
            seq_len=seq_len,
            layers=layers,
            vocab_size=vocab_size,
            micro_batch=micro_batch,
            activation_checkpointing=activation_checkpointing,
            host_baseline=host_baseline,
        )
    except InputError as err:
        err.exit_code = ExitCode.CHECK_FAILED
        if output_format == "json":
            # A reader of the JSON (a launch gate) gets a document whatever went wrong.
            from oomlens import __version__
            from oomlens.render.json import check_error_json

            click.echo(
                check_error_json(str(config), err.message, int(err.exit_code), __version__),
                nl=False,
            )
        raise
    shown = RenderOptions(width=output_width(width))
    click.echo(render(check, Format(output_format), shown), nl=False)
    if check.preflight.failed:
        raise OomlensError(
            f"check failed: {check.preflight.verdict()}", exit_code=ExitCode.CHECK_FAILED
        )
