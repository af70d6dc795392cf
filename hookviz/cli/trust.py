"""Which map to trust: ``hookviz evaluate`` (faithfulness) and ``hookviz sanity`` (randomisation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.app import (
    MAPS,
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
)
from hookviz.cli.runner import ModelOptions, RunOptions, _refuse_task, _Reporter, _rgb, _run_then

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models import LoadedModel


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
        typer.Option("--steps", min=2, help="points on the deletion/insertion curves.", rich_help_panel=MAPS),
    ] = 16,
    seed: Seed = 0,
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
    workers: Workers = 2,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    null: Null = False,
    clip_len: ClipLen = None,
    frame_stride: FrameStride = None,
    clips: ClipsOpt = None,
    debug: Debug = False,
) -> None:
    """How faithful each map is: deletion/insertion AUC, average drop, increase in confidence, vs chance."""
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
        null=null,
        quiet=True,
        as_json=as_json,
        debug=debug,
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz import targets

            loaded = targets.from_options(loaded, prompt, prompts_file, similar_to, embedding)
            _refuse_task(loaded, "evaluate", ("detection",))
            from hookviz.jobs import EvaluateJob
            from hookviz.jobs.build import method_options
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import num_classes, parse_targets, probe

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
                seed, samples, noise, ig_steps, baseline, window, stride, masks, cells, masked_batch,
                head_fusion=head_fusion, discard=discard_ratio,
            )  # fmt: skip
            job = EvaluateJob(
                loaded=loaded,
                layers=chosen,
                methods=[str(x) for x in (methods or ["gradcam"])],
                targets=t,
                steps=steps,
                options=method_options(loaded, options, compare),
            )
            made.append(job)
            return job

        _run_then(make, m, r, lambda: _write_evaluation(made[0], out, quiet, as_json) if made else None)


def _write_evaluation(job: Any, out: Path, quiet: bool, as_json: bool) -> None:
    """The table (stdout, or stderr with --json), OUT/evaluation.csv and OUT/evaluation.json."""
    import csv
    import io

    from hookviz import pipeline
    from hookviz.files import atomic_write
    from hookviz.jobs import summarise_evaluation
    from hookviz.report import latest_records

    key = pipeline.settings_key(job.settings())
    lines = (out / pipeline.MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    rows = summarise_evaluation(recs)
    passes = sum(int(x.get("forward_passes", 0)) for x in recs)
    columns = ["method", "layer", "images", "deletion_auc", "deletion_auc_ci95", "insertion_auc",
               "insertion_auc_ci95", "average_drop", "average_drop_ci95", "increase_in_confidence",
               "increase_in_confidence_ci95_low", "increase_in_confidence_ci95_high"]  # fmt: skip
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        low, high = row["increase_in_confidence_ci95"]
        writer.writerow(
            {**row, "increase_in_confidence_ci95_low": low, "increase_in_confidence_ci95_high": high}
        )
    summary = {
        "key": key,
        "settings": job.settings(),
        "images": len(recs),
        "forward_passes": passes,
        "rows": rows,
    }
    for name, text in (
        ("evaluation.csv", buf.getvalue()),
        ("evaluation.json", json.dumps(pipeline.finite(summary), indent=1, allow_nan=False)),
    ):
        atomic_write(out / name, text)
    table = [
        f"{'method':<12} {'layer':<28} {'n':>4}  {'deletion AUC ↓':>16}  {'insertion AUC ↑':>16}  "
        f"{'avg drop % ↓':>14}  {'increase % ↑':>13}"
    ]
    for row in rows:
        table.append(
            f"{row['method']:<12} {row['layer']:<28} {row['images']:>4}  "
            f"{row['deletion_auc']:>8.3f} ±{row['deletion_auc_ci95']:<6.3f}  "
            f"{row['insertion_auc']:>8.3f} ±{row['insertion_auc_ci95']:<6.3f}  "
            f"{row['average_drop']:>6.1f} ±{row['average_drop_ci95']:<5.1f}  "
            f"{row['increase_in_confidence']:>5.1f} "
            f"[{row['increase_in_confidence_ci95'][0]:.0f}, {row['increase_in_confidence_ci95'][1]:.0f}]"
        )
    table.append(
        f"{len(recs)} image(s), {passes:,} forward passes; ± is the 95 % confidence interval of the mean "
        "(Student's t), [low, high] that of a proportion (Wilson); random and center are chance baselines"
    )
    table.append(f"wrote {out / 'evaluation.csv'} and {out / 'evaluation.json'}")
    if not quiet or not as_json:
        typer.echo("\n".join(table), err=as_json)


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
        null=null,
        quiet=quiet,
        as_json=as_json,
        debug=debug,
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: LoadedModel, reporter: _Reporter | None) -> Job:
            from hookviz import targets

            loaded = targets.from_options(loaded, prompt, prompts_file, similar_to, embedding)
            _refuse_task(loaded, "sanity", ("detection",))
            from hookviz.jobs import SanityJob
            from hookviz.jobs.build import method_options
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import probe

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
    from hookviz import pipeline
    from hookviz.files import atomic_write
    from hookviz.jobs import summarise_sanity
    from hookviz.report import latest_records

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
