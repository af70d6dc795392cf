"""``hookviz gradcam``: CAMs of classifiers, segmentation models and detectors."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.app import (
    DENSE,
    MAPS,
    OUTPUT,
    Baseline,
    BatchSize,
    Cells,
    Compare,
    Debug,
    Device,
    DiscardRatio,
    Embedding,
    HeadFusion,
    HeadOpt,
    IgSteps,
    JsonOut,
    Labels,
    MaskedBatch,
    Masks,
    MaxMemory,
    MaxPixels,
    MeanOpt,
    Methods,
    Model,
    Negate,
    Noise,
    Null,
    Out,
    Overwrite,
    Prompt,
    PromptsFile,
    Quiet,
    ReportOpt,
    ResizeOpt,
    Samples,
    Seed,
    SimilarTo,
    SkipExisting,
    StdOpt,
    Stride,
    TrustPickle,
    Weights,
    WeightsKey,
    Window,
    Workers,
    _guard,
)
from hookviz.cli.groups import method_options, model_options, prompts, run_options
from hookviz.cli.kinds import ClipLen, ClipsOpt, FrameStride, InputOpt, InputSize, MaybeInputs, TaskOpt
from hookviz.cli.runner import _Reporter, _run_job
from hookviz.options import Colormap, Fuse, Normalize, Region

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models.loaded import LoadedModel


def gradcam(
    inputs: MaybeInputs = None,
    several: InputOpt = None,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    weights_key: WeightsKey = None,
    labels: Labels = None,
    input_size: InputSize = None,
    resize: ResizeOpt = None,
    mean: MeanOpt = None,
    std: StdOpt = None,
    trust_pickle: TrustPickle = False,
    head: HeadOpt = "auto",
    task: TaskOpt = None,
    negate: Negate = False,
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
            help="top1, topK (top5), a class index or name, a comma list, or positive (multi-label: every "
            "label whose sigmoid reaches --threshold).",
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
    channels: Annotated[
        str | None,
        typer.Option(
            "--channels",
            help="topK: also the first target's Grad-CAM through each of the K channels adding most to it.",
            rich_help_panel=MAPS,
        ),
    ] = None,
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
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            min=0.0,
            max=1.0,
            help="--target positive: explain every label whose sigmoid reaches this (a multi-label head).",
            rich_help_panel=MAPS,
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
    masked_batch: MaskedBatch = 64,
    seed: Seed = 0,
    samples: Samples = None,
    noise: Noise = None,
    ig_steps: IgSteps = 50,
    baseline: Baseline = "black",
    window: Window = 16,
    stride: Stride = 8,
    masks: Masks = 2000,
    cells: Cells = 7,
    head_fusion: HeadFusion = "mean",
    discard_ratio: DiscardRatio = 0.0,
    compare: Compare = None,
    prompt: Prompt = None,
    prompts_file: PromptsFile = None,
    similar_to: SimilarTo = None,
    embedding: Embedding = None,
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
    max_memory: MaxMemory = None,
    report: ReportOpt = False,
    null: Null = False,
    clip_len: ClipLen = None,
    frame_stride: FrameStride = None,
    clips: ClipsOpt = None,
    debug: Debug = False,
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class.

    Segmentation models explain a class's pixels (outlined); detectors explain each box they find.
    """
    p = locals()
    m, r = model_options(p), run_options(p)
    with _guard(debug):
        _run_job(partial(_cam_job, p), m, r)


def _cam_job(p: dict[str, Any], loaded: LoadedModel, reporter: _Reporter | None) -> Job:
    """The ``gradcam`` job the options ``p`` ask for, its notes said (under torchrun, by rank 0 only)."""
    from hookviz.jobs.build import CamSettings, auto_line, expensive
    from hookviz.tasks import make_cam_job

    loaded = prompts(p).apply(loaded)
    fuse = p["fuse"]
    settings = CamSettings(
        layers=tuple(p["layers"] or ()), methods=tuple(p["methods"] or ()), target=p["target"],
        alpha=p["alpha"], colormap=str(p["colormap"]), relu=not p["no_relu"], save_raw=p["save_raw"],
        normalize=str(p["normalize"]), vmax=p["vmax"], fuse=str(fuse) if fuse is not None else None,
        sheet=p["sheet"], scorecam_batch=p["masked_batch"], metrics=p["metrics"],
        eigen_smooth=p["eigen_smooth"], aug_smooth=p["aug_smooth"], region=str(p["region"]),
        probe_images=p["probe_images"],
        score_threshold=p["score_threshold"], max_boxes=p["max_boxes"], compare=p["compare"],
        threshold=p["threshold"], channel_terms=_top_channels(p["channels"]),
        options=method_options(p),
    )  # fmt: skip
    built = make_cam_job(
        loaded,
        settings,
        first_images=reporter.first_images if reporter is not None else None,
        agree=reporter.agree if reporter is not None else None,
    )
    if built.auto is not None and (reporter is None or reporter.lead):  # a result: said even with -q
        typer.echo(f"hookviz: {auto_line(built.auto)}", err=True)
    # Under torchrun only rank 0 talks (its reporter is the one that is not quiet).
    if not (p["quiet"] or (reporter is not None and reporter.quiet)):
        for note in built.notes:
            typer.echo(f"hookviz: {note}", err=True)
    slow = expensive(built.job.methods, built.job.options)
    if reporter is not None and slow:  # a progress bar over the slow methods' passes
        built.job.progress = reporter.inner("extra passes of " + ", ".join(slow))
    return built.job


def _top_channels(text: str | None) -> int:
    """``--channels topK`` -> K (0 without it)."""
    if text is None:
        return 0
    k = text.strip().lower().removeprefix("top")
    if not k.isdigit() or int(k) < 1:
        raise typer.BadParameter(f"{text!r}: give topK, like top4", param_hint="--channels")
    return int(k)
