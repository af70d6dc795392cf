"""Which map to trust: ``hookviz evaluate`` (faithfulness) and ``hookviz sanity`` (randomisation)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.app import (
    MAPS,
    SETTINGS,
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
from hookviz.cli.runner import _Reporter, _run_then
from hookviz.cli.tables import _announce, _write_evaluation
from hookviz.io.files import atomic_write
from hookviz.report import latest_records

METRICS = "Metrics"

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models.loaded import LoadedModel


def evaluate(
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
    p = locals()
    m, r = model_options(p), run_options(p, lines=False)
    made: list[Any] = []
    with _guard(debug):
        summarise = lambda: _write_evaluation(made[0], out, quiet, as_json) if made else None  # noqa: E731
        _run_then(partial(_evaluate_job, p, mask_dir, made), m, r, summarise)


def _evaluate_job(
    p: dict[str, Any], mask_dir: Path | None, made: list[Any], loaded: LoadedModel, reporter: _Reporter | None
) -> Job:
    """The ``evaluate`` job the options ``p`` ask for (kept in ``made`` for the summary)."""
    from hookviz import tasks
    from hookviz.evaluation.families import MetricSettings, parse_metrics
    from hookviz.io.annotation import load as load_annotations
    from hookviz.jobs.build import evaluate_job

    loaded = prompts(p).apply(loaded)
    tasks.refuse(loaded, "evaluate")
    annotated = p["boxes"] is not None or mask_dir is not None
    found = load_annotations(p["boxes"], mask_dir, p["mask_kind"]) if annotated else None
    job = evaluate_job(
        loaded, layers=p["layers"], methods=p["methods"], target=p["target"], options=method_options(p),
        compare=p["compare"], steps=p["steps"],
        metrics=parse_metrics(p["metric"], annotated=found is not None),
        metric_settings=MetricSettings(
            tolerance=p["tolerance"], top_k=p["top_k"], radius=p["radius"],
            robust_samples=p["robust_samples"], patch=p["patch_size"], regions=p["regions"],
        ),
        annotations=found, seed=p["seed"],
    )  # fmt: skip
    if not p["quiet"]:
        _announce(job)
    made.append(job)
    return job


def sanity(
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
    p = locals()
    m, r = model_options(p), run_options(p, workers=2)
    made: list[Any] = []
    with _guard(debug):
        _run_then(
            partial(_sanity_job, p, made),
            m,
            r,
            lambda: _write_sanity(made[0], out, as_json) if made else None,
        )


def _sanity_job(p: dict[str, Any], made: list[Any], loaded: LoadedModel, reporter: _Reporter | None) -> Job:
    """The ``sanity`` job the options ``p`` ask for (kept in ``made`` for the summary)."""
    from hookviz import tasks
    from hookviz.jobs.build import sanity_job

    loaded = prompts(p).apply(loaded)
    tasks.refuse(loaded, "sanity")
    job = sanity_job(
        loaded, layer=p["layer"], methods=p["methods"], options=method_options(p), compare=p["compare"],
        seed=p["seed"], order=p["order"], granularity=p["granularity"], smooth=p["smooth"],
        noise=p["smooth_noise"],
    )  # fmt: skip
    made.append(job)
    return job


def _write_sanity(job: Any, out: Path, as_json: bool) -> None:
    from hookviz.evaluation.summary import summarise_sanity
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
