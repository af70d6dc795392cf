"""What a channel means: ``channels`` (its best inputs over a folder, and the channels behind a class)."""

from __future__ import annotations

import json
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
from hookviz.cli.loading import load_options
from hookviz.cli.runner import _Reporter, _run_then, _warn
from hookviz.errors import HookvizError, UsageError
from hookviz.models.classes import find_class
from hookviz.report import build_report, latest_records

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
    m, r = model_options(p), run_options(p, lines=False, report=False)  # the page comes after the sheets
    made: list[Any] = []
    with _guard(debug):
        _run_then(partial(_channels_job, p, made), m, r, partial(_gathered, made, out, p))


def _gathered(made: list[Any], out: Path, p: dict[str, Any]) -> None:
    if made:
        _write_channels(made[0], out, p, p["quiet"])
    if p["report"]:
        typer.echo(f"hookviz: report: {build_report(out, warn=_warn)}", err=True)


def _channels_job(p: dict[str, Any], made: list[Any], loaded: LoadedModel, reporter: _Reporter | None) -> Job:
    from hookviz.concepts.dataset import parse_channels
    from hookviz.concepts.examples import receptive_field
    from hookviz.core.hooks import probe_input
    from hookviz.core.layers import default_cam_layer, map_layers
    from hookviz.jobs.channels import ChannelsJob
    from hookviz.models.loaded import probe

    calls = probe(loaded)
    names = map_layers(loaded.model, p["layers"], calls, loaded.name) if p["layers"] else []
    names = names or [default_cam_layer(loaded.model, calls)]
    target = _target_index(p["target"], loaded) if p["target"] is not None else None
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
    from hookviz.io.images import load_rgb
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
    dataset.write_sheets(found, data, sheets, job.loaded.name, job.reduce, field_px, dataset.Photos(load_rgb))
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
        written = sum("sheet" in c for layer in data["layers"].values() for c in layer["channels"])
        lines_out.append(f"wrote {out / dataset.CHANNELS_JSON} and {written} sheets in {sheets}")
        typer.echo("\n".join(lines_out), err=p["as_json"])


def tcav(
    inputs: Inputs,
    concept: Annotated[
        list[str],
        typer.Option(
            "--concept", help="NAME=FOLDER of the concept's examples (repeatable).", rich_help_panel=MAPS
        ),
    ],
    random_folders: Annotated[
        list[str],
        typer.Option(
            "--random",
            help="a folder of random examples (repeatable; five or more for the test).",
            rich_help_panel=MAPS,
        ),
    ],
    target: Annotated[str, typer.Option("--target", help="the class (index or name).", rich_help_panel=MAPS)],
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
    cav: Annotated[
        str,
        typer.Option(
            "--cav",
            help="linear (captum's SGD classifier) or mean (difference of means).",
            rich_help_panel=MAPS,
        ),
    ] = "linear",
    seed: Annotated[
        int, typer.Option("--seed", help="the CAVs' split and training.", rich_help_panel=MAPS)
    ] = 0,
    alpha: Annotated[
        float,
        typer.Option(
            "--alpha", min=0.0, max=1.0, help="significance level of the t-test.", rich_help_panel=MAPS
        ),
    ] = 0.05,
    out: Out = Path("out"),
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    debug: Debug = False,
) -> None:
    """TCAV: how much each concept (a folder of examples) matters to a class at a layer, against random
    folders, with a t-test; a table and OUT/tcav.json."""
    p = locals()
    m = model_options(p)
    with _guard(debug):
        named = _concepts(concept, random_folders)
        data = _tcav_data(p, named, load_options(m, quiet))
        from hookviz.concepts.dataset import write_json

        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "tcav.json", data)
        if as_json:
            typer.echo(json.dumps(data))
        if not quiet:
            typer.echo("\n".join([*_tcav_table(data), f"wrote {out / 'tcav.json'}"]), err=as_json)


def _concepts(specs: list[str], randoms: list[str]) -> dict[str, str]:
    named = {}
    for spec in specs:
        name, eq, folder = spec.partition("=")
        if not eq or not name.strip() or not folder.strip():
            raise UsageError(
                f"--concept {spec}: give NAME=FOLDER (a name for the concept, then its examples)"
            )
        named[name.strip()] = folder.strip()
    if len(randoms) < 2:
        raise UsageError("--random: give two random folders at least (five or more for a meaningful test)")
    if len(randoms) < 5:
        typer.echo(f"hookviz: note: {len(randoms)} random folders: the t-test says little below 5", err=True)
    return named


def _tcav_data(p: dict[str, Any], named: dict[str, str], loaded: LoadedModel) -> dict[str, Any]:
    """Every layer's TCAV scores, as ``tcav.json`` holds them."""
    from hookviz.concepts.tcav import as_json as tcav_json
    from hookviz.concepts.tcav import tcav as run_tcav
    from hookviz.core.layers import default_cam_layer, map_layers
    from hookviz.models.loaded import probe

    calls = probe(loaded)
    names = map_layers(loaded.model, p["layers"], calls, loaded.name) if p["layers"] else []
    names = names or [default_cam_layer(loaded.model, calls)]
    index = _target_index(p["target"], loaded)
    said: list[str] = []
    read = partial(_batches, loaded=loaded, size=p["batch_size"], max_pixels=p["max_pixels"], said=said)
    concepts = {name: partial(read, [folder]) for name, folder in named.items()}
    randoms = [partial(read, [folder]) for folder in p["random_folders"]]
    options = {"method": p["cav"], "seed": p["seed"], "alpha": p["alpha"]}
    results = [
        run_tcav(loaded.model, partial(read, [*p["inputs"]]), layer, index, concepts, randoms, **options)
        for layer in names
    ]
    for text in dict.fromkeys(said):
        typer.echo(f"hookviz: note: {text}", err=True)
    settings = {"model": loaded.name, "weights": loaded.weights, "cav": p["cav"], "seed": p["seed"],
                "alpha": p["alpha"], "concepts": named, "random": list(p["random_folders"])}  # fmt: skip
    return {
        "settings": settings,
        "target": {"index": index, "name": loaded.class_name(index)},
        "layers": [tcav_json(r) for r in results],
    }


def _target_index(text: str, loaded: LoadedModel) -> int:
    text = str(text).strip()
    index = int(text) if text.isdigit() else find_class(text, loaded.categories, "--target", loaded.name)
    count = len(loaded.categories)
    if count and not 0 <= index < count:
        raise UsageError(f"--target {index}: {loaded.name} has {count} classes (0-{count - 1})")
    return index


def _batches(specs: list[str], *, loaded: LoadedModel, size: int, max_pixels: int, said: list[str]) -> Any:
    """The photos ``specs`` name, as batches of model inputs; one that cannot be read is left out (said)."""
    import numpy as np
    import torch

    from hookviz.io.inputs import expand_inputs, read_input

    items = [i for i in expand_inputs(specs) if i.error is None and i.path is not None]
    if not items:
        raise UsageError(f"{', '.join(specs)}: no image found")
    chunk: list[np.ndarray] = []
    for item in items:
        try:
            _, x, _ = read_input(item, loaded.preprocess, max_pixels)
        except HookvizError as exc:
            said.append(f"left out: {exc}")
            continue
        chunk.append(x)
        if len(chunk) == size:
            yield torch.from_numpy(np.stack(chunk)).to(loaded.device)
            chunk = []
    if chunk:
        yield torch.from_numpy(np.stack(chunk)).to(loaded.device)


def _tcav_table(data: dict[str, Any]) -> list[str]:
    lines = [f"TCAV for {data['target']['name']} (sign count: the share of its inputs the concept pushes up)"]
    for layer in data["layers"]:
        lines.append(f"{layer['layer']} ({layer['inputs']} inputs):")
        for c in [*layer["concepts"], layer["null"]]:
            p = "" if c["p_value"] is None else f"  p={c['p_value']:.3g}"
            mark = " significant" if c["significant"] else ""
            lines.append(
                f"  {c['concept']:<20} {c['sign_count']:.2f} ± {c['sign_count_std']:.2f}  "
                f"magnitude {c['magnitude']:+.3g}{p}{mark}"
            )
    return lines
