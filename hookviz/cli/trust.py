"""Which map to trust: ``hookviz evaluate`` (faithfulness) and ``hookviz sanity`` (randomisation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.app import (
    MAPS,
    SETTINGS,
    Baseline,
    BatchSize,
    Cells,
    ClipLen,
    ClipsOpt,
    Compare,
    Debug,
    Device,
    DiscardRatio,
    Embedding,
    FrameStride,
    HeadFusion,
    IgSteps,
    Inputs,
    InputSize,
    JsonOut,
    Labels,
    MaskedBatch,
    Masks,
    MaxMemory,
    MaxPixels,
    MeanOpt,
    Methods,
    Model,
    Noise,
    Null,
    Out,
    Overwrite,
    Prompt,
    PromptsFile,
    Quiet,
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
    _method_options,
    memory_size,
)
from hookviz.cli.loading import ModelOptions, _rgb
from hookviz.cli.runner import RunOptions, _Reporter, _run_then
from hookviz.cli.tables import _announce, _write_evaluation

METRICS = "Metrics"

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models.loaded import LoadedModel


def evaluate(
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
            "--layer", "-l", help="module name; repeatable (default: the CAM default).", rich_help_panel=MAPS
        ),
    ] = None,
    methods: Methods = None,
    target: Annotated[
        str, typer.Option("--target", "-t", help="top1, or a class index or name.", rich_help_panel=MAPS)
    ] = "top1",
    steps: Annotated[
        int,
        typer.Option(
            "--steps",
            min=2,
            help="points on the deletion/insertion and pixel-flipping curves.",
            rich_help_panel=MAPS,
        ),
    ] = 16,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            help="families, repeatable or comma-separated: faithfulness (default), road, flipping, "
            "localisation (default with --boxes/--masks), complexity, robustness, randomisation; all.",
            rich_help_panel=METRICS,
        ),
    ] = None,
    boxes: Annotated[
        Path | None,
        typer.Option(
            "--boxes",
            help="where the objects are: a COCO .json, a .csv (file,class,x0,y0,x1,y1), or a folder "
            "of Pascal VOC .xml or YOLO .txt; each photo is explained for its annotated classes.",
            rich_help_panel=METRICS,
        ),
    ] = None,
    masks: Annotated[
        str | None,
        typer.Option(
            "--masks",
            help="DIR: object masks, a PNG a photo named as it (0 background, else class index; "
            "{0,1} or {0,255}: binary, one object of the class explained).",
            rich_help_panel=METRICS,
        ),
    ] = None,
    mask_kind: Annotated[
        str,
        typer.Option(
            "--mask-kind",
            help="how --masks are read: auto ({0,1} and {0,255} binary, else class indices), binary, "
            "classes.",
            rich_help_panel=METRICS,
        ),
    ] = "auto",
    rise_masks: Annotated[
        int, typer.Option("--rise-masks", min=1, help="RISE's random masks.", rich_help_panel=SETTINGS)
    ] = 2000,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            min=0.0,
            help="pointing game: pixels of the input (the paper's 15).",
            rich_help_panel=METRICS,
        ),
    ] = 15.0,
    top_k: Annotated[
        int,
        typer.Option(
            "--top-k", min=1, help="top-k intersection: the k most relevant pixels.", rich_help_panel=METRICS
        ),
    ] = 1000,
    radius: Annotated[
        float,
        typer.Option(
            "--radius",
            min=0.0,
            help="robustness: uniform noise within this of each input value.",
            rich_help_panel=METRICS,
        ),
    ] = 0.2,
    robust_samples: Annotated[
        int,
        typer.Option(
            "--robust-samples", min=1, help="robustness: noisy copies per image.", rich_help_panel=METRICS
        ),
    ] = 10,
    patch_size: Annotated[
        int,
        typer.Option(
            "--patch-size", min=1, help="region perturbation: patch side, pixels.", rich_help_panel=METRICS
        ),
    ] = 8,
    regions: Annotated[
        int,
        typer.Option(
            "--regions",
            min=1,
            help="region perturbation: patches removed, one a step.",
            rich_help_panel=METRICS,
        ),
    ] = 100,
    seed: Seed = 0,
    masked_batch: MaskedBatch = 64,
    samples: Samples = None,
    noise: Noise = None,
    ig_steps: IgSteps = 50,
    baseline: Baseline = "black",
    window: Window = 16,
    stride: Stride = 8,
    cells: Cells = 7,
    head_fusion: HeadFusion = "mean",
    discard_ratio: DiscardRatio = 0.0,
    compare: Compare = None,
    prompt: Prompt = None,
    prompts_file: PromptsFile = None,
    similar_to: SimilarTo = None,
    embedding: Embedding = None,
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
    null: Null = False,
    clip_len: ClipLen = None,
    frame_stride: FrameStride = None,
    clips: ClipsOpt = None,
    debug: Debug = False,
) -> None:
    """How good each map is, against chance: faithfulness, ROAD, flipping, localisation, complexity, ..."""
    mask_dir = None if masks is None or masks.strip().isdigit() else Path(masks)
    if masks is not None and mask_dir is None:  # the old spelling of --rise-masks
        rise_masks = int(masks)
        if rise_masks < 1:
            raise typer.BadParameter("RISE's masks: at least 1", param_hint="--rise-masks")
        typer.echo("hookviz: note: --masks N is deprecated for RISE's masks; say --rise-masks N", err=True)
    m = ModelOptions(
        model=model,
        weights=weights,
        device=device,
        input_size=input_size,
        resize=resize,
        labels=labels,
        weights_key=weights_key,
        mean=_rgb(mean, "--mean"),
        std=_rgb(std, "--std"),
        trust_pickle=trust_pickle,
        clip_len=clip_len,
        frame_stride=frame_stride,
        clips=clips,
    )
    r = RunOptions(
        inputs=inputs,
        out=out,
        batch_size=batch_size,
        workers=workers,
        overwrite=overwrite,
        skip_existing=skip_existing,
        max_pixels=max_pixels,
        max_memory=memory_size(max_memory),
        null=null,
        quiet=quiet,
        lines=False,
        as_json=as_json,
        debug=debug,
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz import tasks

            loaded = tasks.with_options(loaded, prompt, prompts_file, similar_to, embedding)
            tasks.refuse(loaded, "evaluate")
            from hookviz.core.layers import cam_layer, default_cam_layer
            from hookviz.jobs import EvaluateJob
            from hookviz.jobs.build import method_options
            from hookviz.models.classes import parse_targets
            from hookviz.models.loaded import num_classes, probe

            calls = probe(loaded)
            chosen = (
                [cam_layer(loaded.model, n, calls, loaded.name) for n in dict.fromkeys(layers)]
                if layers
                else [default_cam_layer(loaded.model, calls)]
            )
            t = parse_targets(target, loaded, num_classes(loaded))
            if isinstance(t, str):
                raise typer.BadParameter(
                    "evaluate explains one class per image: top1 or a class", param_hint="--target"
                )
            options = _method_options(
                seed, samples, noise, ig_steps, baseline, window, stride, rise_masks, cells, masked_batch,
                head_fusion=head_fusion, discard=discard_ratio,
            )  # fmt: skip
            from hookviz.evaluation.families import MetricSettings, parse_metrics
            from hookviz.io.annotation import load as load_annotations

            annotated = boxes is not None or mask_dir is not None
            found = load_annotations(boxes, mask_dir, mask_kind) if annotated else None
            job = EvaluateJob(
                loaded=loaded,
                layers=chosen,
                methods=[str(x) for x in (methods or ["gradcam"])],
                targets=t,
                steps=steps,
                options=method_options(loaded, options, compare),
                metrics=parse_metrics(metric, annotated=found is not None),
                metric_settings=MetricSettings(
                    tolerance=tolerance, top_k=top_k, radius=radius, robust_samples=robust_samples,
                    patch=patch_size, regions=regions,
                ),
                annotations=found,
                seed=seed,
            )  # fmt: skip
            if not quiet:
                _announce(job)
            made.append(job)
            return job

        _run_then(make, m, r, lambda: _write_evaluation(made[0], out, quiet, as_json) if made else None)


def sanity(
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
        typer.Option("--layer", "-l", help="module name (default: the CAM default).", rich_help_panel=MAPS),
    ] = None,
    methods: Methods = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", help="seed of the random parameters and the stochastic methods.", rich_help_panel=MAPS
        ),
    ] = 0,
    order: Annotated[
        str,
        typer.Option(
            "--order",
            help="cascading: randomise block after block from the head down (Adebayo et al.); independent: "
            "each block alone, the others as trained.",
            rich_help_panel=MAPS,
        ),
    ] = "cascading",
    granularity: Annotated[
        str,
        typer.Option(
            "--granularity",
            help="block: each residual / encoder block, the stem and the head (a model without blocks: each "
            "layer); layer: every layer, seeded as Quantus seeds it.",
            rich_help_panel=MAPS,
        ),
    ] = "block",
    smooth: Annotated[
        int,
        typer.Option(
            "--smooth",
            min=1,
            help="sMPRT (Hedström et al. 2023): each map the mean over N noisy copies of the input (1: off).",
            rich_help_panel=MAPS,
        ),
    ] = 1,
    smooth_noise: Annotated[
        float,
        typer.Option(
            "--smooth-noise", min=0.0, help="sMPRT's noise, times each input's range.", rich_help_panel=MAPS
        ),
    ] = 0.1,
    masked_batch: MaskedBatch = 64,
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
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    max_memory: MaxMemory = None,
    null: Null = False,
    clip_len: ClipLen = None,
    frame_stride: FrameStride = None,
    clips: ClipsOpt = None,
    debug: Debug = False,
) -> None:
    """The sanity check: randomise the weights from the head down; a faithful map must change with them."""
    from hookviz.evaluation.randomisation import GRANULARITIES, ORDERS

    if order not in ORDERS:
        raise typer.BadParameter(f"{order!r}: one of {', '.join(ORDERS)}", param_hint="--order")
    if granularity not in GRANULARITIES:
        raise typer.BadParameter(
            f"{granularity!r}: one of {', '.join(GRANULARITIES)}", param_hint="--granularity"
        )
    m = ModelOptions(
        model=model,
        weights=weights,
        device=device,
        input_size=input_size,
        resize=resize,
        labels=labels,
        weights_key=weights_key,
        mean=_rgb(mean, "--mean"),
        std=_rgb(std, "--std"),
        trust_pickle=trust_pickle,
        clip_len=clip_len,
        frame_stride=frame_stride,
        clips=clips,
    )
    r = RunOptions(
        inputs=inputs,
        out=out,
        batch_size=batch_size,
        workers=2,
        overwrite=overwrite,
        skip_existing=skip_existing,
        max_pixels=max_pixels,
        max_memory=memory_size(max_memory),
        null=null,
        quiet=quiet,
        as_json=as_json,
        debug=debug,
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz import tasks

            loaded = tasks.with_options(loaded, prompt, prompts_file, similar_to, embedding)
            tasks.refuse(loaded, "sanity")
            from hookviz.core.layers import cam_layer, default_cam_layer
            from hookviz.jobs import SanityJob
            from hookviz.jobs.build import method_options
            from hookviz.models.loaded import probe

            calls = probe(loaded)
            name = (
                cam_layer(loaded.model, layer, calls, loaded.name)
                if layer
                else default_cam_layer(loaded.model, calls)
            )
            options = _method_options(
                seed, samples, noise, ig_steps, baseline, window, stride, masks, cells, masked_batch,
                head_fusion=head_fusion, discard=discard_ratio,
            )  # fmt: skip
            job = SanityJob(
                loaded=loaded, layer=name, methods=[str(x) for x in (methods or ["gradcam"])], seed=seed,
                options=method_options(loaded, options, compare), order=order, granularity=granularity,
                smooth=smooth, noise=smooth_noise,
            )  # fmt: skip
            made.append(job)
            return job

        _run_then(make, m, r, lambda: _write_sanity(made[0], out, as_json) if made else None)


def _write_sanity(job: Any, out: Path, as_json: bool) -> None:
    from hookviz.io.files import atomic_write
    from hookviz.jobs import summarise_sanity
    from hookviz.report import latest_records
    from hookviz.run import pipeline

    key = pipeline.settings_key(job.settings())
    lines = (out / pipeline.MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    steps = summarise_sanity(recs)
    summary = {
        "key": key,
        "layer": job.layer,
        "order": job.order,
        "granularity": job.granularity,
        "images": len(recs),
        "steps": steps,
    }
    atomic_write(out / "sanity.json", json.dumps(pipeline.finite(summary), indent=1, allow_nan=False))
    lines_out = []
    for method in [*job.methods, "edges"]:
        mine = [s for s in steps if s["method"] == method]
        if not mine:
            continue
        randomised = [s for s in mine if s["randomized_up_to"] != "none"] or mine
        if job.order == "cascading":
            last, where = mine[-1], "at full randomisation"
        else:  # each block alone: the mean over the blocks (Quantus's average correlation)
            mean = {k: sum(s[k] for s in randomised) / len(randomised) for k in ("spearman", "ssim")}
            last, where = {**mine[-1], **mean}, "averaged over the blocks randomised one at a time"
        changed = last["spearman"] < 0.5
        verdict = (
            "changes with the weights: it depends on what the model learned (passes)"
            if changed
            else "barely changes with the weights: it does not depend on what the model learned"
        )
        lines_out.append(
            f"{method}: {where} Spearman {last['spearman']:.2f}, SSIM {last['ssim']:.2f} "
            f"over {last['images']} image(s): the map {verdict}"
        )
    lines_out.append(f"wrote {out / 'sanity.json'}")
    typer.echo("\n".join(lines_out), err=as_json)
