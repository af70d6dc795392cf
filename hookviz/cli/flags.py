# ruff: noqa: RUF001
"""Every shared option of the command line, declared once (its names, help, panel and type), and the parsers
of the ones that take a structured value. The option groups (:mod:`hookviz.cli.options`) and the commands
with options of their own take them from here; nothing here imports torch, so ``--help`` stays instant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.core.memory import parse_size
from hookviz.options import Colormap, Fuse, Normalize, Region, Resize

# Help panels: options grouped by what they are about.
MODEL, MAPS, OUTPUT, RUN = "Model", "Maps", "Output", "Run"
DENSE = "Segmentation and detection"
TARGETS = "Prompts and similarity"
VIDEO = "Video"
SETTINGS = "Method settings"

# Options shared by several commands.
Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="torchvision name (hookviz models), timm:NAME, hf:DIR, ultralytics:FILE.pt, file.py:FN, "
        "pkg.mod:FN, or FILE.pt.",
        rich_help_panel=MODEL,
    ),
]
Weights = Annotated[
    str,
    typer.Option(
        "--weights",
        "-w",
        help="DEFAULT (pretrained, downloaded once into the torch hub cache), a weights name "
        "(IMAGENET1K_V2), none (random init), or the path of a state_dict/checkpoint.",
        rich_help_panel=MODEL,
    ),
]
WeightsKey = Annotated[
    str | None,
    typer.Option(
        "--weights-key",
        help="the key of the state_dict inside a checkpoint dict (ema, model_ema; a.b for nested).",
        rich_help_panel=MODEL,
    ),
]
Labels = Annotated[
    Path | None,
    typer.Option(
        "--labels",
        help="class names for the head: one per line, or a JSON list (fine-tuned models).",
        rich_help_panel=MODEL,
    ),
]
_HEAD = (
    "softmax (one class), sigmoid (multi-label), raw (regression), probabilities (the model ends in a "
    "softmax); auto: the model's own (problem_type, probabilities when its rows sum to 1)"
)
HeadOpt = Annotated[str, typer.Option("--head", help=_HEAD, rich_help_panel=MODEL)]
OutputOpt = Annotated[
    str | None,
    typer.Option(
        "--output",
        help="a model returning several tensors: which one holds the class scores (N: a tuple's index, "
        "NAME: a dict's key; default the first, a dict's logits).",
        rich_help_panel=MODEL,
    ),
]
Negate = Annotated[
    bool, typer.Option("--negate", help="regression: explain what lowers it.", rich_help_panel=MODEL)
]
Device = Annotated[
    str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda or cuda:N.", rich_help_panel=RUN)
]
Out = Annotated[
    Path,
    typer.Option(
        "--out", "-o", help="output folder; manifest.jsonl is appended there.", rich_help_panel=OUTPUT
    ),
]
BatchSize = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, help="images per forward pass.", rich_help_panel=RUN)
]
Workers = Annotated[
    int,
    typer.Option(
        "--workers", min=1, help="threads decoding, rendering and writing images.", rich_help_panel=RUN
    ),
]
Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="recompute and replace existing outputs.", rich_help_panel=OUTPUT)
]
SkipExisting = Annotated[
    bool,
    typer.Option(
        "--skip-existing",
        help="also complete inputs whose outputs exist only in part (a killed run).",
        rich_help_panel=OUTPUT,
    ),
]
Quiet = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="no progress bar and no per-input lines.", rich_help_panel=OUTPUT),
]
JsonOut = Annotated[
    bool,
    typer.Option(
        "--json", help="print the manifest records, and nothing else, on stdout.", rich_help_panel=OUTPUT
    ),
]
Debug = Annotated[bool, typer.Option("--debug", help="show tracebacks.", rich_help_panel=RUN)]


ResizeOpt = Annotated[
    Resize | None,
    typer.Option(
        "--resize",
        help="crop: centre crop, torchvision's eval transform (the map covers the part the model saw); "
        "squash: whole image resized to a square; shorter: shorter side to --input-size, aspect kept "
        "(segmentation); fit: both sides by the one scale nearer 1 (DPT's keep_aspect_ratio); model: the "
        "photo as it is (detectors resize it). Default: the model's own.",
        rich_help_panel=MODEL,
    ),
]


def numbers_per_channel(text: str | None, option: str) -> Any:
    """Numbers per channel: three (R,G,B) for a photo model, one per band for another (checked on load); or,
    for a model of several inputs, ``NAME=values`` per input (``depth=0.5 rgb=0.485,0.456,0.406``)."""
    if text is None:
        return None
    if "=" in text:
        pairs = []
        for part in text.replace(";", " ").split():
            name, _, numbers = part.partition("=")
            pairs.append((name.strip(), numbers_per_channel(numbers, option)))
        return tuple(pairs)
    try:
        values = [float(v) for v in text.replace(" ", ",").split(",") if v]
    except ValueError:
        values = []
    if not values or (option == "--std" and min(values) <= 0):
        raise typer.BadParameter(
            f"{text!r}: give a number per channel, R,G,B for a photo (0.485,0.456,0.406)", param_hint=option
        )
    return tuple(values)


def _per_channel(option: str, what: str) -> Any:
    """``--mean`` or ``--std``: held as the parsed numbers once read (a tuple, or pairs of a name and one)."""
    help = f"input normalisation {what} R,G,B (default: the model's)."
    parse = lambda value: numbers_per_channel(value, option)  # noqa: E731
    return Annotated[str | None, typer.Option(option, help=help, rich_help_panel=MODEL, callback=parse)]


MeanOpt = _per_channel("--mean", "mean")
StdOpt = _per_channel("--std", "std")
TrustPickle = Annotated[
    bool,
    typer.Option(
        "--trust-pickle",
        help="allow --model FILE.pt holding a whole pickled model (unpickling runs code from the file).",
        rich_help_panel=MODEL,
    ),
]
MaxPixels = Annotated[
    int,
    typer.Option(
        "--max-pixels", min=1, help="refuse images larger than this many pixels.", rich_help_panel=RUN
    ),
]


def memory_size(text: str | None) -> int | None:
    """``--max-memory`` in bytes (None: the default budget)."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-memory") from None


# --max-memory holds the bytes once read (None: the default budget).
MaxMemory = Annotated[str | None, typer.Option("--max-memory", rich_help_panel=RUN, callback=memory_size,
    help="memory a batch may hold (4G, 512M): a batch estimated over it runs in smaller parts. Default: half "
    "the memory available at the start (the GPU's free memory on CUDA).")]  # fmt: skip


ReportOpt = Annotated[
    bool,
    typer.Option(
        "--report", help="write OUT/index.html to browse the run (hookviz report).", rich_help_panel=OUTPUT
    ),
]
Null = Annotated[
    bool,
    typer.Option("--null", "-0", help="stdin paths are NUL-separated (find -print0).", rich_help_panel=RUN),
]

Methods = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        help="method, all (every cheap one: at most a forward and two backward passes per target) or a "
        "family: gradient, activation, cams, perturbation, pixel, control, attention (transformers); "
        "repeatable or comma-separated (default gradcam). docs/methods.md gives each one's cost.",
        rich_help_panel=MAPS,
    ),
]


def _option(kind: Any, *names: str, help: str, panel: str = SETTINGS, **limits: Any) -> Any:
    """An option in one declaration (the ``Method settings`` panel unless ``panel`` says another)."""
    return Annotated[kind, typer.Option(*names, help=help, rich_help_panel=panel, **limits)]


InputsTable = _option(str | None, "--inputs-table", panel=RUN, help="a table of inputs (.parquet, .csv, "
    ".jsonl; a file or a URL): one per row of its path column (path, url, image, ...); relative paths from "
    "the table's folder.")  # fmt: skip
InputsColumn = _option(str | None, "--inputs-column", panel=RUN, help="the --inputs-table column holding "
    "each input's path or URL (default: the first of path, url, uri, image, file, filename).")  # fmt: skip
RecordsOpt = _option(str | None, "--records", panel=OUTPUT, help="also write the records as a Parquet table, "
    "a row per input, target, method and layer: parquet (OUT/records.parquet) or a folder or URL ending in "
    ".parquet.")  # fmt: skip
NoPictures = _option(bool, "--no-pictures", panel=OUTPUT, help="write no PNG pictures: the raw maps "
    "(--save-raw, --maps zarr) and the records only.")  # fmt: skip
LogOpt = _option(str | None, "--log", "--tracker", panel=OUTPUT, help="also log the run to an experiment "
    "tracker: mlflow[:TRACKING_URI] or wandb[:PROJECT] (the overlays, the raw maps, a table of the records, "
    "the settings as parameters); the files under --out are written whatever the tracker does. Under "
    "torchrun, spell it --tracker (torchrun reads --log as its own).")  # fmt: skip
MapsStore = _option(str | None, "--maps", panel=OUTPUT, help="raw maps into one Zarr store (float16, an "
    "array per input, method and layer, the crop box as an attribute) instead of .npy files: zarr "
    "(OUT/maps.zarr) or a path or URL ending in .zarr.")  # fmt: skip


Seed = _option(int, "--seed", help="random stream of the stochastic methods (recorded).")
Samples = _option(int | None, "--samples", min=1, help="noisy copies or steps: SmoothGrad 25, SS-CAM 35, "
    "IS-CAM 10, Smooth Grad-CAM++ 4.")  # fmt: skip
Noise = _option(float | None, "--noise", min=0.0, help="noise σ: SmoothGrad's as a share of the image's "
    "range (0.15); SS-CAM's (2) and Smooth Grad-CAM++'s (0.3) in input units.")  # fmt: skip
IgSteps = _option(int, "--ig-steps", min=1, help="Integrated Gradients' integration points.")
Baseline = _option(str, "--baseline", help="what removed pixels become (Integrated Gradients, Occlusion): "
    "black, mean (the data mean) or blur.")  # fmt: skip
Window = _option(int, "--window", min=1, help="Occlusion's square, in input pixels.")
Stride = _option(int, "--stride", min=1, help="Occlusion's step, in input pixels.")
Masks = _option(int, "--rise-masks", "--masks", min=1, help="RISE's random masks (--masks: the old "
    "spelling).")  # fmt: skip
Cells = _option(int, "--cells", min=1, help="RISE's grid: cells per side.")
Compare = _option(str | None, "--compare", help="Finer-CAM: classes to tell the target from (comma list of "
    "indices or names; default the 3 with the nearest logits).")  # fmt: skip
HeadFusion = _option(str, "--head-fusion", help="attention rollout: how a block's heads are fused (mean, "
    "max or min).")  # fmt: skip
DiscardRatio = _option(float, "--discard-ratio", min=0.0, max=0.99, help="attention rollout: the share of "
    "each fused attention matrix's lowest values set to 0.")  # fmt: skip
MaskedBatch = _option(int, "--masked-batch", "--scorecam-batch", min=1, panel=RUN, help="changed inputs "
    "per forward pass of the perturbation methods.")  # fmt: skip


Prompt = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt", help="an image-text model (CLIP, SigLIP: --model hf:DIR): explain its similarity to this "
        "sentence; repeatable (top1, topK and --target choose among the prompts).", rich_help_panel=TARGETS,
    ),
]  # fmt: skip
PromptsFile = Annotated[
    Path | None,
    typer.Option("--prompts", help="a text file of prompts, one per line.", rich_help_panel=TARGETS),
]
SimilarTo = Annotated[
    Path | None,
    typer.Option(
        "--similar-to", help="explain each photo's cosine similarity to this photo: the parts that make it "
        "look like it (the embedding: the head's input, an image-text model's image embedding, or "
        "--embedding).", rich_help_panel=TARGETS,
    ),
]  # fmt: skip
Embedding = Annotated[
    str | None,
    typer.Option(
        "--embedding", help="--similar-to: the layer whose output is the embedding (averaged over positions "
        "or tokens).", rich_help_panel=TARGETS,
    ),
]  # fmt: skip


Inputs = Annotated[
    list[str],
    typer.Argument(help="image files, folders (searched recursively), globs, or - to read paths from stdin."),
]


MaybeInputs = Annotated[
    list[str] | None,
    typer.Argument(
        help="image files, folders (searched recursively), globs, or - to read paths from stdin (none with "
        "--input).",
        show_default=False,
    ),
]
InputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        metavar="NAME=PATH",
        help="one input of a model that takes several (RGB + depth, two views), repeated, in the model's "
        "order (by name when its forward() names them): folders paired by file path or stem, or a file each.",
        rich_help_panel=MODEL,
    ),
]

TaskOpt = Annotated[
    str | None,
    typer.Option(
        "--task",
        help="what the model's output is, where the model and inputs do not tell: volume or video for a 3-D "
        "CNN (default: volume when every input is a volume), or a registered task.",
        rich_help_panel=MODEL,
    ),
]


def _input_size(value: str | None) -> int | tuple[int, ...] | None:
    """``--input-size``: one side (a square photo), or ``D,H,W`` (a volume's three sides)."""
    if value is None:
        return None
    try:
        sides = tuple(int(v) for v in str(value).replace("x", ",").split(",") if v.strip())
    except ValueError:
        sides = ()
    if len(sides) not in (1, 3) or min(sides) < 1:
        raise typer.BadParameter(f"{value!r}: give one side (224), or D,H,W for a volume (96,96,64)")
    return sides[0] if len(sides) == 1 else sides


InputSize = Annotated[
    str | None,
    typer.Option(
        "--input-size",
        callback=_input_size,
        help="model input side (default: the weights'); D,H,W for a volume model (default: each volume's "
        "own).",
        rich_help_panel=MODEL,
    ),
]

ClipLen = _option(int | None, "--clip-len", min=1, panel=VIDEO,
    help="video: frames per clip (default: the weights', 16 for r3d_18).")  # fmt: skip
FrameStride = _option(int | None, "--frame-stride", min=1, panel=VIDEO,
    help="video: take every Nth frame (default: resample to the weights' frame rate, 15 fps for "
    "most).")  # fmt: skip
ClipsOpt = _option(str | None, "--clips", metavar="N|all", panel=VIDEO,
    help="video: N evenly spaced clips per video, or all of them back to back (default: the "
    "weights').")  # fmt: skip


def top_channels(text: str | None) -> int:
    """``--channels topK`` -> K (0 without it)."""
    if text is None:
        return 0
    k = text.strip().lower().removeprefix("top")
    if not k.isdigit() or int(k) < 1:
        raise typer.BadParameter(f"{text!r}: give topK, like top4", param_hint="--channels")
    return int(k)


# gradcam's maps and their look.
NormalizeOpt = _option(Normalize, "--normalize", panel=MAPS, help="image: each map min-max; batch: one "
    "scale per batch (the whole --batch-size, run in parts under --max-memory too); none: the fixed scale "
    "0..--vmax.")  # fmt: skip
Vmax = _option(float | None, "--vmax", panel=MAPS, help="with --normalize none: the map value drawn as full "
    "colour.")  # fmt: skip
FuseOpt = _option(Fuse | None, "--fuse", panel=MAPS, help="also fuse the maps of all layers.")
SheetOpt = _option(bool | None, "--sheet/--no-sheet", panel=OUTPUT, help="comparison sheet (default: when "
    ">1 map).")  # fmt: skip
Probe = _option(int, "--probe", min=1, panel=MAPS, help="with --layer auto: images of the first batch that "
    "choose the layer.")  # fmt: skip
EigenSmooth = _option(bool, "--eigen-smooth", panel=MAPS, help="gradient methods: first principal component "
    "of the weighted activations.")  # fmt: skip
AugSmooth = _option(bool, "--aug-smooth", panel=MAPS, help="average over flips and brightness 0.9/1.0/1.1 "
    "(6 passes).")  # fmt: skip
MetricsOpt = _option(bool, "--metrics", panel=MAPS, help="deletion and insertion AUC of every map (record, "
    "caption, sheet).")  # fmt: skip
TopChannels = _option(str | None, "--channels", callback=top_channels, panel=MAPS, help="topK: also the "
    "first target's Grad-CAM through each of the K channels adding most to it.")  # fmt: skip
RegionOpt = _option(Region, "--region", panel=DENSE, help="segmentation: explain the class's score over its "
    "predicted pixels, or over all pixels.")  # fmt: skip
ScoreThreshold = _option(float, "--score-threshold", min=0.0, max=1.0, panel=DENSE, help="detection: "
    "explain the boxes scoring at least this.")  # fmt: skip
Threshold = _option(float, "--threshold", min=0.0, max=1.0, panel=MAPS, help="--target positive: explain "
    "every label whose sigmoid reaches this (a multi-label head).")  # fmt: skip
MaxBoxes = _option(int, "--max-boxes", min=1, panel=DENSE, help="detection: at most this many boxes, best "
    "first.")  # fmt: skip
Alpha = _option(float, "--alpha", min=0.0, max=1.0, panel=MAPS, help="heatmap opacity.")
ColormapOpt = _option(Colormap, "--colormap", panel=MAPS, help="heatmap colours.")
NoRelu = _option(bool, "--no-relu", panel=MAPS, help="signed maps: negative evidence in blue.")
SaveRaw = _option(bool, "--save-raw", panel=OUTPUT, help="also write raw maps as .npy (feature and photo "
    "resolution).")  # fmt: skip

#: What ``--layer`` is, in every command (``vlm``'s aside): a module name or a glob over the names.
LAYER_IS = "module name or glob (layer4, layer*.0.conv2; hookviz layers lists them)"


def layers_option(default: str, more: str = "", *names: str) -> Any:
    """``--layer`` for a command taking several layers: repeatable, ``default`` when left out; ``names``:
    its other spellings (``--layers``)."""
    return _option(list[str] | None, "--layer", *names, "-l", panel=MAPS,
                   help=f"{LAYER_IS}; repeatable{more}. Default: {default}.")  # fmt: skip


def layer_option(default: str, kind: Any = str | None, lead: str = "one layer") -> Any:
    """``--layer`` for a command taking exactly one layer (a glob must match one), ``default`` when left
    out; ``lead``: what the layer is for."""
    tail = f" Default: {default}." if default else ""
    return _option(kind, "--layer", "-l", panel=MAPS, help=f"{lead}: a module name, or a glob matching one "
                   f"(hookviz layers lists them).{tail}")  # fmt: skip


# ``--layer`` of each command (one meaning, each command's default).
CamLayers = layers_option("the last convolutional stage", "; auto: the most faithful of the candidate layers "
    "on the first images (--probe)")  # fmt: skip
CamDefaultLayers = layers_option("the CAM default")
CamDefaultLayer = layer_option("the CAM default")
FeatureLayers = layers_option("every Conv2d that runs", "", "--layers")
ConceptLayers = layers_option("the CAM layer", "", "--layers")
FlowLayers = layers_option("every module with parameters", "", "--layers")
BlockLayer = layer_option("the default CAM layer", lead="the layer whose output gets DropBlock")
VisualLayer = layer_option("", str)
