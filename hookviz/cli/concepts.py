"""What a channel means: ``channels`` (its best inputs over a folder, and the channels behind a class)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.flags import MAPS, ConceptLayers, Inputs
from hookviz.cli.loading import load_options
from hookviz.cli.options import DATA, ModelOptions, PlainModel, RunOptions, grouped, omit, told
from hookviz.cli.runner import run_command, warn
from hookviz.errors import UsageError
from hookviz.io.outputs import MANIFEST, settings_key
from hookviz.report import build_report, latest_records

ChannelsOpt = Annotated[str | None, typer.Option("--channels", rich_help_panel=MAPS,
    help="channels given a sheet: 0,5,9 or 0-15. Default: every channel.")]  # fmt: skip
Top = Annotated[int, typer.Option("--top", "-k", min=1, help="best inputs kept per channel.",
    rich_help_panel=MAPS)]  # fmt: skip
Reduce = Annotated[str, typer.Option("--reduce", rich_help_panel=MAPS,
    help="a channel's score on an input: max or mean of its map.")]  # fmt: skip
DrivenTarget = Annotated[str | None, typer.Option("--target", rich_help_panel=MAPS, help="a class (index or "
    "name): rank the channels by their contribution to it (gradient x activation), per input and "
    "summed.")]  # fmt: skip


@grouped
def channels(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    layers: ConceptLayers = None,
    top: Top = 8,
    reduce: Reduce = "max",
    chosen: ChannelsOpt = None,
    target: DrivenTarget = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Each channel's best inputs over a folder of any size: OUT/channels.KEY.json and a sheet of crops per
    channel (resumable, torchrun-sharded); with --target, the channels that drive a class."""
    from hookviz.jobs.build import made_by
    from hookviz.jobs.channels import channels_job  # loads torch: only once the command runs

    def gathered(job: Any) -> None:
        _write_channels(job, run.out, top, chosen, run.quiet, run.as_json)
        if run.report:  # the page comes after the sheets
            typer.echo(f"hookviz: report: {build_report(run.out, warn=warn)}", err=True)

    job = made_by(channels_job, layers=layers, reduce=reduce, target=target, chosen=chosen, top=top)
    run_command(job, model, run, inputs, summarise=gathered, lines=False, report=False)


def _write_channels(job: Any, out: Path, top: int, chosen: str | None, quiet: bool, as_json: bool) -> None:
    """OUT/channels.KEY.json and OUT/channels.KEY/LAYER.cC.png from the run's records (KEY: the settings')."""
    from hookviz.concepts import dataset

    key = settings_key(job.settings())
    manifest = out / MANIFEST
    lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines() if manifest.exists() else []
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    found = dataset.gather(recs, job.layers, top, feed=job.feed)
    if not found.layers:
        typer.echo("hookviz: channels: no input was read; nothing to gather", err=True)
        return
    sheets_of = {e.layer: dataset.parse_channels(chosen, len(e.top)) for e in found.layers}
    data = dataset.summary(found, sheets_of, job.fields)
    by_input = {str(x["input"]): x for x in recs}

    def field_px(name: str, layer: str) -> tuple[int, int]:
        h, w = by_input[name].get("fields", {}).get(layer, job.fields[layer])
        return int(h), int(w)

    gather = {"top": top, "channels": chosen}  # the records' key, and what gathering chooses
    json_name, sheets_name = dataset.gathered_names(settings_key({"run": key, **gather}))
    sheets = out / sheets_name
    dataset.write_sheets(found, data, sheets, job.loaded.name, job.reduce, field_px, dataset.Photos())
    data = {"key": key, "settings": job.settings(), "top": top, **data}
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
        typer.echo("\n".join(lines_out), err=as_json)


Concept = Annotated[list[str], typer.Option("--concept", help="NAME=FOLDER of the concept's examples "
    "(repeatable).", rich_help_panel=MAPS)]  # fmt: skip
RandomFolders = Annotated[list[str], typer.Option("--random", rich_help_panel=MAPS,
    help="a folder of random examples (repeatable; five or more for the test).")]  # fmt: skip
TcavTarget = Annotated[str, typer.Option("--target", help="the class (index or name).", rich_help_panel=MAPS)]
Cav = Annotated[str, typer.Option("--cav", rich_help_panel=MAPS,
    help="linear (captum's SGD classifier) or mean (difference of means).")]  # fmt: skip
CavSeed = Annotated[int, typer.Option("--seed", help="the CAVs' split and training.", rich_help_panel=MAPS)]
Alpha = Annotated[float, typer.Option("--alpha", min=0.0, max=1.0, help="significance level of the t-test.",
    rich_help_panel=MAPS)]  # fmt: skip


@grouped
def tcav(
    inputs: Inputs,
    concept: Concept,
    random_folders: RandomFolders,
    target: TcavTarget,
    model: PlainModel = ModelOptions(),
    layers: ConceptLayers = None,
    cav: Cav = "linear",
    seed: CavSeed = 0,
    alpha: Alpha = 0.05,
    run: Annotated[
        RunOptions,
        omit("skip_existing", "workers", "max_memory", "report", "null", *DATA),
        told(out="output folder: tcav.KEY.json goes there (KEY: the settings')."),
    ] = RunOptions(),
) -> None:
    """TCAV: how much each concept (a folder of examples) matters to a class at a layer, against random
    folders, with a t-test; a table and OUT/tcav.KEY.json (KEY: the settings'; a rerun is skipped)."""
    from hookviz.concepts.dataset import write_json
    from hookviz.concepts.tcav import TcavAsked, tcav_plan, tcav_report

    out, quiet, as_json = run.out, run.quiet, run.as_json
    named = _concepts(concept, random_folders)
    loaded = load_options(dataclasses.replace(model, device=run.device), quiet)
    asked = TcavAsked(
        inputs, target, named, random_folders, layers=layers, method=cav, seed=seed, alpha=alpha
    )
    _, _, settings = tcav_plan(loaded, asked)
    path = out / f"tcav.{settings_key(settings)}.json"
    if path.is_file() and not run.overwrite:
        data, status = json.loads(path.read_text(encoding="utf-8")), "skipped"
    else:
        data, said = tcav_report(loaded, asked, batch=run.batch_size, max_pixels=run.max_pixels)
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
