"""``hookviz gradcam``: CAMs of classifiers, segmentation models and detectors."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Annotated

import typer

from hookviz.cli.flags import MAPS, CamLayers, InputOpt, MaybeInputs, Methods
from hookviz.cli.options import (
    CamLook,
    CamMaps,
    MethodFlags,
    ModelOptions,
    Prompts,
    RunOptions,
    Sampling,
    cam_settings,
    grouped,
)
from hookviz.cli.runner import run_command

CamTarget = Annotated[str, typer.Option("--target", "-t", rich_help_panel=MAPS,
    help="top1, topK (top5), a class index or name, a comma list, positive (multi-label: every label "
    "whose sigmoid reaches --threshold), or label (each input's own: a table's target column, a shard "
    "sample's .cls).")]  # fmt: skip


@grouped
def gradcam(
    inputs: MaybeInputs = None,
    several: InputOpt = None,
    model: ModelOptions = ModelOptions(),
    layers: CamLayers = None,
    methods: Methods = None,
    target: CamTarget = "top1",
    maps: CamMaps = CamMaps(),
    method: MethodFlags = MethodFlags(),
    prompts: Prompts = Prompts(),
    look: CamLook = CamLook(),
    run: RunOptions = RunOptions(),
    sampling: Sampling = Sampling(),
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class.

    Segmentation models explain a class's pixels (outlined); detectors explain each box they find.
    """
    from hookviz.tasks import cam_job  # loads torch: only once the command runs

    settings = cam_settings(layers, methods, target, maps, look, method)
    if run.maps is not None:  # the raw maps go into the Zarr store
        settings = dataclasses.replace(settings, save_raw=True)
    run_command(partial(cam_job, settings), model, run, inputs, several, sampling, prompts=prompts)
