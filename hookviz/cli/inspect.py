"""Looking at a model: ``featuremaps``, ``layers``, ``summary`` and ``models``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from hookviz.cli.app import EXIT_USAGE, fail
from hookviz.cli.flags import (
    MAPS,
    MODEL,
    OUTPUT,
    ClipLen,
    Debug,
    FeatureLayers,
    Inputs,
    InputSize,
    MeanOpt,
    Model,
    Overwrite,
    StdOpt,
    TrustPickle,
)
from hookviz.cli.loading import with_sampling
from hookviz.cli.options import ModelOptions, PlainModel, RunOptions, Sampling, group, grouped
from hookviz.cli.runner import run_command
from hookviz.io.files import atomic_write
from hookviz.options import Colormap, Stage, SummaryFormat, Task

StageOpt = Annotated[Stage, typer.Option("--stage", help="the layer's input, output or both.",
    rich_help_panel=MAPS)]  # fmt: skip
MaxChannels = Annotated[int, typer.Option("--max-channels", min=1, help="channels per grid.",
    rich_help_panel=MAPS)]  # fmt: skip
ChannelColours = Annotated[Colormap, typer.Option("--colormap", help="channel colours.",
    rich_help_panel=MAPS)]  # fmt: skip
FeatureRaw = Annotated[bool, typer.Option("--save-raw", help="also write each feature map as .npy: every "
    "channel of it (C, H, W), float32; the record's channels are those drawn.",
    rich_help_panel=OUTPUT)]  # fmt: skip


@grouped
def featuremaps(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    layers: FeatureLayers = None,
    stage: StageOpt = Stage.output,
    max_channels: MaxChannels = 64,
    colormap: ChannelColours = Colormap.viridis,
    save_raw: FeatureRaw = False,
    run: RunOptions = RunOptions(),
    sampling: Sampling = Sampling(),
) -> None:
    """Feature-map grids of Conv2d layers: what each channel responds to, one PNG per layer."""
    from hookviz.jobs.build import made_by  # loads torch: only once the command runs
    from hookviz.jobs.features import featuremap_job

    # --maps: the feature maps go into the store (as gradcam's raw maps do), so they are kept.
    job = made_by(featuremap_job, layers=layers, stage=str(stage), max_channels=max_channels,
                  colormap=str(colormap), save_raw=save_raw or run.maps is not None)  # fmt: skip
    run_command(job, model, run, inputs, sampling=sampling)


@group
@dataclass(frozen=True, kw_only=True)
class Looking:
    """What ``layers`` and ``summary`` take of the model beyond its name and weights."""

    trust_pickle: TrustPickle = False
    mean: MeanOpt = None
    std: StdOpt = None
    clip_len: ClipLen = None
    debug: Debug = False

    def load(self, model: str, weights: str, **how: Any) -> Any:
        """The model, loaded (with ``--clip-len`` for a video model)."""
        from hookviz.tasks import load_model  # loads torch: only once the command runs

        loaded = load_model(model, weights, trust_pickle=self.trust_pickle, **how)
        return with_sampling(loaded, self.clip_len, None, None)


@grouped
def layers(
    model: Model = "resnet18",
    weights: Annotated[
        str,
        typer.Option("--weights", "-w", help="weights to load (shapes need none).", rich_help_panel=MODEL),
    ] = "none",
    input_size: InputSize = None,
    depth: Annotated[
        int | None, typer.Option("--depth", min=1, help="only names with at most this many dots + 1.")
    ] = None,
    looking: Looking = Looking(),
) -> None:
    """List a model's hookable modules: name, type, output shape; marks the default Grad-CAM layer."""
    from hookviz.core.hooks import pool_of
    from hookviz.core.layers import default_cam_layer
    from hookviz.models.loaded import probe

    loaded = looking.load(model, weights, input_size=cast(Any, input_size))
    calls = probe(loaded)
    default = default_cam_layer(loaded.model, calls)
    params = {n: sum(p.numel() for p in m.parameters(recurse=False)) for n, m in loaded.model.named_modules()}
    width = max(len(c.name) for c in calls)
    typer.echo(f"{'name':<{width}}  {'type':<22} {'output shape':<22} {'params':>10}")
    for c in calls:
        if depth is not None and c.name.count(".") + 1 > depth:
            continue
        shape = "x".join(map(str, c.output_shape)) if c.output_shape else "-"
        calls_note = f" (runs {c.calls}x)" if c.calls > 1 else " (not run)" if c.calls == 0 else ""
        mark = "  <- default Grad-CAM layer" if c.name == default else ""
        if default == f"{c.name}:input":
            mark = f"  <- its input is the default Grad-CAM tensor ({default})"
        typer.echo(
            f"{c.name:<{width}}  {c.type:<22} {shape:<22} {params.get(c.name, 0):>10,}{calls_note}{mark}"
        )
    if default not in {c.name for c in calls} and not any(default == f"{c.name}:input" for c in calls):
        pool = pool_of(calls)
        shape = "x".join(map(str, pool.shape)) if pool is not None else "-"
        typer.echo(
            f"default Grad-CAM tensor: {default} ({shape}), the input of {loaded.name}'s global pooling "
            "in its forward (no module outputs it); --layer takes it by this name"
        )


def _parse_size(text: str) -> list[int]:
    try:
        parts = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give C,H,W (3,224,224), H,W or one side", param_hint="--input-size"
        ) from None
    if len(parts) == 1:
        parts = [3, parts[0], parts[0]]
    elif len(parts) == 2:
        parts = [3, *parts]
    if len(parts) not in (3, 4) or min(parts) < 1:
        raise typer.BadParameter(
            f"{text!r}: give C,H,W (3,224,224), H,W, one side, or a video model's C,T,H,W",
            param_hint="--input-size",
        )
    return parts


@grouped
def summary(
    model: Model = "resnet18",
    weights: Annotated[
        str,
        typer.Option("--weights", "-w", help="none (default: counts need no weights), DEFAULT, or a path."),
    ] = "none",
    input_size: Annotated[
        str | None, typer.Option("--input-size", help="C,H,W of one input (default: the model's, 3,224,224).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", min=1, help="inputs per forward pass.")
    ] = 1,
    depth: Annotated[int, typer.Option("--depth", min=0, help="module nesting shown (0 = totals only).")] = 2,
    fmt: Annotated[
        SummaryFormat, typer.Option("--format", help="how the table is printed.")
    ] = SummaryFormat.table,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="also write a bar chart of params and MACs (PNG).")
    ] = None,
    overwrite: Overwrite = False,
    looking: Looking = Looking(),
) -> None:
    """Shapes, parameters and MACs per module, totals, memory; attention and functional ops included."""
    size = _parse_size(input_size) if input_size is not None else None
    if plot is not None:
        if plot.exists() and not overwrite:
            fail(f"--plot {str(plot)!r}: the file exists; pass --overwrite to replace it", EXIT_USAGE)
        if not plot.parent.is_dir():
            fail(
                f"--plot {str(plot)!r}: the folder {str(plot.parent)!r} does not exist; create it first",
                EXIT_USAGE,
            )
        if plot.suffix.lower() != ".png":
            fail(f"--plot {str(plot)!r}: the plot is a PNG; give a path ending in .png", EXIT_USAGE)
    from hookviz.summary import summarize

    loaded = looking.load(model, weights)
    if size is None:
        size = list(loaded.input_shape)
        input_size = ",".join(map(str, size))
    try:
        result = summarize(
            loaded.model, size, batch_size=batch_size, depth=depth, name=loaded.name, on_meta=True
        )
    except RuntimeError as exc:  # the model cannot take that shape (channels, too small a side)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fail(
            f"--input-size {input_size}: {model} cannot run on an input of shape "
            f"({batch_size}, {', '.join(map(str, size))}) ({first}); give the C,H,W it expects, "
            "e.g. 3,224,224",
            EXIT_USAGE,
        )
    formats = {"markdown": result.to_markdown, "json": result.to_json, "csv": result.to_csv}
    text = str(result) if fmt == SummaryFormat.table else formats[str(fmt)]()
    typer.echo(text.rstrip("\n"))
    if plot is not None:
        from hookviz.io.images import encode_png
        from hookviz.render.plots import summary_plot

        atomic_write(plot, encode_png(summary_plot(result)))  # never half a PNG
        typer.echo(f"hookviz: wrote {plot}", err=True)


def models(
    task: Annotated[
        Task | None,
        typer.Option("--task", help="only this task's models, one name per line (for scripts)."),
    ] = None,
) -> None:
    """List torchvision's models with their task (timm:NAME, hf:DIR, file.py:FN and FILE.pt work too)."""
    from hookviz.models.torchvision import list_models

    if task is not None:
        for name in list_models(str(task)):
            typer.echo(name)
        return
    rows = [(name, t.value) for t in Task for name in list_models(t.value)]
    width = max(len(name) for name, _ in rows)
    for name, kind in rows:
        typer.echo(f"{name:<{width}}  {kind}")
