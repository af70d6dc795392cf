"""What a channel means: ``channels`` (its best inputs over a folder, and the channels behind a class)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hookviz.cli.app import (
    MAPS,
    BatchSize,
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
from hookviz.cli.groups import model_options, run_options
from hookviz.cli.kinds import InputSize
from hookviz.cli.runner import _Reporter, _run_then
from hookviz.errors import UsageError
from hookviz.io.files import atomic_write
from hookviz.models.classes import find_class
from hookviz.report import latest_records

if TYPE_CHECKING:
    from hookviz.jobs import Job
    from hookviz.models.loaded import LoadedModel

ChannelsOpt = Annotated[
    str | None,
    typer.Option(
        "--channels",
        help="channels given a sheet: 0,5,9 or 0-15. Default: every channel.",
        rich_help_panel=MAPS,
    ),
]


def channels(
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
            "--layers",
            "-l",
            help="layers (repeatable). Default: the CAM layer.",
            rich_help_panel=MAPS,
        ),
    ] = None,
    top: Annotated[
        int, typer.Option("--top", "-k", min=1, help="best inputs kept per channel.", rich_help_panel=MAPS)
    ] = 8,
    reduce: Annotated[
        str,
        typer.Option(
            "--reduce", help="a channel's score on an input: max or mean of its map.", rich_help_panel=MAPS
        ),
    ] = "max",
    chosen: ChannelsOpt = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="a class (index or name): rank the channels by their contribution to it "
            "(gradient x activation), per input and summed.",
            rich_help_panel=MAPS,
        ),
    ] = None,
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
    debug: Debug = False,
) -> None:
    """Each channel's best inputs over a folder of any size: OUT/channels.json and a sheet of crops per
    channel (resumable, torchrun-sharded); with --target, the channels that drive a class."""
    p = locals()
    m, r = model_options(p), run_options(p, lines=False)
    made: list[Any] = []
    with _guard(debug):
        summarise = lambda: _write_channels(made[0], out, p, quiet) if made else None  # noqa: E731
        _run_then(partial(_channels_job, p, made), m, r, summarise)


def _channels_job(p: dict[str, Any], made: list[Any], loaded: LoadedModel, reporter: _Reporter | None) -> Job:
    from hookviz.concepts.examples import receptive_field
    from hookviz.core.hooks import probe_input
    from hookviz.core.layers import default_cam_layer, map_layers
    from hookviz.jobs.channels import ChannelsJob
    from hookviz.models.loaded import probe

    calls = probe(loaded)
    names = map_layers(loaded.model, p["layers"], calls, loaded.name) if p["layers"] else []
    names = names or [default_cam_layer(loaded.model, calls)]
    target = None
    if p["target"] is not None:
        text = str(p["target"]).strip()
        target = int(text) if text.isdigit() else find_class(text, loaded.categories, "--target", loaded.name)
        count = len(loaded.categories)
        if count and not 0 <= target < count:
            raise UsageError(f"--target {target}: {loaded.name} has {count} classes (0-{count - 1})")
    from hookviz.concepts.dataset import parse_channels

    shapes = {c.name: c.output_shape for c in calls}
    for n in names:  # a bad --channels fails before the run, not after it
        shape = shapes.get(n)
        if shape is not None and len(shape) == 4:
            parse_channels(p["chosen"], int(shape[1]))
    x = probe_input(loaded.model, (1, *loaded.input_shape))
    fields = {n: receptive_field(loaded.model, x, n) for n in names}
    job = ChannelsJob(loaded=loaded, layers=names, reduce=p["reduce"], target=target, fields=fields)
    made.append(job)
    return job


def _write_channels(job: Any, out: Path, p: dict[str, Any], quiet: bool) -> None:
    """OUT/channels.json and OUT/channels/LAYER.cC.png from the run's records."""
    from hookviz.concepts import dataset
    from hookviz.io.images import encode_png, load_rgb
    from hookviz.run import pipeline

    key = pipeline.settings_key(job.settings())
    manifest = out / pipeline.MANIFEST
    lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines() if manifest.exists() else []
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    found = dataset.gather(recs, job.layers, p["top"])
    if not found.layers:
        typer.echo("hookviz: channels: no input was read; nothing to gather", err=True)
        return
    chosen = {e.layer: dataset.parse_channels(p["chosen"], len(e.top)) for e in found.layers}
    data = dataset.summary(found, chosen, job.fields)
    by_input = {str(x["input"]): x for x in recs}

    def field_px(name: str, layer: str) -> tuple[int, int]:
        h, w = by_input[name].get("fields", {}).get(layer, job.fields[layer])
        return int(h), int(w)

    sheets = out / dataset.SHEETS
    sheets.mkdir(parents=True, exist_ok=True)
    reduce = job.reduce
    for entry in found.layers:
        info = data["layers"][entry.layer]
        for item in info["channels"]:
            c = item["channel"]
            name = f"{pipeline._UNSAFE.sub('_', entry.layer)}.c{c}.png"
            title = (
                f"{job.loaded.name} {entry.layer} channel {c}: its {len(item['examples'])} best of "
                f"{entry.inputs} inputs by the {reduce} of its map; "
                f"field {info['field'][0]}x{info['field'][1]} px"
            )
            picture = dataset.channel_sheet(
                entry.top.best(c), partial(field_px, layer=entry.layer), load_rgb, title=title
            )
            atomic_write(sheets / name, encode_png(picture))
            item["sheet"] = str(Path(dataset.SHEETS) / name)
    data = {"key": key, "settings": job.settings(), "top": p["top"], **data}
    dataset.write_json(out / dataset.CHANNELS_JSON, data)
    if not quiet:
        lines_out = [f"{len(found.layers)} layer(s) over {found.inputs} input(s)"]
        for entry in found.layers:
            info = data["layers"][entry.layer]
            if "attribution" in info:
                best = ", ".join(f"{a['channel']} ({a['contribution']:.3g})" for a in info["attribution"][:5])
                lines_out.append(
                    f"{entry.layer}: channels driving {job.loaded.class_name(job.target)} most: {best}"
                )
        lines_out.append(
            f"wrote {out / dataset.CHANNELS_JSON} and {len(list(sheets.glob('*.png')))} sheets in {sheets}"
        )
        typer.echo("\n".join(lines_out), err=p["as_json"])
