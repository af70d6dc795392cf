"""Which map to trust: ``hookviz evaluate`` (faithfulness), ``hookviz sanity`` (randomisation) and
``hookviz trust`` (every method through one battery of tests, and a verdict)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.app import EXIT_INPUTS_FAILED
from hookviz.cli.explore import _model_words
from hookviz.cli.flags import (
    MAPS,
    OUTPUT,
    SETTINGS,
    CamDefaultLayer,
    CamDefaultLayers,
    InputOpt,
    Inputs,
    MaybeInputs,
    Methods,
)
from hookviz.cli.loading import load_warm
from hookviz.cli.options import (
    DATA,
    MethodFlags,
    ModelOptions,
    PlainModel,
    Prompts,
    RunOptions,
    Sampling,
    group,
    grouped,
    omit,
)
from hookviz.cli.runner import run_command
from hookviz.cli.tables import announce, write_evaluation
from hookviz.errors import one_line
from hookviz.io.files import atomic_write
from hookviz.io.outputs import MANIFEST, command_words, finite, settings_key
from hookviz.report import latest_records
from hookviz.run.trust_guard import claimed, parse_budget, process_started

METRICS = "Metrics"

EvalTarget = Annotated[str, typer.Option("--target", "-t", rich_help_panel=MAPS,
    help="top1, a class index or name, or label (each input's own: a table's target column, a shard "
    "sample's .cls).")]  # fmt: skip
Steps = Annotated[int, typer.Option("--steps", min=2, rich_help_panel=MAPS,
    help="points on the deletion/insertion and pixel-flipping curves.")]  # fmt: skip
Metric = Annotated[list[str] | None, typer.Option("--metric", rich_help_panel=METRICS, help="families, "
    "repeatable or comma-separated: faithfulness (default), road, flipping, localisation (default with "
    "--boxes/--masks), complexity, robustness, randomisation; all.")]  # fmt: skip
Boxes = Annotated[Path | None, typer.Option("--boxes", rich_help_panel=METRICS, help="where the objects are: "
    "a COCO .json, a .csv (file,class,x0,y0,x1,y1), a folder of Pascal VOC .xml or YOLO .txt, or a table "
    "with a boxes column (an --inputs-table); each photo explained for its annotated classes.")]  # fmt: skip
MaskDir = Annotated[str | None, typer.Option("--masks", rich_help_panel=METRICS, help="DIR: object masks, a "
    "PNG a photo named as it (0 background, else class index; {0,1} or {0,255}: binary, one object of the "
    "class explained); or a table with a mask column (--inputs-table's).")]  # fmt: skip
MaskKind = Annotated[str, typer.Option("--mask-kind", rich_help_panel=METRICS, help="how --masks are read: "
    "auto ({0,1} and {0,255} binary, else class indices), binary, classes.")]  # fmt: skip
RiseMasks = Annotated[int, typer.Option("--rise-masks", min=1, help="RISE's random masks.",
    rich_help_panel=SETTINGS)]  # fmt: skip
Tolerance = Annotated[float, typer.Option("--tolerance", min=0.0, rich_help_panel=METRICS,
    help="pointing game: pixels of the input (the paper's 15).")]  # fmt: skip
TopK = Annotated[int, typer.Option("--top-k", min=1, rich_help_panel=METRICS,
    help="top-k intersection: the k most relevant pixels.")]  # fmt: skip
Radius = Annotated[float, typer.Option("--radius", min=0.0, rich_help_panel=METRICS,
    help="robustness: uniform noise within this of each input value.")]  # fmt: skip
RobustSamples = Annotated[int, typer.Option("--robust-samples", min=1, rich_help_panel=METRICS,
    help="robustness: noisy copies per image.")]  # fmt: skip
PatchSize = Annotated[int, typer.Option("--patch-size", min=1, rich_help_panel=METRICS,
    help="region perturbation: patch side, pixels.")]  # fmt: skip
Regions = Annotated[int, typer.Option("--regions", min=1, rich_help_panel=METRICS,
    help="region perturbation: patches removed, one a step.")]  # fmt: skip


@group
@dataclass(frozen=True, kw_only=True)
class MetricOptions:
    """``evaluate``'s metric families, where the objects are, and the metrics' settings."""

    metric: Metric = None
    boxes: Boxes = None
    #: ``--masks DIR``; a number is the old spelling of ``--rise-masks``.
    masks: MaskDir = None
    mask_kind: MaskKind = "auto"
    rise_masks: RiseMasks = 2000
    tolerance: Tolerance = 15.0
    top_k: TopK = 1000
    radius: Radius = 0.2
    robust_samples: RobustSamples = 10
    patch_size: PatchSize = 8
    regions: Regions = 100

    def settings(self) -> dict[str, Any]:
        """What :func:`hookviz.jobs.evaluate.evaluate_job` takes of these (``masks`` as a folder)."""
        from hookviz.evaluation.families import MetricSettings  # loads torch: only once the command runs

        mask_dir = None if self.masks is None or self.masks.strip().isdigit() else Path(self.masks)
        return dict(
            metric=self.metric, boxes=self.boxes, mask_dir=mask_dir, mask_kind=self.mask_kind,
            metric_settings=MetricSettings(
                tolerance=self.tolerance, top_k=self.top_k, radius=self.radius,
                robust_samples=self.robust_samples, patch=self.patch_size, regions=self.regions,
            ),
        )  # fmt: skip

    def rise(self) -> int:
        """RISE's masks: ``--rise-masks``, or ``--masks N`` (the old spelling, said to be so)."""
        if self.masks is None or not self.masks.strip().isdigit():
            return self.rise_masks
        if int(self.masks) < 1:
            raise typer.BadParameter("RISE's masks: at least 1", param_hint="--rise-masks")
        typer.echo("hookviz: note: --masks N is deprecated for RISE's masks; say --rise-masks N", err=True)
        return int(self.masks)


@grouped
def evaluate(
    inputs: MaybeInputs = None,
    several: InputOpt = None,
    model: ModelOptions = ModelOptions(),
    layers: CamDefaultLayers = None,
    methods: Methods = None,
    target: EvalTarget = "top1",
    steps: Steps = 16,
    metrics: MetricOptions = MetricOptions(),
    method: Annotated[MethodFlags, omit("masks")] = MethodFlags(),
    prompts: Prompts = Prompts(),
    run: Annotated[RunOptions, omit("report")] = RunOptions(),
    sampling: Sampling = Sampling(),
) -> None:
    """How good each map is, against chance: faithfulness, ROAD, flipping, localisation, complexity, ..."""
    from hookviz.jobs.build import made_by  # loads torch: only once the command runs
    from hookviz.jobs.evaluate import evaluate_job

    options = dataclasses.replace(method.options(), masks=metrics.rise())
    job = made_by(evaluate_job, layers=layers, methods=methods, target=target, options=options, steps=steps,
                  seed=method.seed, **metrics.settings())  # fmt: skip
    summarise = lambda job: write_evaluation(job, run.out, run.quiet, run.as_json, run.overwrite)  # noqa: E731
    run_command(job, model, run, inputs, several, sampling, prompts=prompts, announce=announce,
                summarise=summarise, lines=False)  # fmt: skip


Order = Annotated[str, typer.Option("--order", rich_help_panel=MAPS, help="cascading: randomise block "
    "after block from the head down (Adebayo et al.); independent: each block alone, the others as "
    "trained.")]  # fmt: skip
Granularity = Annotated[str, typer.Option("--granularity", rich_help_panel=MAPS, help="block: each "
    "residual / encoder block, the stem and the head (a model without blocks: each layer); layer: every "
    "layer, seeded as Quantus seeds it.")]  # fmt: skip
Smooth = Annotated[int, typer.Option("--smooth", min=1, rich_help_panel=MAPS, help="sMPRT (Hedström et al. "
    "2023): each map the mean over N noisy copies of the input (1: off).")]  # fmt: skip
SmoothNoise = Annotated[float, typer.Option("--smooth-noise", min=0.0, rich_help_panel=MAPS,
    help="sMPRT's noise, times each input's range.")]  # fmt: skip
SanitySeed = Annotated[int, typer.Option("--seed", rich_help_panel=MAPS,
    help="seed of the random parameters and the stochastic methods.")]  # fmt: skip


@grouped
def sanity(
    inputs: MaybeInputs = None,
    several: InputOpt = None,
    model: ModelOptions = ModelOptions(),
    layer: CamDefaultLayer = None,
    methods: Methods = None,
    seed: SanitySeed = 0,
    order: Order = "cascading",
    granularity: Granularity = "block",
    smooth: Smooth = 1,
    smooth_noise: SmoothNoise = 0.1,
    method: Annotated[MethodFlags, omit("seed")] = MethodFlags(),
    prompts: Prompts = Prompts(),
    run: Annotated[RunOptions, omit("workers", "report")] = RunOptions(),
    sampling: Sampling = Sampling(),
) -> None:
    """The sanity check: randomise the weights from the head down; a faithful map must change with them."""
    from hookviz.evaluation.randomisation import GRANULARITIES, ORDERS
    from hookviz.jobs.build import made_by
    from hookviz.jobs.sanity import sanity_job

    if order not in ORDERS:
        raise typer.BadParameter(f"{order!r}: one of {', '.join(ORDERS)}", param_hint="--order")
    if granularity not in GRANULARITIES:
        hint = "--granularity"
        raise typer.BadParameter(f"{granularity!r}: one of {', '.join(GRANULARITIES)}", param_hint=hint)
    options = dataclasses.replace(method.options(), seed=seed)
    job = made_by(sanity_job, layer=layer, methods=methods, options=options, seed=seed, order=order,
                  granularity=granularity, smooth=smooth, noise=smooth_noise)  # fmt: skip
    summarise = lambda job: _write_sanity(job, run.out, run.as_json)  # noqa: E731
    run_command(job, model, run, inputs, several, sampling, prompts=prompts, summarise=summarise)


def _write_sanity(job: Any, out: Path, as_json: bool) -> None:
    from hookviz.evaluation.summary import summarise_sanity

    key = settings_key(job.settings())
    lines = (out / MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
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
    atomic_write(out / "sanity.json", json.dumps(finite(summary), indent=1, allow_nan=False))
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


TrustSeed = Annotated[int, typer.Option("--seed", rich_help_panel=METRICS,
    help="the random maps, the randomised classifier and the noise (same seed, same JSON).")]  # fmt: skip
MaxPhotos = Annotated[int, typer.Option("--max-photos", min=2, rich_help_panel=METRICS,
    help="photos tested, the first by name (16 give intervals worth reading).")]  # fmt: skip
Budget = Annotated[str | None, typer.Option("--budget", rich_help_panel=METRICS, help="stop after this "
    "long (600, 90s, 10m, 1m30s, 1h; at most a week), counted from the command's start, the model's load "
    "included, give or take one batch of passes: the answer says what it cut.")]  # fmt: skip
TrustOut = Annotated[Path, typer.Option("--out", "-o", rich_help_panel=OUTPUT, help="output folder: "
    "trust.json, trust.md and trust.png are written there (no manifest.jsonl).")]  # fmt: skip
TrustRun = Annotated[RunOptions, omit(
    "out", "skip_existing", "batch_size", "workers", "max_memory", "report", "null", "as_json", *DATA,
)]  # fmt: skip


@grouped
def trust(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    methods: Methods = None,
    layers: CamDefaultLayers = None,
    seed: TrustSeed = 0,
    max_photos: MaxPhotos = 16,
    boxes: Boxes = None,
    masks: MaskDir = None,
    mask_kind: MaskKind = "auto",
    budget: Budget = None,
    out: TrustOut = Path("out"),
    run: TrustRun = RunOptions(),
) -> None:
    """Which map to believe for this model: every method that applies, tested for randomisation, class
    sensitivity, faithfulness and stability over the photos (and localisation with --boxes or --masks), with
    an edge detector as the control, and the model checked for predictions at chance. Writes OUT/trust.json,
    trust.md and trust.png."""
    from hookviz.io.annotation import load
    from hookviz.io.images import quote
    from hookviz.io.inputs import refuse_out_among_inputs
    from hookviz.run.trust import FILES, table, trust_photos, write_trust
    from hookviz.run.verdicts import trust_key

    seconds = parse_budget(budget)
    found = None
    if boxes is not None or masks is not None:
        found = load(boxes, None if masks is None else Path(masks), mask_kind)
    refuse_out_among_inputs(out, inputs)
    command = _command(inputs, model, methods, layers, seed, max_photos, out, boxes, masks, mask_kind, budget)
    with claimed(out, FILES, run.overwrite):  # an earlier result, or a run going there: refused now
        loaded = load_warm(dataclasses.replace(model, device=run.device), run.quiet)
        say = None if run.quiet else lambda line: typer.echo(f"hookviz: trust: {line}", err=True)
        report, refused, failed = trust_photos(loaded, inputs, methods=methods, layers=layers, seed=seed,
                                       max_photos=max_photos, max_pixels=run.max_pixels, annotations=found,
                                       budget=seconds, progress=say, started=process_started(),
                                       out=out)  # fmt: skip
        for name, why in failed.items():
            said = why if why.startswith(quote(name)) else f"{quote(name)}: {why}"  # the name once, quoted
            typer.echo(f"hookviz: error: {one_line(said)}", err=True)
        paths = write_trust(report, out, command=command, refused=refused,
                            overwrite=run.overwrite, failed=failed, key=trust_key(loaded))  # fmt: skip
    if not run.quiet:
        typer.echo("\n".join(table(report)), err=True)
    typer.echo(f"hookviz: wrote {', '.join(str(p) for p in paths)}", err=True)
    if failed:
        typer.echo(f"hookviz: {len(failed)} input(s) could not be read; the verdicts are over the others",
                   err=True)  # fmt: skip
        raise typer.Exit(EXIT_INPUTS_FAILED)


def _command(inputs: list[str], model: ModelOptions, methods: list[str] | None, layers: list[str] | None,
             seed: int, max_photos: int, out: Path, boxes: Path | None, masks: str | None, mask_kind: str,
             budget: str | None) -> str:  # fmt: skip
    """The ``hookviz trust`` line that reproduces the run (trust.json's and trust.md's ``command``)."""
    import shlex

    words = (
        [*_model_words(model)]
        + [w for m in methods or [] for w in ("--method", m)]
        + [w for la in layers or [] for w in ("-l", la)]
    )
    words += ["--seed", str(seed), "--max-photos", str(max_photos), "--out", str(out)]
    words += ["--boxes", str(boxes)] if boxes is not None else []
    words += ["--masks", str(masks), "--mask-kind", mask_kind] if masks is not None else []
    words += ["--budget", str(budget)] if budget is not None else []
    return shlex.join(command_words(["hookviz", "trust"], inputs, words))
