"""Training-time hooks: ``gradflow`` (gradient norms) and ``dropblock``."""

from __future__ import annotations

from typing import Annotated

import typer

from hookviz.cli.flags import MAPS, BlockLayer, FlowLayers, Inputs
from hookviz.cli.options import DATA, ModelOptions, PlainModel, RunOptions, grouped, omit
from hookviz.cli.runner import run_command

#: What these commands take of the run options (one image at a time, no report, no video).
TrainingRun = Annotated[RunOptions, omit("batch_size", "workers", "report", *DATA)]

FlowTarget = Annotated[str, typer.Option("--target", "-t", rich_help_panel=MAPS,
    help="top1 or a class (index or name) whose score is differentiated.")]  # fmt: skip
FlowLabel = Annotated[str | None, typer.Option("--label", rich_help_panel=MAPS,
    help="use cross-entropy against this class (index or name) instead.")]  # fmt: skip


@grouped
def gradflow(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    target: FlowTarget = "top1",
    label: FlowLabel = None,
    layers: FlowLayers = None,
    run: TrainingRun = RunOptions(),
) -> None:
    """Gradient norms per layer, in network order (log scale), from one backward per image; PNG + JSON."""
    from hookviz.jobs.build import made_by  # loads torch: only once the command runs
    from hookviz.jobs.training import gradflow_job

    run_command(made_by(gradflow_job, target=target, label=label, layers=layers), model, run, inputs)


DropProb = Annotated[float, typer.Option("--drop-prob", min=0.0, max=0.99, help="expected dropped fraction.",
    rich_help_panel=MAPS)]  # fmt: skip
BlockSize = Annotated[int, typer.Option("--block-size", min=1, help="side of the dropped squares.",
    rich_help_panel=MAPS)]  # fmt: skip
Shared = Annotated[bool, typer.Option("--shared", help="one mask for all channels.", rich_help_panel=MAPS)]
MaskSeed = Annotated[int, typer.Option("--seed", help="seed of the mask.", rich_help_panel=MAPS)]
Shown = Annotated[int, typer.Option("--max-channels", min=1, help="channels shown.", rich_help_panel=MAPS)]


@grouped
def dropblock(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    layer: BlockLayer = None,
    drop_prob: DropProb = 0.1,
    block_size: BlockSize = 7,
    shared: Shared = False,
    seed: MaskSeed = 0,
    max_channels: Shown = 16,
    run: TrainingRun = RunOptions(),
) -> None:
    """What DropBlock does to a layer: its feature maps before, the keep mask, and after (one PNG)."""
    from hookviz.jobs.build import made_by  # loads torch: only once the command runs
    from hookviz.jobs.training import dropblock_job

    job = made_by(dropblock_job, layer=layer, drop_prob=drop_prob, block_size=block_size, shared=shared,
                  seed=seed, max_channels=max_channels)  # fmt: skip
    run_command(job, model, run, inputs)
