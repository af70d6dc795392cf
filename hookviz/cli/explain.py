"""``hookviz gradcam``: CAMs of classifiers, segmentation models and detectors."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.explore import _model_words
from hookviz.cli.flags import MAPS, CamLayers, InputOpt, MaybeInputs
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

if TYPE_CHECKING:
    from hookviz.jobs.build import JobFactory

CamMethods = Annotated[list[str] | None, typer.Option("--method", rich_help_panel=MAPS,
    help="method, all (every cheap one: at most a forward and two backward passes per target) or a "
    "family: gradient, activation, cams, perturbation, pixel, control, attention (transformers); "
    "repeatable or comma-separated (default gradcam). docs/methods.md gives each one's cost. auto: the "
    "method and layer recommended by a hookviz trust run of this model and weights (--trust DIR, else one in "
    "--out, else one made now on the first 8 photos and kept in OUT/trust.KEY/); exit 4 when it trusts "
    "none.")]  # fmt: skip
TrustDir = Annotated[Path | None, typer.Option("--trust", rich_help_panel=MAPS, help="--method auto: the "
    "--out folder of a hookviz trust run of this model and weights.")]  # fmt: skip
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
    methods: CamMethods = None,
    target: CamTarget = "top1",
    maps: CamMaps = CamMaps(),
    method: MethodFlags = MethodFlags(),
    prompts: Prompts = Prompts(),
    look: CamLook = CamLook(),
    run: RunOptions = RunOptions(),
    sampling: Sampling = Sampling(),
    trust: TrustDir = None,
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class.

    Segmentation models explain a class's pixels (outlined); detectors explain each box they find.
    """
    # torch first, from the top of the import stack (tests/test_cli.py): nested under run.verdicts' chain,
    # the import-time loops of torch and torchvision (torch.distributed.tensor._ops) ran at a depth where
    # CPython 3.11 maps and unmaps a frame-stack chunk on nearly every call (27,000 more, 0.3 s a run).
    from hookviz.tasks import cam_job  # loads torch: only once the command runs

    settings = cam_settings(layers, methods, target, maps, look, method)
    if run.maps is not None:  # the raw maps go into the Zarr store
        settings = dataclasses.replace(settings, save_raw=True)
    factory: JobFactory = partial(cam_job, settings)
    from hookviz.run.verdicts import wants_auto  # after torch (above)

    if wants_auto(settings):
        factory = _auto(settings, trust, run, inputs or [], model)
    elif trust is not None:
        raise typer.BadParameter("goes with --method auto", param_hint="--trust")
    run_command(factory, model, run, inputs, several, sampling, prompts=prompts)


def _auto(
    settings: Any, trust: Path | None, run: RunOptions, photos: list[str], model: ModelOptions
) -> JobFactory:
    """``--method auto``'s job factory: the trust run's choice, said on stderr (even with -q: a result)."""
    from hookviz.run.verdicts import auto_job

    out, quiet = run.out, run.quiet

    def factory(loaded: Any, context: Any) -> Any:
        say = None if quiet else lambda text: typer.echo(f"hookviz: note: {text}", err=True)
        built, choice = auto_job(settings, loaded, context, trust=trust, out=out, photos=photos,
                                 model_words=_model_words(model), note=say)  # fmt: skip
        typer.echo(f"hookviz: {choice.line()}", err=True)
        return built

    return factory
