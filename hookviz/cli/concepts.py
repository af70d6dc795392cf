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
from hookviz.errors import UsageError
from hookviz.io.outputs import settings_key
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
    """Each channel's best inputs over a folder of any size: OUT/channels.KEY.json and a sheet of crops per
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
    from hookviz.jobs.channels import channels_job

    job = channels_job(
        loaded, p["layers"], reduce=p["reduce"], target=p["target"], chosen=p["chosen"], top=p["top"]
    )
    made.append(job)
    return job


def _write_channels(job: Any, out: Path, p: dict[str, Any], quiet: bool) -> None:
    """OUT/channels.KEY.json and OUT/channels.KEY/LAYER.cC.png from the run's records (KEY: the settings')."""
    from hookviz.concepts import dataset
    from hookviz.run import pipeline

    key = pipeline.settings_key(job.settings())
    manifest = out / pipeline.MANIFEST
    lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines() if manifest.exists() else []
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    found = dataset.gather(recs, job.layers, p["top"], feed=job.feed)
    if not found.layers:
        typer.echo("hookviz: channels: no input was read; nothing to gather", err=True)
        return
    chosen = {e.layer: dataset.parse_channels(p["chosen"], len(e.top)) for e in found.layers}
    data = dataset.summary(found, chosen, job.fields)
    by_input = {str(x["input"]): x for x in recs}

    def field_px(name: str, layer: str) -> tuple[int, int]:
        h, w = by_input[name].get("fields", {}).get(layer, job.fields[layer])
        return int(h), int(w)

    gather = {"top": p["top"], "channels": p["chosen"]}  # the records' key, and what gathering chooses
    json_name, sheets_name = dataset.gathered_names(settings_key({"run": key, **gather}))
    sheets = out / sheets_name
    dataset.write_sheets(found, data, sheets, job.loaded.name, job.reduce, field_px, dataset.Photos())
    data = {"key": key, "settings": job.settings(), "top": p["top"], **data}
    dataset.write_json(out / json_name, data)
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
        lines_out.append(f"wrote {out / json_name} and {written} sheets in {sheets}")
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
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    debug: Debug = False,
) -> None:
    """TCAV: how much each concept (a folder of examples) matters to a class at a layer, against random
    folders, with a t-test; a table and OUT/tcav.KEY.json (KEY: the settings'; a rerun is skipped)."""
    p = locals()
    m = model_options(p)
    with _guard(debug):
        from hookviz.concepts.dataset import write_json
        from hookviz.concepts.tcav import tcav_plan, tcav_report

        named = _concepts(concept, random_folders)
        loaded = load_options(m, quiet)
        spec = dict(layers=layers, method=cav, seed=seed, alpha=alpha)
        _, _, settings = tcav_plan(loaded, inputs, target, named, random_folders, **spec)  # type: ignore[arg-type]
        path = out / f"tcav.{settings_key(settings)}.json"
        if path.is_file() and not overwrite:
            data, status = json.loads(path.read_text(encoding="utf-8")), "skipped"
        else:
            data, said = tcav_report(
                loaded, inputs, target, named, random_folders, **spec, batch=batch_size,  # type: ignore[arg-type]
                max_pixels=max_pixels,
            )  # fmt: skip
            for text in said:
                typer.echo(f"hookviz: note: {text}", err=True)
            out.mkdir(parents=True, exist_ok=True)
            write_json(path, data)
            status = "ok"
        if as_json:
            typer.echo(json.dumps({"status": status, "output": str(path), **data}))
        if not quiet:
            done = f"wrote {path}" if status == "ok" else f"skipped: {path} exists (--overwrite redoes it)"
            typer.echo("\n".join([*_tcav_table(data), done]), err=as_json)


def _concepts(specs: list[str], randoms: list[str]) -> dict[str, str]:
    named: dict[str, str] = {}
    for spec in specs:
        name, eq, folder = spec.partition("=")
        if not eq or not name.strip() or not folder.strip():
            raise UsageError(
                f"--concept {spec}: give NAME=FOLDER (a name for the concept, then its examples)"
            )
        if name.strip() in named:
            raise UsageError(f"--concept {name.strip()} is given twice; give each concept once")
        named[name.strip()] = folder.strip()
    if len(randoms) < 2:
        raise UsageError("--random: give two random folders at least (five or more for a meaningful test)")
    if len(randoms) < 5:
        typer.echo(f"hookviz: note: {len(randoms)} random folders: the t-test says little below 5", err=True)
    return named


def _tcav_table(data: dict[str, Any]) -> list[str]:
    lines = [f"TCAV for {data['target']['name']} (sign count: the share of its inputs the concept pushes up)"]
    for layer in data["layers"]:
        lines.append(f"{layer['layer']} ({layer['inputs']} inputs):")
        for c in [*layer["concepts"], layer["null"]]:
            p = "" if c["p_value"] is None else f"  p={c['p_value']:.3g}"
            mark = " significant" if c["significant"] else ""
            if c.get("meaningful") is False:
                mark = f"  not meaningful (CAV accuracy {c.get('cav_accuracy') or 0:.2f}: chance)"
            lines.append(
                f"  {c['concept']:<20} {c['sign_count']:.2f} ± {c['sign_count_std']:.2f}  "
                f"magnitude {c['magnitude']:+.3g}{p}{mark}"
            )
    return lines
