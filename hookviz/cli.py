"""The ``hookviz`` command: parses options, calls the library, prints, and maps errors to exit codes.

Exit codes: 0 all inputs done; 1 one or more inputs failed (the others were done); 2 bad command line
or option value; 3 the run could not start (weights, output folder); 130 interrupted (Ctrl-C).
Heavy modules (torch, cv2, matplotlib) are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from hookviz.errors import HookvizError

app = typer.Typer(
    name="hookviz",
    help="Look inside convolutional networks with PyTorch hooks: feature maps, Grad-CAM, layers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_INPUTS_FAILED = 1
EXIT_USAGE = 2
EXIT_SETUP = 3
EXIT_INTERRUPTED = 130

F = TypeVar("F", bound=Callable[..., Any])

# Options shared by several commands.
Model = Annotated[
    str, typer.Option("--model", "-m", help="torchvision classification model (`hookviz models`).")
]
Weights = Annotated[
    str,
    typer.Option(
        "--weights",
        "-w",
        help="DEFAULT (pretrained, downloaded once into the torch hub cache), a weights name "
        "(IMAGENET1K_V2), none (random init), or the path of a state_dict/checkpoint.",
    ),
]
Device = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda or cuda:N.")]
Out = Annotated[Path, typer.Option("--out", "-o", help="output folder; manifest.jsonl is appended there.")]
BatchSize = Annotated[int, typer.Option("--batch-size", "-b", help="images per forward pass.")]
Workers = Annotated[int, typer.Option("--workers", help="threads decoding, rendering and writing images.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="replace existing outputs.")]
SkipExisting = Annotated[
    bool, typer.Option("--skip-existing", help="leave inputs whose outputs all exist (resume).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar and no per-input lines.")]
JsonOut = Annotated[bool, typer.Option("--json", help="print each manifest record as a JSON line on stdout.")]
Debug = Annotated[bool, typer.Option("--debug", help="show tracebacks.")]
InputSize = Annotated[
    int | None, typer.Option("--input-size", help="square model input side (default: the weights').")
]
Resize = Annotated[
    str,
    typer.Option(
        "--resize",
        help="crop: torchvision's eval transform (centre crop; the map covers the part the model saw); "
        "squash: whole image resized to a square.",
    ),
]
MaxPixels = Annotated[int, typer.Option("--max-pixels", help="refuse images larger than this many pixels.")]
Inputs = Annotated[
    list[str],
    typer.Argument(help="image files, folders (searched recursively), globs, or - to read paths from stdin."),
]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"hookviz: error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def _guard(debug: bool) -> Iterator[None]:
    """Map hookviz errors and Ctrl-C to one stderr line and an exit code."""
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("hookviz: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except HookvizError as exc:
        if debug:
            raise
        _fail(str(exc), exc.exit_code)
    except (typer.Exit, typer.BadParameter):
        raise
    except Exception as exc:
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        _fail(f"internal error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)", 1)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}", param_hint=name)


def _load(model: str, weights: str, device: str, input_size: int | None, resize: str, quiet: bool) -> Any:
    from hookviz.models import load_model, resolve_device

    dev = resolve_device(device)
    return load_model(
        model,
        weights,
        device=dev,
        input_size=input_size,
        resize=resize,
        progress=not quiet and sys.stderr.isatty(),
    )


def _progress(records: Iterator[dict[str, Any]], total: int, quiet: bool, as_json: bool) -> tuple[int, int]:
    """Print records as they come (results on stdout, errors on stderr); return (ok, failed).

    On a terminal a progress bar runs on stderr; lines bound for the same terminal are printed through
    the bar's console so they scroll above it instead of tearing it.
    """
    ok = failed = 0
    bar = None
    if not quiet and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(transient=True, console=Console(stderr=True), redirect_stdout=False)
        bar.start()
        task = bar.add_task("images", total=total)

    def say(text: str, err: bool = False) -> None:
        if bar is not None and (err or sys.stdout.isatty()):
            bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            typer.echo(text, err=err)

    try:
        for rec in records:
            if rec["status"] == "error":
                failed += 1
                say(f"hookviz: {rec['error']}", err=True)
            else:
                ok += 1
            if as_json:
                say(json.dumps(rec, ensure_ascii=False))
            elif not quiet and rec["status"] != "error":
                say(_describe(rec))
            if bar is not None:
                bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()
    return ok, failed


def _describe(rec: dict[str, Any]) -> str:
    if rec["status"] == "skipped":
        return f"{rec['input']}: skipped (outputs exist)"
    parts = [f"{rec['input']}:"]
    if "predicted" in rec:
        p, t = rec["predicted"], rec["target"]
        parts.append(f"predicted {p['name']} ({p['index']}) p={p['score']:.3f};")
        if t["index"] != p["index"]:
            parts.append(f"explained {t['name']} ({t['index']}) p={t['score']:.3f};")
    outs = rec["outputs"]
    parts.append(f"wrote {outs[0]}" + (f" (+{len(outs) - 1} more)" if len(outs) > 1 else ""))
    return " ".join(parts)


def _run_job(job_factory: Callable[[Any], Any], opts: dict[str, Any]) -> None:
    """The shared body of the per-image commands; ``opts`` is the command's ``locals()`` (its options)."""
    from hookviz import pipeline

    inputs: list[str] = opts["inputs"]
    out: Path = opts["out"]
    quiet: bool = opts["quiet"]
    batch_size: int = opts.get("batch_size", 8)
    workers: int = opts.get("workers", 2)
    resize: str = opts["resize"]
    if batch_size < 1:
        raise typer.BadParameter(f"{batch_size} (must be at least 1)", param_hint="--batch-size")
    if workers < 1:
        raise typer.BadParameter(f"{workers} (must be at least 1)", param_hint="--workers")
    _check_choice("--resize", resize, ("crop", "squash"))
    output = pipeline.Output(out, overwrite=opts["overwrite"])
    items = pipeline.expand_inputs(inputs, sys.stdin if "-" in inputs else None, exclude=out)
    real_out = out.resolve()
    for spec in inputs:
        if spec != "-" and Path(spec).is_dir() and Path(spec).resolve() == real_out:
            _fail(
                f"--out {out} is also an input folder; outputs would be read back as inputs. "
                "Choose another --out",
                2,
            )
    loaded = _load(opts["model"], opts["weights"], opts["device"], opts["input_size"], resize, quiet)
    job = job_factory(loaded)
    output.prepare()
    base = {
        "command": job.kind,
        "model": loaded.name,
        "weights": loaded.weights,
        "pretrained": loaded.pretrained,
    }
    if not loaded.pretrained and not quiet:
        typer.echo(
            f"hookviz: note: {loaded.name} has RANDOM weights (--weights none); maps show mechanics only",
            err=True,
        )
    records = pipeline.run(
        items,
        job,
        preprocess=loaded.preprocess,
        output=output,
        device=loaded.device,
        base=base,
        batch_size=batch_size,
        workers=workers,
        skip_existing=opts["skip_existing"],
        max_pixels=opts["max_pixels"],
    )
    _, failed = _progress(records, len(items), quiet, opts["as_json"])
    if failed:
        typer.echo(
            f"hookviz: {failed} of {len(items)} input(s) failed; see {out / pipeline.MANIFEST}", err=True
        )
        raise typer.Exit(EXIT_INPUTS_FAILED)


@app.command()
def gradcam(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    layers: Annotated[
        list[str] | None,
        typer.Option(
            "--layer", "-l", help="module name; repeatable (default: the last convolutional stage)."
        ),
    ] = None,
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            help="gradcam, gradcampp, xgradcam, layercam, hirescam, eigencam, scorecam, or all; repeatable.",
        ),
    ] = None,
    target: Annotated[
        str, typer.Option("--target", "-t", help="top1, topK (top5), a class index or name, or a comma list.")
    ] = "top1",
    normalize: Annotated[
        str,
        typer.Option(
            "--normalize",
            help="image: each map min-max; batch: one scale per batch; none: one fixed scale for the run.",
        ),
    ] = "image",
    vmax: Annotated[
        float | None, typer.Option("--vmax", help="with --normalize none: the value shown as full colour.")
    ] = None,
    fuse: Annotated[
        str | None, typer.Option("--fuse", help="mean or max: also fuse the maps of all layers.")
    ] = None,
    sheet: Annotated[
        bool | None, typer.Option("--sheet/--no-sheet", help="comparison sheet (default: when >1 map).")
    ] = None,
    scorecam_batch: Annotated[
        int, typer.Option("--scorecam-batch", min=1, help="masked inputs per Score-CAM forward pass.")
    ] = 64,
    alpha: Annotated[float, typer.Option("--alpha", min=0.0, max=1.0, help="heatmap opacity.")] = 0.5,
    colormap: Annotated[
        str, typer.Option("--colormap", help="jet, turbo, viridis, inferno, magma, ...")
    ] = "jet",
    no_relu: Annotated[
        bool, typer.Option("--no-relu", help="signed maps: negative evidence in blue.")
    ] = False,
    save_raw: Annotated[
        bool, typer.Option("--save-raw", help="also write raw maps as .npy (feature and photo resolution).")
    ] = False,
    out: Out = Path("out"),
    batch_size: BatchSize = 8,
    device: Device = "auto",
    workers: Workers = 2,
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    input_size: InputSize = None,
    resize: Resize = "crop",
    max_pixels: MaxPixels = 80_000_000,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class."""
    from hookviz.cams import METHODS
    from hookviz.render import COLORMAPS

    _check_choice("--colormap", colormap, COLORMAPS)
    _check_choice("--normalize", normalize, ("image", "batch", "none"))
    if fuse is not None:
        _check_choice("--fuse", fuse, ("mean", "max"))
    chosen_methods = list(dict.fromkeys(methods or ["gradcam"]))
    if "all" in chosen_methods:
        chosen_methods = list(METHODS)
    for m in chosen_methods:
        _check_choice("--method", m, (*METHODS, "all"))
    with _guard(debug):

        def make(loaded: Any) -> Any:
            from hookviz.errors import LayerError
            from hookviz.hooks import resolve_layers
            from hookviz.jobs import CamJob
            from hookviz.models import default_cam_layer, parse_targets, probe

            calls = probe(loaded)
            if not layers:
                chosen = [default_cam_layer(loaded.model, calls)]
            else:
                for name in layers:
                    if any(ch in name for ch in "*?["):
                        raise LayerError(f"--layer takes module names, not patterns ({name!r})")
                chosen = resolve_layers(loaded.model, layers, model_name=loaded.name)
                for name in chosen:
                    _check_spatial(name, calls, loaded)
            t = parse_targets(target, loaded, _num_classes(loaded))
            if not layers and not quiet:
                typer.echo(
                    f"hookviz: using layer {chosen[0]} "
                    f"(the default for {loaded.name}: its last spatial stage; --layer to change)",
                    err=True,
                )
            return CamJob(
                loaded,
                chosen,
                chosen_methods,
                t,
                alpha,
                colormap,
                relu=not no_relu,
                save_raw=save_raw,
                normalize=normalize,
                vmax=vmax,
                fuse=fuse,
                sheet=sheet,
                scorecam_batch=scorecam_batch,
            )

        _run_job(make, locals())


def _num_classes(loaded: Any) -> int:
    if loaded.categories:  # the weights name their classes: no forward pass needed
        return len(loaded.categories)
    import torch

    s = loaded.preprocess.crop_size
    with torch.no_grad():
        was = loaded.model.training
        loaded.model.eval()
        try:
            logits = loaded.model(torch.zeros(1, 3, s, s, device=loaded.device))
        finally:
            loaded.model.train(was)
    return int(logits.shape[-1])


def _check_spatial(name: str, calls: Any, loaded: Any) -> None:
    from hookviz.attribution import layout_of
    from hookviz.errors import LayerError

    info = next((c for c in calls if c.name == name), None)
    if info is None or info.calls == 0:
        raise LayerError(f"layer {name!r} does not run in {loaded.name}'s forward pass; pick another layer")
    try:
        layout_of(loaded.model, name, info.output_shape or ())
    except LayerError as exc:
        raise LayerError(f"{exc} (`hookviz layers --model {loaded.name}` lists them)") from None
    if info.calls > 1:
        raise LayerError(
            f"layer {name!r} runs {info.calls} times per forward pass, so its gradient is ambiguous; "
            "pick a layer that runs once (e.g. its parent block)"
        )


@app.command()
def featuremaps(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    layers: Annotated[
        list[str] | None,
        typer.Option(
            "--layers",
            "--layer",
            "-l",
            help="names or globs (layer*.0.conv1); repeatable. Default: every Conv2d.",
        ),
    ] = None,
    stage: Annotated[str, typer.Option("--stage", help="input, output or both.")] = "output",
    max_channels: Annotated[int, typer.Option("--max-channels", min=1, help="channels per grid.")] = 64,
    colormap: Annotated[str, typer.Option("--colormap", help="viridis, inferno, gray, jet, ...")] = "viridis",
    out: Out = Path("out"),
    batch_size: BatchSize = 8,
    device: Device = "auto",
    workers: Workers = 2,
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    input_size: InputSize = None,
    resize: Resize = "crop",
    max_pixels: MaxPixels = 80_000_000,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """Feature-map grids of Conv2d layers: what each channel responds to, one PNG per layer."""
    from hookviz.render import COLORMAPS

    _check_choice("--stage", stage, ("input", "output", "both"))
    _check_choice("--colormap", colormap, COLORMAPS)
    with _guard(debug):

        def make(loaded: Any) -> Any:
            from torch import nn

            from hookviz.errors import LayerError
            from hookviz.hooks import module_names, resolve_layers
            from hookviz.jobs import FeatureMapJob
            from hookviz.models import probe

            if not layers:
                names = resolve_layers(loaded.model, ["*"], model_name=loaded.name, kinds=(nn.Conv2d,))
            else:
                calls = {c.name: c for c in probe(loaded)}
                chosen: set[str] = set()
                for pattern in layers:
                    found = resolve_layers(loaded.model, [pattern], model_name=loaded.name)
                    if any(ch in pattern for ch in "*?["):
                        # A glob keeps the layers that have a feature map (blocks, convs, norms, ...).
                        found = [n for n in found if _has_map(calls[n])]
                        if not found:
                            raise LayerError(
                                f"pattern {pattern!r} matches no layer with a (B, C, H, W) output"
                            )
                    else:
                        _check_spatial_any(found[0], calls[found[0]], loaded.name)
                    chosen.update(found)
                names = [n for n in module_names(loaded.model) if n in chosen]
            return FeatureMapJob(loaded, names, stage, max_channels, colormap)

        _run_job(make, locals())


def _has_map(info: Any) -> bool:
    return bool(info.calls) and info.output_shape is not None and len(info.output_shape) == 4


def _check_spatial_any(name: str, info: Any, model_name: str) -> None:
    from hookviz.errors import LayerError

    if info.calls == 0:
        raise LayerError(f"layer {name!r} does not run in {model_name}'s forward pass")
    if not _has_map(info):
        raise LayerError(
            f"layer {name!r} ({info.type}) outputs shape {info.output_shape}, not a feature map; "
            "pick a convolutional layer"
        )


@app.command()
def layers(
    model: Model = "resnet18",
    weights: Annotated[
        str, typer.Option("--weights", "-w", help="weights to load (shapes need none).")
    ] = "none",
    input_size: InputSize = None,
    depth: Annotated[
        int | None, typer.Option("--depth", help="only names with at most this many dots + 1.")
    ] = None,
    debug: Debug = False,
) -> None:
    """List a model's hookable modules: name, type, output shape; marks the default Grad-CAM layer."""
    with _guard(debug):
        from hookviz.models import default_cam_layer, load_model, probe

        loaded = load_model(model, weights, input_size=input_size)
        calls = probe(loaded)
        default = default_cam_layer(loaded.model, calls)
        params = {
            n: sum(p.numel() for p in m.parameters(recurse=False)) for n, m in loaded.model.named_modules()
        }
        width = max(len(c.name) for c in calls)
        typer.echo(f"{'name':<{width}}  {'type':<22} {'output shape':<22} {'params':>10}")
        for c in calls:
            if depth is not None and c.name.count(".") + 1 > depth:
                continue
            shape = "x".join(map(str, c.output_shape)) if c.output_shape else "-"
            calls_note = f" (runs {c.calls}x)" if c.calls > 1 else " (not run)" if c.calls == 0 else ""
            mark = "  <- default Grad-CAM layer" if c.name == default else ""
            typer.echo(
                f"{c.name:<{width}}  {c.type:<22} {shape:<22} {params.get(c.name, 0):>10,}{calls_note}{mark}"
            )


@app.command()
def gradflow(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    target: Annotated[
        str,
        typer.Option("--target", "-t", help="top1 or a class (index or name) whose score is differentiated."),
    ] = "top1",
    label: Annotated[
        str | None,
        typer.Option("--label", help="use cross-entropy against this class (index or name) instead."),
    ] = None,
    layers: Annotated[
        list[str] | None,
        typer.Option("--layers", "-l", help="names or globs (default: every module with parameters)."),
    ] = None,
    out: Out = Path("out"),
    device: Device = "auto",
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    input_size: InputSize = None,
    resize: Resize = "crop",
    max_pixels: MaxPixels = 80_000_000,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """Gradient norms per layer, in network order (log scale), from one backward per image; PNG + JSON."""
    with _guard(debug):

        def make(loaded: Any) -> Any:
            from hookviz.hooks import resolve_layers
            from hookviz.jobs import GradFlowJob
            from hookviz.models import parse_target

            n = _num_classes(loaded)
            names = resolve_layers(loaded.model, layers, model_name=loaded.name) if layers else None
            lab = parse_target(label, loaded, n, "--label") if label is not None else None
            if label is not None and lab is None:
                raise typer.BadParameter("give a class index or name", param_hint="--label")
            return GradFlowJob(loaded, parse_target(target, loaded, n), lab, names)

        _run_job(make, locals())


@app.command()
def dropblock(
    inputs: Inputs,
    model: Model = "resnet18",
    weights: Weights = "DEFAULT",
    layer: Annotated[
        str, typer.Option("--layer", "-l", help="module whose output gets DropBlock.")
    ] = "layer3",
    drop_prob: Annotated[
        float, typer.Option("--drop-prob", min=0.0, max=0.99, help="expected dropped fraction.")
    ] = 0.1,
    block_size: Annotated[int, typer.Option("--block-size", min=1, help="side of the dropped squares.")] = 7,
    shared: Annotated[bool, typer.Option("--shared", help="one mask for all channels.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of the mask.")] = 0,
    max_channels: Annotated[int, typer.Option("--max-channels", min=1, help="channels shown.")] = 16,
    out: Out = Path("out"),
    device: Device = "auto",
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    input_size: InputSize = None,
    resize: Resize = "crop",
    max_pixels: MaxPixels = 80_000_000,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """What DropBlock does to a layer: its feature maps before, the keep mask, and after (one PNG)."""
    with _guard(debug):

        def make(loaded: Any) -> Any:
            from hookviz.hooks import resolve_layers
            from hookviz.jobs import DropBlockJob
            from hookviz.models import probe

            (name,) = resolve_layers(loaded.model, [layer], model_name=loaded.name)
            calls = probe(loaded)
            _check_spatial_any(name, next(c for c in calls if c.name == name), loaded.name)
            return DropBlockJob(loaded, name, drop_prob, block_size, shared, seed, max_channels)

        _run_job(make, locals())


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
    if len(parts) != 3 or min(parts) < 1:
        raise typer.BadParameter(
            f"{text!r}: give C,H,W (3,224,224), H,W or one side", param_hint="--input-size"
        )
    return parts


@app.command()
def summary(
    model: Model = "resnet18",
    weights: Annotated[
        str,
        typer.Option("--weights", "-w", help="none (default: counts need no weights), DEFAULT, or a path."),
    ] = "none",
    input_size: Annotated[str, typer.Option("--input-size", help="C,H,W of one input.")] = "3,224,224",
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", min=1, help="inputs per forward pass.")
    ] = 1,
    depth: Annotated[int, typer.Option("--depth", min=0, help="module nesting shown (0 = totals only).")] = 2,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, json or csv.")] = "table",
    plot: Annotated[
        Path | None, typer.Option("--plot", help="also write a bar chart of params and MACs (PNG).")
    ] = None,
    overwrite: Overwrite = False,
    debug: Debug = False,
) -> None:
    """Shapes, parameters and MACs per module, totals, memory; attention and functional ops included."""
    _check_choice("--format", fmt, ("table", "markdown", "json", "csv"))
    size = _parse_size(input_size)
    if plot is not None and plot.exists() and not overwrite:
        _fail(f"--plot {plot}: the file exists; pass --overwrite to replace it", EXIT_USAGE)
    with _guard(debug):
        from hookviz.models import load_model
        from hookviz.summary import plot as draw
        from hookviz.summary import summarize

        loaded = load_model(model, weights)
        result = summarize(loaded.model, size, batch_size=batch_size, depth=depth, name=model)
        formats = {"markdown": result.to_markdown, "json": result.to_json, "csv": result.to_csv}
        text = str(result) if fmt == "table" else formats[fmt]()
        typer.echo(text.rstrip("\n"))
        if plot is not None:
            tmp = plot.with_name(f".{plot.stem}.tmp.png")
            try:
                draw(result, str(tmp))
                tmp.replace(plot)
            finally:
                tmp.unlink(missing_ok=True)
            typer.echo(f"hookviz: wrote {plot}", err=True)


@app.command()
def models() -> None:
    """List torchvision's classification models."""
    from hookviz.models import list_models

    for name in list_models():
        typer.echo(name)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
