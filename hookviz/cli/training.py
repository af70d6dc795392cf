"""Training-time hooks: ``gradflow`` (gradient norms) and ``dropblock``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hookviz.cli.app import (
    MAPS,
    Debug,
    Device,
    Inputs,
    JsonOut,
    Labels,
    MaxMemory,
    MaxPixels,
    MeanOpt,
    Model,
    Null,
    Out,
    Overwrite,
    Quiet,
    ResizeOpt,
    SkipExisting,
    StdOpt,
    TrustPickle,
    Weights,
    WeightsKey,
    _guard,
)
from hookviz.cli.groups import model_options, run_options
from hookviz.cli.kinds import InputSize
from hookviz.cli.runner import _Reporter, _run_job
from hookviz.models.classes import parse_target

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models.loaded import LoadedModel


def gradflow(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    weights_key: WeightsKey = None,
    labels: Labels = None,
    input_size: InputSize = None,
    resize: ResizeOpt = None,
    mean: MeanOpt = None,
    std: StdOpt = None,
    trust_pickle: TrustPickle = False,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            "-t",
            help="top1 or a class (index or name) whose score is differentiated.",
            rich_help_panel=MAPS,
        ),
    ] = "top1",
    label: Annotated[
        str | None,
        typer.Option(
            "--label",
            help="use cross-entropy against this class (index or name) instead.",
            rich_help_panel=MAPS,
        ),
    ] = None,
    layers: Annotated[
        list[str] | None,
        typer.Option(
            "--layers",
            "-l",
            help="names or globs (default: every module with parameters).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    max_memory: MaxMemory = None,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """Gradient norms per layer, in network order (log scale), from one backward per image; PNG + JSON."""
    p = locals()
    m, r = model_options(p), run_options(p, batch_size=8, workers=2)
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz import tasks

            tasks.refuse(loaded, "gradflow")
            from hookviz.core.layers import resolve_layers
            from hookviz.jobs import GradFlowJob
            from hookviz.models.loaded import num_classes

            n = num_classes(loaded)
            names = resolve_layers(loaded.model, layers, model_name=loaded.name) if layers else None
            lab = parse_target(label, loaded, n, "--label") if label is not None else None
            if label is not None and lab is None:
                raise typer.BadParameter("give a class index or name", param_hint="--label")
            return GradFlowJob(loaded=loaded, target=parse_target(target, loaded, n), label=lab, layers=names)

        _run_job(make, m, r)


def dropblock(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    weights_key: WeightsKey = None,
    labels: Labels = None,
    input_size: InputSize = None,
    resize: ResizeOpt = None,
    mean: MeanOpt = None,
    std: StdOpt = None,
    trust_pickle: TrustPickle = False,
    layer: Annotated[
        str | None,
        typer.Option(
            "--layer",
            "-l",
            help="module whose output gets DropBlock (default: the default CAM layer).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    drop_prob: Annotated[
        float,
        typer.Option(
            "--drop-prob", min=0.0, max=0.99, help="expected dropped fraction.", rich_help_panel=MAPS
        ),
    ] = 0.1,
    block_size: Annotated[
        int, typer.Option("--block-size", min=1, help="side of the dropped squares.", rich_help_panel=MAPS)
    ] = 7,
    shared: Annotated[
        bool, typer.Option("--shared", help="one mask for all channels.", rich_help_panel=MAPS)
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of the mask.", rich_help_panel=MAPS)] = 0,
    max_channels: Annotated[
        int, typer.Option("--max-channels", min=1, help="channels shown.", rich_help_panel=MAPS)
    ] = 16,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    max_memory: MaxMemory = None,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """What DropBlock does to a layer: its feature maps before, the keep mask, and after (one PNG)."""
    p = locals()
    m, r = model_options(p), run_options(p, batch_size=8, workers=2)
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz.core.layers import default_cam_layer, is_pattern, output_layers
            from hookviz.jobs import DropBlockJob
            from hookviz.models.loaded import probe

            calls = probe(loaded)
            chosen = layer or default_cam_layer(loaded.model, calls)
            if is_pattern(chosen):
                raise typer.BadParameter("takes one module name, not a pattern", param_hint="--layer")
            (name,) = output_layers(loaded.model, [chosen], calls, loaded.name)
            return DropBlockJob(
                loaded=loaded,
                layer=name,
                drop_prob=drop_prob,
                block_size=block_size,
                shared=shared,
                seed=seed,
                max_channels=max_channels,
            )

        _run_job(make, m, r)
