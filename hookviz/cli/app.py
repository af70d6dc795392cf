# ruff: noqa: RUF001
"""The ``hookviz`` Typer app: exit codes, the option types every command shares, and the guards that turn
errors into one line and an exit code. Commands live in one module per family (explain, inspect, trust,
training, report); the runner that feeds inputs to a job is :mod:`hookviz.cli.runner`.

Exit codes: 0 all inputs done; 1 one or more inputs failed (the others were done); 2 bad command line
or option value; 3 the run could not start (weights, output folder); 70 an internal error; 130
interrupted (Ctrl-C); 141 stdout closed by its reader. Under torchrun, rank 0 exits with the worst code.
Heavy modules (torch, cv2, matplotlib) are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from hookviz import __version__, methods
from hookviz.core.memory import parse_size
from hookviz.errors import HookvizError
from hookviz.methods import MethodOptions
from hookviz.options import Resize

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
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE: a bug in hookviz, not in the inputs or the options
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away

# Help panels: options grouped by what they are about.
MODEL, MAPS, OUTPUT, RUN = "Model", "Maps", "Output", "Run"
DENSE = "Segmentation and detection"
TARGETS = "Prompts and similarity"
VIDEO = "Video"

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
_HEAD = "softmax (one class), sigmoid (multi-label), raw (regression); auto: the model's own (problem_type)"
HeadOpt = Annotated[str, typer.Option("--head", help=_HEAD, rich_help_panel=MODEL)]
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
MeanOpt = Annotated[
    str | None,
    typer.Option(
        "--mean", help="input normalisation mean R,G,B (default: the model's).", rich_help_panel=MODEL
    ),
]
StdOpt = Annotated[
    str | None,
    typer.Option(
        "--std", help="input normalisation std R,G,B (default: the model's).", rich_help_panel=MODEL
    ),
]
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
MaxMemory = Annotated[str | None, typer.Option("--max-memory", rich_help_panel=RUN, help="memory a batch may "
    "hold (4G, 512M): a batch estimated over it runs in smaller parts. Default: half the memory available at "
    "the start (the GPU's free memory on CUDA).")]  # fmt: skip


def memory_size(text: str | None) -> int | None:
    """``--max-memory`` in bytes (None: the default budget)."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-memory") from None


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


def _method_names() -> list[str]:

    return [*methods.names(), methods.ALL, *methods.SELECTORS]


def _check_methods(ctx: Any, param: Any, value: Any) -> Any:
    """``--method`` values against the registry, when the command runs (a method registered by the user's
    code is a choice like the built-in ones); a comma list counts as several."""
    chosen = [part.strip().lower() for v in value or () for part in str(v).split(",") if part.strip()]
    for v in chosen:
        if v not in _method_names():
            raise typer.BadParameter(f"{v!r} is not one of {', '.join(_method_names())}", ctx, param)
    return chosen or value


class MethodCommand(TyperCommand):
    """A command whose ``--method`` takes the registry's methods: checked, and listed in its help, when it
    runs rather than when hookviz is imported."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name == "methods":
                param.callback = _check_methods
                param.display_type = lambda ctx: f"<{'|'.join(_method_names())}>"  # type: ignore[attr-defined]


Methods = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        help="method, all (every cheap one: at most a forward and two backward passes per target) or a "
        "family: gradient, activation, cams, perturbation, pixel, control, attention (transformers); "
        "repeatable or comma-separated (default gradcam). The README's table gives each one's cost.",
        rich_help_panel=MAPS,
    ),
]
SETTINGS = "Method settings"
Seed = Annotated[
    int,
    typer.Option(
        "--seed", help="random stream of the stochastic methods (recorded).", rich_help_panel=SETTINGS
    ),
]
Samples = Annotated[
    int | None,
    typer.Option(
        "--samples", min=1, help="noisy copies or steps: SmoothGrad 25, SS-CAM 35, IS-CAM 10, Smooth "
        "Grad-CAM++ 4.", rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
Noise = Annotated[
    float | None,
    typer.Option(
        "--noise", min=0.0, help="noise σ: SmoothGrad's as a share of the image's range (0.15); SS-CAM's "
        "(2) and Smooth Grad-CAM++'s (0.3) in input units.", rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
IgSteps = Annotated[
    int,
    typer.Option(
        "--ig-steps", min=1, help="Integrated Gradients' integration points.", rich_help_panel=SETTINGS
    ),
]
Baseline = Annotated[
    str,
    typer.Option(
        "--baseline", help="what removed pixels become (Integrated Gradients, Occlusion): black, mean (the "
        "data mean) or blur.", rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
Window = Annotated[
    int,
    typer.Option("--window", min=1, help="Occlusion's square, in input pixels.", rich_help_panel=SETTINGS),
]
Stride = Annotated[
    int, typer.Option("--stride", min=1, help="Occlusion's step, in input pixels.", rich_help_panel=SETTINGS)
]
Masks = Annotated[int, typer.Option("--rise-masks", "--masks", min=1, rich_help_panel=SETTINGS,
                                    help="RISE's random masks (--masks: the old spelling).")]  # fmt: skip
Cells = Annotated[
    int, typer.Option("--cells", min=1, help="RISE's grid: cells per side.", rich_help_panel=SETTINGS)
]
Compare = Annotated[
    str | None,
    typer.Option(
        "--compare", help="Finer-CAM: classes to tell the target from (comma list of indices or names; "
        "default the 3 with the nearest logits).", rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
HeadFusion = Annotated[
    str,
    typer.Option(
        "--head-fusion", help="attention rollout: how a block's heads are fused (mean, max or min).",
        rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
DiscardRatio = Annotated[
    float,
    typer.Option(
        "--discard-ratio", min=0.0, max=0.99, help="attention rollout: the share of each fused attention "
        "matrix's lowest values set to 0.", rich_help_panel=SETTINGS,
    ),
]  # fmt: skip
MaskedBatch = Annotated[
    int,
    typer.Option(
        "--masked-batch", "--scorecam-batch", min=1,
        help="changed inputs per forward pass of the perturbation methods.", rich_help_panel=RUN,
    ),
]  # fmt: skip


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


def _method_options(
    seed: int,
    samples: int | None,
    noise: float | None,
    steps: int,
    baseline: str,
    window: int,
    stride: int,
    masks: int,
    cells: int,
    batch: int = 64,
    *,
    head_fusion: str = "mean",
    discard: float = 0.0,
) -> Any:
    """The method settings as given on the command line (checked: a bad one is a usage error)."""

    return MethodOptions(
        seed=seed, samples=samples, noise=noise, steps=steps, baseline=baseline.strip().lower(),
        window=window, stride=stride, masks=masks, cells=cells, batch=batch,
        head_fusion=head_fusion.strip().lower(), discard=discard,
    )  # fmt: skip


Inputs = Annotated[
    list[str],
    typer.Argument(help="image files, folders (searched recursively), globs, or - to read paths from stdin."),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hookviz {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="print the version and exit."),
    ] = False,
) -> None:
    """Look inside convolutional networks with PyTorch hooks: feature maps, Grad-CAM, layers."""


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"hookviz: error: {message}", err=True)
    raise typer.Exit(code)


#: Warnings from dependencies that say nothing a hookviz user can act on.
_HARMLESS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """No raw Python warning reaches a user: harmless ones are silenced, others become one stderr line."""
    shown: set[str] = set()

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        text = (str(message).strip().splitlines() or [category.__name__])[0]
        if text not in shown:
            shown.add(text)
            sys.stderr.write(f"hookviz: warning: {text}\n")

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        for category in _HARMLESS:
            warnings.simplefilter("ignore", category)
        warnings.showwarning = show
        yield


@contextmanager
def _guard(debug: bool) -> Iterator[None]:
    """Map hookviz errors and Ctrl-C to one stderr line and an exit code; warnings to lines."""
    try:
        with _warnings_as_lines():
            yield
    except KeyboardInterrupt:
        typer.echo("hookviz: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        # The reader of stdout went away (`hookviz ... | head`): stop quietly, as Unix tools do; stdout
        # now goes nowhere, so that Python's flush at exit does not complain about the pipe again.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
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
        _fail(
            f"internal error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)",
            EXIT_INTERNAL,
        )


@contextmanager
def _stdout_reserved() -> Iterator[IO[str]]:
    """Yield the real stdout for results; while open, anything else printed to stdout goes to stderr.

    Dependencies print (torch.hub's ``Downloading: ...``, C extensions writing to fd 1); with
    ``--json`` a script reads stdout as JSON lines, so stdout is kept for hookviz's records alone:
    ``sys.stdout`` and, where there is one, file descriptor 1 point at stderr during the run.
    """
    real = sys.stdout
    real.flush()
    try:
        fd: int | None = real.fileno()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's capture)
        fd = None
    saved = None
    stream: IO[str] = real
    if fd is not None:
        saved = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
        stream = os.fdopen(saved, "w", encoding=getattr(real, "encoding", None) or "utf-8", closefd=False)
    sys.stdout = sys.stderr
    try:
        yield stream
    finally:
        try:
            stream.flush()  # may raise BrokenPipeError: restore stdout all the same
        finally:
            sys.stdout = real
            if saved is not None and fd is not None:
                os.dup2(saved, fd)
                os.close(saved)


def main() -> None:
    """Console-script entry point."""
    app()
