"""``hookviz gradcam``: CAMs of classifiers, segmentation models and detectors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.app import (
    DENSE,
    MAPS,
    OUTPUT,
    RUN,
    BatchSize,
    Debug,
    Device,
    Inputs,
    InputSize,
    JsonOut,
    Labels,
    MaxPixels,
    MeanOpt,
    Methods,
    Model,
    Null,
    Out,
    Overwrite,
    Quiet,
    ReportOpt,
    ResizeOpt,
    SkipExisting,
    StdOpt,
    TrustPickle,
    Weights,
    WeightsKey,
    Workers,
    _guard,
)
from hookviz.cli.runner import ModelOptions, RunOptions, _Reporter, _rgb, _run_job
from hookviz.options import Colormap, Fuse, Normalize, Region


def gradcam(
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
    layers: Annotated[
        list[str] | None,
        typer.Option(
            "--layer",
            "-l",
            help="module name; repeatable (default: the last convolutional stage); auto: the most faithful "
            "of the candidate layers on the first images (--probe).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    methods: Methods = None,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            "-t",
            help="top1, topK (top5), a class index or name, or a comma list.",
            rich_help_panel=MAPS,
        ),
    ] = "top1",
    normalize: Annotated[
        Normalize,
        typer.Option(
            "--normalize",
            help="image: each map min-max; batch: one scale per batch; none: the fixed scale 0..--vmax.",
            rich_help_panel=MAPS,
        ),
    ] = Normalize.image,
    vmax: Annotated[
        float | None,
        typer.Option(
            "--vmax", help="with --normalize none: the map value drawn as full colour.", rich_help_panel=MAPS
        ),
    ] = None,
    fuse: Annotated[
        Fuse | None, typer.Option("--fuse", help="also fuse the maps of all layers.", rich_help_panel=MAPS)
    ] = None,
    sheet: Annotated[
        bool | None,
        typer.Option(
            "--sheet/--no-sheet", help="comparison sheet (default: when >1 map).", rich_help_panel=OUTPUT
        ),
    ] = None,
    probe_images: Annotated[
        int,
        typer.Option(
            "--probe",
            min=1,
            help="with --layer auto: images of the first batch that choose the layer.",
            rich_help_panel=MAPS,
        ),
    ] = 8,
    eigen_smooth: Annotated[
        bool,
        typer.Option(
            "--eigen-smooth",
            help="gradient methods: first principal component of the weighted activations.",
            rich_help_panel=MAPS,
        ),
    ] = False,
    aug_smooth: Annotated[
        bool,
        typer.Option(
            "--aug-smooth",
            help="average over flips and brightness 0.9/1.0/1.1 (6 passes).",
            rich_help_panel=MAPS,
        ),
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="deletion and insertion AUC of every map (record, caption, sheet).",
            rich_help_panel=MAPS,
        ),
    ] = False,
    region: Annotated[
        Region,
        typer.Option(
            "--region",
            help="segmentation: explain the class's score over its predicted pixels, or over all pixels.",
            rich_help_panel=DENSE,
        ),
    ] = Region.class_,
    score_threshold: Annotated[
        float,
        typer.Option(
            "--score-threshold",
            min=0.0,
            max=1.0,
            help="detection: explain the boxes scoring at least this.",
            rich_help_panel=DENSE,
        ),
    ] = 0.5,
    max_boxes: Annotated[
        int,
        typer.Option(
            "--max-boxes",
            min=1,
            help="detection: at most this many boxes, best first.",
            rich_help_panel=DENSE,
        ),
    ] = 10,
    scorecam_batch: Annotated[
        int,
        typer.Option(
            "--scorecam-batch", min=1, help="masked inputs per Score-CAM forward pass.", rich_help_panel=RUN
        ),
    ] = 64,
    alpha: Annotated[
        float, typer.Option("--alpha", min=0.0, max=1.0, help="heatmap opacity.", rich_help_panel=MAPS)
    ] = 0.5,
    colormap: Annotated[
        Colormap, typer.Option("--colormap", help="heatmap colours.", rich_help_panel=MAPS)
    ] = (Colormap.jet),
    no_relu: Annotated[
        bool, typer.Option("--no-relu", help="signed maps: negative evidence in blue.", rich_help_panel=MAPS)
    ] = False,
    save_raw: Annotated[
        bool,
        typer.Option(
            "--save-raw",
            help="also write raw maps as .npy (feature and photo resolution).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    workers: Workers = 2,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    report: ReportOpt = False,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class.

    Segmentation models explain a class's pixels (outlined); detectors explain each box they find.
    """
    m = ModelOptions(
        model,
        weights,
        device,
        input_size,
        resize,
        labels,
        weights_key,
        _rgb(mean, "--mean"),
        _rgb(std, "--std"),
        trust_pickle,
    )
    r = RunOptions(
        inputs,
        out,
        batch_size,
        workers,
        overwrite,
        skip_existing,
        max_pixels,
        null,
        quiet,
        as_json,
        debug,
        report,
    )
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            from hookviz.jobs import CamJob
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import num_classes, parse_targets, probe

            # Under torchrun only rank 0 talks (its reporter is the one that is not quiet).
            hush = quiet or (reporter is not None and reporter.quiet)
            calls = probe(loaded)
            t = parse_targets(target, loaded, num_classes(loaded))
            if loaded.task == "detection":
                return _detection_job(
                    loaded,
                    calls,
                    layers,
                    methods,
                    t,
                    score_threshold,
                    max_boxes,
                    hush,
                    alpha,
                    colormap,
                    no_relu,
                    save_raw,
                    eigen_smooth,
                    dict(
                        fuse=fuse,
                        metrics=metrics,
                        aug_smooth=aug_smooth,
                        normalize=normalize != Normalize.image,
                    ),
                )
            auto = None
            if layers == ["auto"]:
                # Said even with -q (it is a result), once under torchrun.
                auto = _auto_layer(
                    loaded, calls, reporter, probe_images, [str(x) for x in methods or []],
                    reporter is not None and not reporter.lead,
                )  # fmt: skip
                chosen = [auto["chosen"]]
            elif not layers:
                chosen = [default_cam_layer(loaded.model, calls)]
            else:
                chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(layers)]
            job = CamJob(
                loaded,
                chosen,
                [str(x) for x in (methods or ["gradcam"])],
                t,
                alpha,
                str(colormap),
                relu=not no_relu,
                save_raw=save_raw,
                normalize=str(normalize),
                vmax=vmax,
                fuse=str(fuse) if fuse is not None else None,
                sheet=sheet,
                scorecam_batch=scorecam_batch,
                metrics=metrics,
                eigen_smooth=eigen_smooth,
                aug_smooth=aug_smooth,
                region=str(region),
            )
            job.auto_layer = auto
            if not layers and not hush:
                from hookviz.layers import default_reason

                typer.echo(
                    f"hookviz: using layer {chosen[0]} (the default for {loaded.name}: "
                    f"{default_reason(calls, chosen[0])}; --layer to change)",
                    err=True,
                )
            if "scorecam" in job.methods and not hush:
                from hookviz.layers import channels

                passes = sum(channels(loaded.model, name, calls) for name in chosen)
                typer.echo(
                    f"hookviz: note: Score-CAM runs {passes:,} masked forward passes per image "
                    f"(one per channel of {', '.join(chosen)}); it is the slow method",
                    err=True,
                )
                if reporter is not None:
                    job.progress = reporter.inner("Score-CAM masked passes")
            return job

        _run_job(make, m, r)


def _detection_job(
    loaded: Any,
    calls: Any,
    layers: list[str] | None,
    methods: list[str] | None,
    targets: str | list[int] | None,
    score_threshold: float,
    max_boxes: int,
    quiet: bool,
    alpha: float,
    colormap: Colormap,
    no_relu: bool,
    save_raw: bool,
    eigen_smooth: bool,
    refused: dict[str, Any],
) -> Any:
    """``gradcam`` on a detector: a map per box; ``--target`` keeps only the named classes."""
    from hookviz.errors import UsageError
    from hookviz.jobs import DetectionJob
    from hookviz.layers import cam_layer, default_cam_layer

    options = {
        "fuse": "--fuse",
        "metrics": "--metrics",
        "aug_smooth": "--aug-smooth",
        "normalize": "--normalize",
    }
    for key, flag in options.items():
        if refused[key]:
            raise UsageError(f"{flag} is not available for detectors (each box's map is scaled on its own)")
    if isinstance(targets, str):
        raise UsageError(f"--target {targets}: a detector explains every box it finds; name classes to keep")
    if layers == ["auto"]:
        raise UsageError("--layer auto is not available for detectors; give --layer or use the default")
    chosen = (
        [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(layers)]
        if layers
        else [default_cam_layer(loaded.model, calls)]
    )
    if not layers and not quiet:
        typer.echo(
            f"hookviz: using layer {chosen[0]} (the default for {loaded.name}: its backbone's last stage; "
            "--layer to change)",
            err=True,
        )
    if not methods and not quiet:
        typer.echo(
            "hookviz: using HiResCAM for a detector (Grad-CAM averages a box's local gradient over the "
            "whole image, so its map spreads to similar objects; --method gradcam to see it)",
            err=True,
        )
    return DetectionJob(
        loaded,
        chosen,
        [str(x) for x in (methods or ["hirescam"])],
        targets,
        score_threshold,
        max_boxes,
        alpha,
        str(colormap),
        relu=not no_relu,
        save_raw=save_raw,
        eigen_smooth=eigen_smooth,
    )


def _auto_layer(
    loaded: Any, calls: Any, reporter: Any, count: int, methods: list[str], quiet: bool = False
) -> dict[str, Any]:
    """``--layer auto``: the candidate layer with the best insertion - deletion AUC on the first images
    (:func:`hookviz.evaluation.choose_layer`); under torchrun every rank takes rank 0's choice."""
    from hookviz.errors import UsageError
    from hookviz.evaluation import choose_layer
    from hookviz.layers import candidate_layers

    x = reporter.first_images(count) if reporter is not None else None
    if x is None:
        raise UsageError("--layer auto needs at least one readable image among the inputs")
    chosen = choose_layer(loaded.model, x, candidate_layers(loaded.model, calls), methods)
    if reporter is not None:
        chosen = reporter.agree(chosen)
    if not quiet:
        shown = ", ".join(f"{n} {v:+.3f}" for n, v in chosen["scores"].items())
        signed = chosen.get("signed")
        passed = f"; passed over signed {', '.join(signed)}" if signed else ""
        typer.echo(
            f"hookviz: --layer auto chose {chosen['chosen']} (insertion - deletion AUC of {chosen['method']} "
            f"on {chosen['images']} image(s): {shown}{passed})",
            err=True,
        )
    return chosen
