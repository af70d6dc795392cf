"""``visualize``: the picture a channel, a neuron or a direction of a layer responds to most."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.flags import MAPS, VisualLayer
from hookviz.cli.loading import load_options
from hookviz.cli.options import DATA, ModelOptions, RunOptions, group, grouped, omit, told
from hookviz.errors import OutputError, UsageError
from hookviz.io.files import atomic_write
from hookviz.io.outputs import finite, safe_name, settings_key

Channel = Annotated[int | None, typer.Option("--channel", "-c", min=0, help="the channel.",
    rich_help_panel=MAPS)]  # fmt: skip
Neuron = Annotated[str | None, typer.Option("--neuron", help="Y,X: one position of the channel's map.",
    rich_help_panel=MAPS)]  # fmt: skip
Direction = Annotated[Path | None, typer.Option("--direction", rich_help_panel=MAPS,
    help="a .npy vector of the layer's channels (a CAV, a difference).")]  # fmt: skip
Steps = Annotated[int, typer.Option("--steps", min=1, help="optimisation steps.", rich_help_panel=MAPS)]
Lr = Annotated[float, typer.Option("--lr", min=0.0, help="Adam's learning rate.", rich_help_panel=MAPS)]
Seed = Annotated[int, typer.Option("--seed", help="the start and the transformations.",
    rich_help_panel=MAPS)]  # fmt: skip
Size = Annotated[int, typer.Option("--size", min=8, help="the picture's side in pixels.",
    rich_help_panel=MAPS)]  # fmt: skip
Images = Annotated[int, typer.Option("--images", min=1, help="pictures at once.", rich_help_panel=MAPS)]
Diversity = Annotated[float, typer.Option("--diversity", min=0.0, rich_help_panel=MAPS,
    help="push the pictures apart (with --images 2+; 1e-2 to 1).")]  # fmt: skip


#: The run options ``visualize`` does not take (it makes one picture, not a run over inputs).
_NOT_HERE = (
    "skip_existing", "as_json", "batch_size", "workers", "max_pixels", "max_memory", "report", "null", *DATA
)  # fmt: skip
#: Where visualize writes (a picture and a record per settings' key; no manifest).
_OUT = "output folder: the picture and its JSON record (visualize.*.png, visualize.*.json) go there."


@group
@dataclass(frozen=True, kw_only=True)
class Picture:
    """What to visualise, and how the picture is optimised."""

    layer: VisualLayer
    channel: Channel = None
    neuron: Neuron = None
    direction: Direction = None
    steps: Steps = 512
    lr: Lr = 0.05
    seed: Seed = 0
    size: Size = 128
    images: Images = 1
    diversity: Diversity = 0.0

    def optimisation(self) -> dict[str, Any]:
        """The settings of the optimisation (as :func:`hookviz.concepts.visualize.visualize` takes them)."""
        return {k: getattr(self, k) for k in ("size", "steps", "lr", "seed", "images", "diversity")}


@grouped
def visualize(
    picture: Picture,
    model: Annotated[ModelOptions, omit("labels", "resize", "head", "task", "negate")] = ModelOptions(),
    run: Annotated[RunOptions, omit(*_NOT_HERE), told(out=_OUT)] = RunOptions(),
) -> None:
    """Feature visualisation: the picture that drives a channel (or a neuron, or a direction) most, optimised
    in a decorrelated Fourier space under random transformations (as lucent); a PNG and a JSON record, named
    by the settings' key (an identical rerun is skipped)."""
    from hookviz.concepts import visualize as vis
    from hookviz.core.layers import one_module
    from hookviz.models.settings import model_settings

    vector = vis.load_direction(picture.direction) if picture.direction is not None else None
    loaded = load_options(dataclasses.replace(model, device=run.device), run.quiet)
    p, out = dataclasses.replace(picture, layer=one_module(loaded.model, picture.layer, loaded.name)), run.out
    settings = {
        **model_settings(loaded), "layer": p.layer, "channel": p.channel, "neuron": p.neuron,
        "direction": vis.direction_digest(vector) if vector is not None else None, **p.optimisation(),
    }  # fmt: skip
    key = settings_key(settings)
    stem = f"visualize.{safe_name(loaded.name)}.{safe_name(p.layer)}.{_what(p)}.s{p.seed}.{key}"
    paths = [out / f"{stem}.png", out / f"{stem}.json"]
    if not run.overwrite and all(path.is_file() for path in paths):
        if not run.quiet:
            typer.echo(f"{paths[0]}: skipped (made with these settings; --overwrite redoes it)")
        return
    if not run.overwrite and any(path.exists() for path in paths):
        raise OutputError(f"{paths[0]}: half of an earlier run's outputs exist; pass --overwrite to redo it")
    record, png = _render(p, loaded, vector)
    record["key"], record["outputs"] = key, [str(path) for path in paths]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(paths[0], png)
    atomic_write(paths[1], json.dumps(finite(record), indent=1, allow_nan=False))
    if not run.quiet:
        values = ", ".join(f"{v:.4g}" for v in record["objective"])
        typer.echo(f"{paths[0]}: objective {values} after {p.steps} steps")
        if record.get("note"):
            typer.echo(f"hookviz: note: {record['note']}", err=True)


def _what(p: Picture) -> str:
    if p.direction is not None:
        return f"direction-{safe_name(Path(p.direction).stem)}"
    neuron = f".at{safe_name(p.neuron.replace(',', '_'))}" if p.neuron else ""
    return f"c{p.channel}{neuron}"


def _render(p: Picture, loaded: Any, vector: Any) -> tuple[dict[str, Any], bytes]:
    """The optimised pictures as one PNG, and the record of how they were made."""
    from hookviz.concepts import visualize as vis

    neuron = _pair(p.neuron) if p.neuron else None
    objective = vis.Objective(p.layer, channel=p.channel, neuron=neuron, direction=vector)
    pre = loaded.preprocess
    shape = loaded.input_shape
    settings = p.optimisation()
    sides = (int(shape[-2]), int(shape[-1]))
    result = vis.visualize(loaded.model, objective, input_size=sides, mean=pre.mean, std=pre.std, **settings)
    what = f"channel {p.channel}" if vector is None else f"direction {Path(str(p.direction)).name}"
    if neuron is not None:
        what += f" at {neuron[0]},{neuron[1]}"
    title = f"{loaded.name} {p.layer} {what}: {p.steps} steps, seed {p.seed}"
    record = {
        "model": loaded.name, "weights": loaded.weights, "layer": p.layer, "channel": p.channel,
        "neuron": list(neuron) if neuron else None,
        "direction": str(p.direction) if p.direction else None, **settings,
        "objective": [round(v, 6) for v in result.objective],
        "history": [round(v, 6) for v in result.history[:: max(1, len(result.history) // 64)]],
        "note": vis.dead_note(result, what),
    }  # fmt: skip
    return record, vis.picture(result.images, title)


def _pair(text: str) -> tuple[int, int]:
    y, _, x = text.partition(",")
    if not (y.strip().isdigit() and x.strip().isdigit()):
        raise UsageError(f"--neuron {text!r}: give Y,X (map cells), like 3,4")
    return int(y), int(x)
