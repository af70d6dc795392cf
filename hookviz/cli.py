"""The ``hookviz`` command: parses options, calls the library, prints, and maps errors to exit codes.

Exit codes: 0 all inputs done; 1 one or more inputs failed (the others were done); 2 bad command line
or option value; 3 the run could not start (weights, output folder); 70 an internal error; 130
interrupted (Ctrl-C); 141 stdout closed by its reader. Under torchrun, rank 0 exits with the worst code.
Heavy modules (torch, cv2, matplotlib) are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from hookviz import __version__
from hookviz.errors import HookvizError
from hookviz.options import Colormap, Fuse, Normalize, Region, Resize, Stage, SummaryFormat, Task

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

# Options shared by several commands.
Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="torchvision name (hookviz models), timm:NAME, hf:DIR, file.py:FN, pkg.mod:FN, or FILE.pt.",
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
InputSize = Annotated[
    int | None,
    typer.Option(
        "--input-size", min=1, help="square model input side (default: the weights').", rich_help_panel=MODEL
    ),
]
ResizeOpt = Annotated[
    Resize | None,
    typer.Option(
        "--resize",
        help="crop: centre crop, torchvision's eval transform (the map covers the part the model saw); "
        "squash: whole image resized to a square; shorter: shorter side to --input-size, aspect kept "
        "(segmentation); model: the photo as it is (detectors resize it). Default: the model's own.",
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
    from hookviz import methods

    return [*methods.names(), methods.ALL]


def _check_methods(ctx: Any, param: Any, value: Any) -> Any:
    """``--method`` values against the registry, when the command runs (a method registered by the user's
    code is a choice like the built-in ones)."""
    for v in value or ():
        if str(v).strip().lower() not in _method_names():
            raise typer.BadParameter(f"{v!r} is not one of {', '.join(_method_names())}", ctx, param)
    return [str(v).strip().lower() for v in value] if value else value


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
        help="method, or all (every cheap one); repeatable (default gradcam).",
        rich_help_panel=MAPS,
    ),
]
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


@dataclass(frozen=True)
class ModelOptions:
    """How to get the model: the options every per-image command shares."""

    model: str
    weights: str
    device: str = "auto"
    input_size: int | None = None
    resize: str | None = None
    labels: Path | None = None
    weights_key: str | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    trust_pickle: bool = False


def _rgb(text: str | None, option: str) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.replace(" ", ",").split(",") if v]
    except ValueError:
        values = []
    if len(values) != 3 or (option == "--std" and min(values) <= 0):
        raise typer.BadParameter(f"{text!r}: give three numbers R,G,B (0.485,0.456,0.406)", param_hint=option)
    return (values[0], values[1], values[2])


@dataclass(frozen=True)
class RunOptions:
    """How to run over the inputs and where results go."""

    inputs: list[str]
    out: Path
    batch_size: int = 8
    workers: int = 2
    overwrite: bool = False
    skip_existing: bool = False
    max_pixels: int = 80_000_000
    null: bool = False
    quiet: bool = False
    as_json: bool = False
    debug: bool = False
    report: bool = False


def _load(m: ModelOptions, quiet: bool) -> Any:
    from hookviz.models import load_model, resolve_device

    return load_model(
        m.model,
        m.weights,
        device=resolve_device(m.device),
        input_size=m.input_size,
        resize=str(m.resize) if m.resize is not None else None,
        mean=m.mean,
        std=m.std,
        progress=not quiet and sys.stderr.isatty(),
        labels=m.labels,
        weights_key=m.weights_key,
        trust_pickle=m.trust_pickle,
    )


class _Reporter:
    """Progress on stderr (a bar on a terminal), result lines on ``out``; counts ok and failed inputs.

    Lines bound for the same terminal as the bar are printed through the bar's console, so they scroll
    above it instead of tearing it.
    """

    def __init__(self, out: IO[str], quiet: bool, as_json: bool) -> None:
        self.out, self.quiet, self.as_json = out, quiet, as_json
        self.ok = self.failed = 0
        self.bar: Any = None
        self._inner: Any = None
        #: Under torchrun, rank 0's bar counts every rank's inputs (``count_from()`` adds them up).
        self.count_from: Callable[[], int] | None = None
        #: ``first_images(n)``: the first ``n`` readable inputs, preprocessed, as one batch (or None).
        self.first_images: Callable[[int], Any] = lambda n: None
        #: Whether this process speaks for the run (rank 0 under torchrun, or the only process).
        self.lead = True
        #: ``agree(value)``: rank 0's value on every rank under torchrun (a choice made from data).
        self.agree: Callable[[Any], Any] = lambda value: value

    def start(self, total: int) -> None:
        """Show the bar (on a terminal, unless quiet) for ``total`` inputs."""
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(transient=True, console=Console(stderr=True), redirect_stdout=False)
            self.bar.start()
            self._task = self.bar.add_task("images", total=total)

    def inner(self, label: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for slow work inside one batch (Score-CAM's passes)."""

        def update(done: int, total: int) -> None:
            if self.bar is None:
                return
            if self._inner is None:
                self._inner = self.bar.add_task(label, total=total)
            self.bar.update(self._inner, completed=done, total=total)

        return update

    def say(self, text: str, err: bool = False) -> None:
        to_terminal = err or (hasattr(self.out, "isatty") and self.out.isatty())
        if self.bar is not None and to_terminal:
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif err:
            typer.echo(text, err=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def add(self, rec: dict[str, Any]) -> None:
        if rec["status"] == "error":
            self.failed += 1
            self.say(f"hookviz: {rec['error']}", err=True)
        else:
            self.ok += 1
        if self.as_json:
            from hookviz.pipeline import to_json

            self.say(to_json(rec))
        elif not self.quiet and rec["status"] != "error":
            self.say(_describe(rec))
        if self.bar is not None:
            if self.count_from is not None:
                self.bar.update(self._task, completed=max(self.ok + self.failed, self.count_from()))
            else:
                self.bar.advance(self._task)
            if self._inner is not None:
                self.bar.remove_task(self._inner)
                self._inner = None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _warn(text: str) -> None:
    typer.echo(f"hookviz: warning: {text}", err=True)


def _named(d: dict[str, Any]) -> str:
    """``tabby (281)``, or ``class 281`` for a class without a name (not ``class 281 (281)``)."""
    name, index = d.get("name"), d.get("index")
    return f"class {index}" if name in (None, f"class {index}") else f"{name} ({index})"


def _describe(rec: dict[str, Any]) -> str:
    parts = [f"{rec['input']}:"]
    if rec.get("task") == "detection":
        found = rec.get("detections") or []
        if not found:
            threshold = rec.get("settings", {}).get("score_threshold")
            parts.append(f"nothing detected with score >= {threshold} (lower --score-threshold to see more);")
        else:
            shown = ", ".join(f"{d['name']} {d['score']:.2f}" for d in found[:5])
            parts.append(f"{len(found)} detection(s): {shown}{' ...' if len(found) > 5 else ''};")
        rec = {**rec, "predicted": None}
    p, t = rec.get("predicted"), rec.get("target")

    def scored(score: float) -> str:  # a probability, or a segmentation's share of the pixels
        return f"{score:.1%} of pixels" if rec.get("region") else f"p={score:.3f}"

    if p:
        parts.append(f"predicted {_named(p)} {scored(p['score'])};")
        if t and t["index"] != p["index"]:
            parts.append(f"explained {_named(t)} {scored(t['score'])};")
    outs = rec["outputs"]
    verb = "exists" if rec["status"] == "skipped" else "wrote"
    if outs:
        parts.append(f"{verb} {outs[0]}" + (f" (+{len(outs) - 1} more)" if len(outs) > 1 else ""))
    return " ".join(parts)


def _run_job(job_factory: Callable[[Any, _Reporter | None], Any], m: ModelOptions, r: RunOptions) -> None:
    """The shared body of the per-image commands: inputs → model → job → pipeline → records.

    Under ``torchrun`` every rank runs its shard of the inputs; the ranks then meet, rank 0 merges the
    manifest parts (and prints the records with ``--json``), and each exits with the worst code.
    """
    from hookviz import distributed

    if r.overwrite and r.skip_existing:
        raise typer.BadParameter(
            "--overwrite (redo everything) and --skip-existing (keep what exists) contradict each other; "
            "pass one",
            param_hint="--skip-existing",
        )
    dist = distributed.from_env()
    if dist is None:
        _run_shard(job_factory, m, r, None)
        return
    if "-" in r.inputs:  # said once, by rank 0; every rank stops with the same code
        if dist.rank != 0:
            raise typer.Exit(EXIT_USAGE)
        _fail(
            "reading paths from stdin is not supported under torchrun (each rank has its own stdin); "
            "pass files, folders or globs",
            EXIT_USAGE,
        )
    distributed.init(dist)
    m = ModelOptions(**{**m.__dict__, "device": distributed.device_and_threads(dist, m.device)})
    code = 0
    try:
        _run_shard(job_factory, m, r, dist)
    except typer.Exit as exc:
        code = int(exc.exit_code or 0)
    except KeyboardInterrupt:
        typer.echo(f"hookviz[rank {dist.rank}]: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except HookvizError as exc:
        if dist.rank == 0 or exc.exit_code != EXIT_USAGE:  # a usage error is the same on every rank
            typer.echo(f"hookviz[rank {dist.rank}]: error: {exc}", err=True)
        code = exc.exit_code
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        typer.echo(f"hookviz[rank {dist.rank}]: internal error: {type(exc).__name__}: {first}", err=True)
        code = EXIT_INTERNAL
    worst = distributed.finish(dist, code)  # every rank is done writing here
    if dist.rank == 0 and r.out.is_dir():
        from hookviz import pipeline

        before = (r.out / pipeline.MANIFEST).read_bytes() if (r.out / pipeline.MANIFEST).exists() else b""
        distributed.merge_parts(r.out, pipeline.MANIFEST, only_dead=False, job=dist.job)
        distributed.clear_progress(r.out, dist)
        if r.as_json:
            added = (r.out / pipeline.MANIFEST).read_bytes()[len(before) :].decode("utf-8", "replace")
            sys.stdout.write(added)
            sys.stdout.flush()
        if r.report:
            from hookviz.report import build_report

            typer.echo(f"hookviz: report: {build_report(r.out, warn=_warn)}", err=True)
    # Only rank 0 reports the worst code: a rank that exits non-zero first makes torchrun stop the others,
    # which could cut rank 0's merge short. torchrun exits with rank 0's code.
    if worst and dist.rank == 0:
        raise typer.Exit(worst)


def _first_images(items: list[Any], loaded: Any, n: int, max_pixels: int) -> Any:
    import numpy as np
    import torch

    from hookviz.errors import InputError
    from hookviz.images import load_rgb

    xs: list[Any] = []
    for item in items:
        if item.path is None:
            continue
        try:
            x, _ = loaded.preprocess(load_rgb(item.path, max_pixels=max_pixels))
        except InputError:
            continue
        if xs and x.shape != xs[0].shape:  # one batch: photos of the first one's input size
            continue
        xs.append(x)
        if len(xs) == n:
            break
    return torch.from_numpy(np.stack(xs)).to(loaded.device) if xs else None


def _run_shard(
    job_factory: Callable[[Any, _Reporter | None], Any], m: ModelOptions, r: RunOptions, dist: Any
) -> None:
    """One process's run (the whole run, or one torchrun rank's shard of it)."""
    from hookviz import distributed, pipeline

    lead = dist is None or dist.rank == 0
    real_out = r.out.resolve()
    for spec in r.inputs:
        if spec != "-" and Path(spec).is_dir() and Path(spec).resolve() == real_out:
            _fail(
                f"--out {str(r.out)!r} is also an input folder; outputs would be read back as inputs. "
                "Choose another --out",
                EXIT_USAGE,
            )
    everything = pipeline.expand_inputs(
        r.inputs, sys.stdin if "-" in r.inputs else None, exclude=r.out, null=r.null
    )
    items = distributed.shard(everything, dist)
    output = pipeline.Output(
        r.out, overwrite=r.overwrite, manifest=dist.part_name if dist is not None else pipeline.MANIFEST
    )
    quiet = r.quiet or not lead or (r.as_json and dist is not None)
    with _stdout_reserved() as stdout:
        loaded = _load(m, quiet)
        # Under torchrun only rank 0 talks; the records are printed once, merged, at the end.
        reporter = _Reporter(stdout, quiet, r.as_json and dist is None)
        reporter.lead = lead
        # The first images of the whole input list, not of this rank's shard: every rank sees the same.
        reporter.first_images = lambda n: _first_images(everything, loaded, n, r.max_pixels)
        if dist is not None:
            reporter.agree = distributed.agree
        try:
            job = job_factory(loaded, reporter)
            if not loaded.pretrained and not quiet:
                typer.echo(
                    f"hookviz: note: {loaded.name} has RANDOM weights (--weights none); "
                    "maps show mechanics only",
                    err=True,
                )
            if not quiet and not loaded.categories and loaded.task == "classification":
                from hookviz.sources.weights import classifier_out

                if classifier_out(loaded.model) == 1000:
                    typer.echo(
                        f"hookviz: note: {loaded.name}'s head has 1000 classes and no names; if they are "
                        "ImageNet's, --labels imagenet names them",
                        err=True,
                    )
            if lead and r.out.is_dir():  # parts left by a killed torchrun job, before this run's records
                distributed.merge_parts(r.out, pipeline.MANIFEST, only_dead=True)
            output.prepare()
            if dist is not None:
                reporter.count_from = lambda: distributed.global_progress(r.out, dist)
            reporter.start(len(everything))
            base = {
                "command": job.kind,
                "model": loaded.name,
                "weights": loaded.weights,
                "pretrained": loaded.pretrained,
            }
            records = pipeline.run(
                items,
                job,
                preprocess=loaded.preprocess,
                output=output,
                device=loaded.device,
                base=base,
                batch_size=r.batch_size,
                workers=r.workers,
                skip_existing=r.skip_existing,
                max_pixels=r.max_pixels,
            )
            take_notes = getattr(job, "take_notes", None)
            for done, rec in enumerate(records, start=1):
                for text in take_notes() if take_notes is not None else ():
                    if not quiet:
                        reporter.say(f"hookviz: note: {text}", err=True)
                reporter.add(rec)
                if dist is not None:
                    distributed.write_progress(r.out, dist, done)
        finally:
            reporter.close()
    if r.report and dist is None:
        from hookviz.report import build_report

        typer.echo(f"hookviz: report: {build_report(r.out, warn=_warn)}", err=True)
    if reporter.failed:
        where = f"rank {dist.rank}: " if dist is not None else ""
        typer.echo(
            f"hookviz: {where}{reporter.failed} of {len(items)} input(s) failed; "
            f"see {r.out / pipeline.MANIFEST}",
            err=True,
        )
        raise typer.Exit(EXIT_INPUTS_FAILED)


@app.command(cls=MethodCommand)
def gradcam(
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
            "-l",
            help="module name; repeatable (default: the last convolutional stage); auto: the most faithful "
            "of the candidate layers on the first images (--probe).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    methods: Methods = None,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            "-t",
            help="top1, topK (top5), a class index or name, or a comma list.",
            rich_help_panel=MAPS,
        ),
    ] = "top1",
    normalize: Annotated[
        Normalize,
        typer.Option(
            "--normalize",
            help="image: each map min-max; batch: one scale per batch; none: the fixed scale 0..--vmax.",
            rich_help_panel=MAPS,
        ),
    ] = Normalize.image,
    vmax: Annotated[
        float | None,
        typer.Option(
            "--vmax", help="with --normalize none: the map value drawn as full colour.", rich_help_panel=MAPS
        ),
    ] = None,
    fuse: Annotated[
        Fuse | None, typer.Option("--fuse", help="also fuse the maps of all layers.", rich_help_panel=MAPS)
    ] = None,
    sheet: Annotated[
        bool | None,
        typer.Option(
            "--sheet/--no-sheet", help="comparison sheet (default: when >1 map).", rich_help_panel=OUTPUT
        ),
    ] = None,
    probe_images: Annotated[
        int,
        typer.Option(
            "--probe",
            min=1,
            help="with --layer auto: images of the first batch that choose the layer.",
            rich_help_panel=MAPS,
        ),
    ] = 8,
    eigen_smooth: Annotated[
        bool,
        typer.Option(
            "--eigen-smooth",
            help="gradient methods: first principal component of the weighted activations.",
            rich_help_panel=MAPS,
        ),
    ] = False,
    aug_smooth: Annotated[
        bool,
        typer.Option(
            "--aug-smooth",
            help="average over flips and brightness 0.9/1.0/1.1 (6 passes).",
            rich_help_panel=MAPS,
        ),
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="deletion and insertion AUC of every map (record, caption, sheet).",
            rich_help_panel=MAPS,
        ),
    ] = False,
    region: Annotated[
        Region,
        typer.Option(
            "--region",
            help="segmentation: explain the class's score over its predicted pixels, or over all pixels.",
            rich_help_panel=DENSE,
        ),
    ] = Region.class_,
    score_threshold: Annotated[
        float,
        typer.Option(
            "--score-threshold",
            min=0.0,
            max=1.0,
            help="detection: explain the boxes scoring at least this.",
            rich_help_panel=DENSE,
        ),
    ] = 0.5,
    max_boxes: Annotated[
        int,
        typer.Option(
            "--max-boxes",
            min=1,
            help="detection: at most this many boxes, best first.",
            rich_help_panel=DENSE,
        ),
    ] = 10,
    scorecam_batch: Annotated[
        int,
        typer.Option(
            "--scorecam-batch", min=1, help="masked inputs per Score-CAM forward pass.", rich_help_panel=RUN
        ),
    ] = 64,
    alpha: Annotated[
        float, typer.Option("--alpha", min=0.0, max=1.0, help="heatmap opacity.", rich_help_panel=MAPS)
    ] = 0.5,
    colormap: Annotated[
        Colormap, typer.Option("--colormap", help="heatmap colours.", rich_help_panel=MAPS)
    ] = (Colormap.jet),
    no_relu: Annotated[
        bool, typer.Option("--no-relu", help="signed maps: negative evidence in blue.", rich_help_panel=MAPS)
    ] = False,
    save_raw: Annotated[
        bool,
        typer.Option(
            "--save-raw",
            help="also write raw maps as .npy (feature and photo resolution).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    workers: Workers = 2,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    report: ReportOpt = False,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """Grad-CAM and the CAM family over the original photos: where the model looks for a class.

    Segmentation models explain a class's pixels (outlined); detectors explain each box they find.
    """
    m = ModelOptions(
        model,
        weights,
        device,
        input_size,
        resize,
        labels,
        weights_key,
        _rgb(mean, "--mean"),
        _rgb(std, "--std"),
        trust_pickle,
    )
    r = RunOptions(
        inputs,
        out,
        batch_size,
        workers,
        overwrite,
        skip_existing,
        max_pixels,
        null,
        quiet,
        as_json,
        debug,
        report,
    )
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            from hookviz.jobs import CamJob
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import num_classes, parse_targets, probe

            # Under torchrun only rank 0 talks (its reporter is the one that is not quiet).
            hush = quiet or (reporter is not None and reporter.quiet)
            calls = probe(loaded)
            t = parse_targets(target, loaded, num_classes(loaded))
            if loaded.task == "detection":
                return _detection_job(
                    loaded,
                    calls,
                    layers,
                    methods,
                    t,
                    score_threshold,
                    max_boxes,
                    hush,
                    alpha,
                    colormap,
                    no_relu,
                    save_raw,
                    eigen_smooth,
                    dict(
                        fuse=fuse,
                        metrics=metrics,
                        aug_smooth=aug_smooth,
                        normalize=normalize != Normalize.image,
                    ),
                )
            auto = None
            if layers == ["auto"]:
                # Said even with -q (it is a result), once under torchrun.
                auto = _auto_layer(
                    loaded, calls, reporter, probe_images, [str(x) for x in methods or []],
                    reporter is not None and not reporter.lead,
                )  # fmt: skip
                chosen = [auto["chosen"]]
            elif not layers:
                chosen = [default_cam_layer(loaded.model, calls)]
            else:
                chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(layers)]
            job = CamJob(
                loaded,
                chosen,
                [str(x) for x in (methods or ["gradcam"])],
                t,
                alpha,
                str(colormap),
                relu=not no_relu,
                save_raw=save_raw,
                normalize=str(normalize),
                vmax=vmax,
                fuse=str(fuse) if fuse is not None else None,
                sheet=sheet,
                scorecam_batch=scorecam_batch,
                metrics=metrics,
                eigen_smooth=eigen_smooth,
                aug_smooth=aug_smooth,
                region=str(region),
            )
            job.auto_layer = auto
            if not layers and not hush:
                from hookviz.layers import default_reason

                typer.echo(
                    f"hookviz: using layer {chosen[0]} (the default for {loaded.name}: "
                    f"{default_reason(calls, chosen[0])}; --layer to change)",
                    err=True,
                )
            if "scorecam" in job.methods and not hush:
                from hookviz.layers import channels

                passes = sum(channels(loaded.model, name, calls) for name in chosen)
                typer.echo(
                    f"hookviz: note: Score-CAM runs {passes:,} masked forward passes per image "
                    f"(one per channel of {', '.join(chosen)}); it is the slow method",
                    err=True,
                )
                if reporter is not None:
                    job.progress = reporter.inner("Score-CAM masked passes")
            return job

        _run_job(make, m, r)


def _refuse_task(loaded: Any, command: str, refused: tuple[str, ...]) -> None:
    """One line for a command that does not apply to a segmentation model or a detector."""
    from hookviz.errors import UsageError

    if loaded.task in refused:
        a = "a detector" if loaded.task == "detection" else "a segmentation model"
        works = "classifiers" if "segmentation" in refused else "classifiers and segmentation models"
        raise UsageError(
            f"`hookviz {command}` works on {works}, and {loaded.name} is {a}; "
            "`hookviz gradcam` explains it (and `featuremaps`, `dropblock`, `layers`, `summary` work on it)"
        )


def _detection_job(
    loaded: Any,
    calls: Any,
    layers: list[str] | None,
    methods: list[str] | None,
    targets: str | list[int] | None,
    score_threshold: float,
    max_boxes: int,
    quiet: bool,
    alpha: float,
    colormap: Colormap,
    no_relu: bool,
    save_raw: bool,
    eigen_smooth: bool,
    refused: dict[str, Any],
) -> Any:
    """``gradcam`` on a detector: a map per box; ``--target`` keeps only the named classes."""
    from hookviz.errors import UsageError
    from hookviz.jobs import DetectionJob
    from hookviz.layers import cam_layer, default_cam_layer

    options = {
        "fuse": "--fuse",
        "metrics": "--metrics",
        "aug_smooth": "--aug-smooth",
        "normalize": "--normalize",
    }
    for key, flag in options.items():
        if refused[key]:
            raise UsageError(f"{flag} is not available for detectors (each box's map is scaled on its own)")
    if isinstance(targets, str):
        raise UsageError(f"--target {targets}: a detector explains every box it finds; name classes to keep")
    if layers == ["auto"]:
        raise UsageError("--layer auto is not available for detectors; give --layer or use the default")
    chosen = (
        [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(layers)]
        if layers
        else [default_cam_layer(loaded.model, calls)]
    )
    if not layers and not quiet:
        typer.echo(
            f"hookviz: using layer {chosen[0]} (the default for {loaded.name}: its backbone's last stage; "
            "--layer to change)",
            err=True,
        )
    if not methods and not quiet:
        typer.echo(
            "hookviz: using HiResCAM for a detector (Grad-CAM averages a box's local gradient over the "
            "whole image, so its map spreads to similar objects; --method gradcam to see it)",
            err=True,
        )
    return DetectionJob(
        loaded,
        chosen,
        [str(x) for x in (methods or ["hirescam"])],
        targets,
        score_threshold,
        max_boxes,
        alpha,
        str(colormap),
        relu=not no_relu,
        save_raw=save_raw,
        eigen_smooth=eigen_smooth,
    )


def _auto_layer(
    loaded: Any, calls: Any, reporter: Any, count: int, methods: list[str], quiet: bool = False
) -> dict[str, Any]:
    """``--layer auto``: the candidate layer with the best insertion - deletion AUC on the first images
    (:func:`hookviz.evaluation.choose_layer`); under torchrun every rank takes rank 0's choice."""
    from hookviz.errors import UsageError
    from hookviz.evaluation import choose_layer
    from hookviz.layers import candidate_layers

    x = reporter.first_images(count) if reporter is not None else None
    if x is None:
        raise UsageError("--layer auto needs at least one readable image among the inputs")
    chosen = choose_layer(loaded.model, x, candidate_layers(loaded.model, calls), methods)
    if reporter is not None:
        chosen = reporter.agree(chosen)
    if not quiet:
        shown = ", ".join(f"{n} {v:+.3f}" for n, v in chosen["scores"].items())
        signed = chosen.get("signed")
        passed = f"; passed over signed {', '.join(signed)}" if signed else ""
        typer.echo(
            f"hookviz: --layer auto chose {chosen['chosen']} (insertion - deletion AUC of {chosen['method']} "
            f"on {chosen['images']} image(s): {shown}{passed})",
            err=True,
        )
    return chosen


@app.command()
def featuremaps(
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
            "--layers",
            "--layer",
            "-l",
            help="names or globs (layer*.0.conv1); repeatable. Default: every Conv2d that runs.",
            rich_help_panel=MAPS,
        ),
    ] = None,
    stage: Annotated[
        Stage, typer.Option("--stage", help="the layer's input, output or both.", rich_help_panel=MAPS)
    ] = (Stage.output),
    max_channels: Annotated[
        int, typer.Option("--max-channels", min=1, help="channels per grid.", rich_help_panel=MAPS)
    ] = 64,
    colormap: Annotated[
        Colormap, typer.Option("--colormap", help="channel colours.", rich_help_panel=MAPS)
    ] = (Colormap.viridis),
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    workers: Workers = 2,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    report: ReportOpt = False,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """Feature-map grids of Conv2d layers: what each channel responds to, one PNG per layer."""
    m = ModelOptions(
        model,
        weights,
        device,
        input_size,
        resize,
        labels,
        weights_key,
        _rgb(mean, "--mean"),
        _rgb(std, "--std"),
        trust_pickle,
    )
    r = RunOptions(
        inputs,
        out,
        batch_size,
        workers,
        overwrite,
        skip_existing,
        max_pixels,
        null,
        quiet,
        as_json,
        debug,
        report,
    )
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            from hookviz.jobs import FeatureMapJob
            from hookviz.layers import map_layers
            from hookviz.models import probe

            names = map_layers(loaded.model, layers, probe(loaded), loaded.name)
            return FeatureMapJob(loaded, names, str(stage), max_channels, str(colormap))

        _run_job(make, m, r)


@app.command(cls=MethodCommand)
def evaluate(
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
            "--layer", "-l", help="module name; repeatable (default: the CAM default).", rich_help_panel=MAPS
        ),
    ] = None,
    methods: Methods = None,
    target: Annotated[
        str, typer.Option("--target", "-t", help="top1, or a class index or name.", rich_help_panel=MAPS)
    ] = "top1",
    steps: Annotated[
        int,
        typer.Option("--steps", min=2, help="points on the deletion/insertion curves.", rich_help_panel=MAPS),
    ] = 16,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    workers: Workers = 2,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """How faithful each map is: deletion/insertion AUC, average drop, increase in confidence, vs chance."""
    m = ModelOptions(
        model, weights, device, input_size, resize, labels, weights_key,
        _rgb(mean, "--mean"), _rgb(std, "--std"), trust_pickle,
    )  # fmt: skip
    r = RunOptions(
        inputs, out, batch_size, workers, overwrite, skip_existing, max_pixels, null, True, as_json, debug
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            _refuse_task(loaded, "evaluate", ("detection",))
            from hookviz.jobs import EvaluateJob
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import num_classes, parse_targets, probe

            calls = probe(loaded)
            chosen = (
                [cam_layer(loaded.model, n, calls, loaded.name) for n in dict.fromkeys(layers)]
                if layers
                else [default_cam_layer(loaded.model, calls)]
            )
            t = parse_targets(target, loaded, num_classes(loaded))
            if isinstance(t, str):
                raise typer.BadParameter(
                    "evaluate explains one class per image: top1 or a class", param_hint="--target"
                )
            job = EvaluateJob(loaded, chosen, [str(x) for x in (methods or ["gradcam"])], t, steps)
            made.append(job)
            return job

        _run_then(make, m, r, lambda: _write_evaluation(made[0], out, quiet, as_json) if made else None)


def _run_then(job_factory: Any, m: ModelOptions, r: RunOptions, summarise: Callable[[], None]) -> None:
    """:func:`_run_job`, then ``summarise()`` over the run's records (on rank 0 under torchrun), even when
    some inputs failed; the run's exit code stands."""
    from hookviz import distributed

    failed: typer.Exit | None = None
    try:
        _run_job(job_factory, m, r)
    except typer.Exit as exc:
        failed = exc
    dist = distributed.from_env()
    if dist is None or dist.rank == 0:
        summarise()
    if failed is not None:
        raise failed


def _write_evaluation(job: Any, out: Path, quiet: bool, as_json: bool) -> None:
    """The table (stdout, or stderr with --json), OUT/evaluation.csv and OUT/evaluation.json."""
    import csv
    import io

    from hookviz import pipeline
    from hookviz.files import atomic_write
    from hookviz.jobs import summarise_evaluation
    from hookviz.report import latest_records

    key = pipeline.settings_key(job.settings())
    lines = (out / pipeline.MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    rows = summarise_evaluation(recs)
    passes = sum(int(x.get("forward_passes", 0)) for x in recs)
    columns = ["method", "layer", "images", "deletion_auc", "deletion_auc_ci95", "insertion_auc",
               "insertion_auc_ci95", "average_drop", "average_drop_ci95", "increase_in_confidence",
               "increase_in_confidence_ci95_low", "increase_in_confidence_ci95_high"]  # fmt: skip
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        low, high = row["increase_in_confidence_ci95"]
        writer.writerow(
            {**row, "increase_in_confidence_ci95_low": low, "increase_in_confidence_ci95_high": high}
        )
    summary = {
        "key": key,
        "settings": job.settings(),
        "images": len(recs),
        "forward_passes": passes,
        "rows": rows,
    }
    for name, text in (
        ("evaluation.csv", buf.getvalue()),
        ("evaluation.json", json.dumps(pipeline.finite(summary), indent=1, allow_nan=False)),
    ):
        atomic_write(out / name, text)
    table = [
        f"{'method':<12} {'layer':<28} {'n':>4}  {'deletion AUC ↓':>16}  {'insertion AUC ↑':>16}  "
        f"{'avg drop % ↓':>14}  {'increase % ↑':>13}"
    ]
    for row in rows:
        table.append(
            f"{row['method']:<12} {row['layer']:<28} {row['images']:>4}  "
            f"{row['deletion_auc']:>8.3f} ±{row['deletion_auc_ci95']:<6.3f}  "
            f"{row['insertion_auc']:>8.3f} ±{row['insertion_auc_ci95']:<6.3f}  "
            f"{row['average_drop']:>6.1f} ±{row['average_drop_ci95']:<5.1f}  "
            f"{row['increase_in_confidence']:>5.1f} "
            f"[{row['increase_in_confidence_ci95'][0]:.0f}, {row['increase_in_confidence_ci95'][1]:.0f}]"
        )
    table.append(
        f"{len(recs)} image(s), {passes:,} forward passes; ± is the 95 % confidence interval of the mean "
        "(Student's t), [low, high] that of a proportion (Wilson); random and center are chance baselines"
    )
    table.append(f"wrote {out / 'evaluation.csv'} and {out / 'evaluation.json'}")
    if not quiet or not as_json:
        typer.echo("\n".join(table), err=as_json)


@app.command(cls=MethodCommand)
def sanity(
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
    layer: Annotated[
        str | None,
        typer.Option("--layer", "-l", help="module name (default: the CAM default).", rich_help_panel=MAPS),
    ] = None,
    methods: Methods = None,
    seed: Annotated[
        int, typer.Option("--seed", help="seed of the random parameters.", rich_help_panel=MAPS)
    ] = 0,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    batch_size: BatchSize = 8,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """The sanity check: randomise the weights from the head down; a faithful map must change with them."""
    m = ModelOptions(
        model, weights, device, input_size, resize, labels, weights_key,
        _rgb(mean, "--mean"), _rgb(std, "--std"), trust_pickle,
    )  # fmt: skip
    r = RunOptions(
        inputs, out, batch_size, 2, overwrite, skip_existing, max_pixels, null, quiet, as_json, debug
    )
    made: list[Any] = []
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            _refuse_task(loaded, "sanity", ("detection",))
            from hookviz.jobs import SanityJob
            from hookviz.layers import cam_layer, default_cam_layer
            from hookviz.models import probe

            calls = probe(loaded)
            name = (
                cam_layer(loaded.model, layer, calls, loaded.name)
                if layer
                else default_cam_layer(loaded.model, calls)
            )
            job = SanityJob(loaded, name, [str(x) for x in (methods or ["gradcam"])], seed)
            made.append(job)
            return job

        _run_then(make, m, r, lambda: _write_sanity(made[0], out, as_json) if made else None)


def _write_sanity(job: Any, out: Path, as_json: bool) -> None:
    from hookviz import pipeline
    from hookviz.files import atomic_write
    from hookviz.jobs import summarise_sanity
    from hookviz.report import latest_records

    key = pipeline.settings_key(job.settings())
    lines = (out / pipeline.MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    steps = summarise_sanity(recs)
    summary = {"key": key, "layer": job.layer, "images": len(recs), "steps": steps}
    atomic_write(out / "sanity.json", json.dumps(pipeline.finite(summary), indent=1, allow_nan=False))
    lines_out = []
    for method in [*job.methods, "edges"]:
        mine = [s for s in steps if s["method"] == method]
        if not mine:
            continue
        last = mine[-1]
        changed = last["spearman"] < 0.5
        verdict = (
            "changes with the weights: it depends on what the model learned (passes)"
            if changed
            else "barely changes with the weights: it does not depend on what the model learned"
        )
        lines_out.append(
            f"{method}: at full randomisation Spearman {last['spearman']:.2f}, SSIM {last['ssim']:.2f} "
            f"over {last['images']} image(s): the map {verdict}"
        )
    lines_out.append(f"wrote {out / 'sanity.json'}")
    typer.echo("\n".join(lines_out), err=as_json)


@app.command()
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
    trust_pickle: TrustPickle = False,
    mean: MeanOpt = None,
    std: StdOpt = None,
    debug: Debug = False,
) -> None:
    """List a model's hookable modules: name, type, output shape; marks the default Grad-CAM layer."""
    with _guard(debug):
        from hookviz.layers import default_cam_layer
        from hookviz.models import load_model, probe

        loaded = load_model(model, weights, input_size=input_size, trust_pickle=trust_pickle)
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
    weights_key: WeightsKey = None,
    labels: Labels = None,
    input_size: InputSize = None,
    resize: ResizeOpt = None,
    mean: MeanOpt = None,
    std: StdOpt = None,
    trust_pickle: TrustPickle = False,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            "-t",
            help="top1 or a class (index or name) whose score is differentiated.",
            rich_help_panel=MAPS,
        ),
    ] = "top1",
    label: Annotated[
        str | None,
        typer.Option(
            "--label",
            help="use cross-entropy against this class (index or name) instead.",
            rich_help_panel=MAPS,
        ),
    ] = None,
    layers: Annotated[
        list[str] | None,
        typer.Option(
            "--layers",
            "-l",
            help="names or globs (default: every module with parameters).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """Gradient norms per layer, in network order (log scale), from one backward per image; PNG + JSON."""
    m = ModelOptions(
        model,
        weights,
        device,
        input_size,
        resize,
        labels,
        weights_key,
        _rgb(mean, "--mean"),
        _rgb(std, "--std"),
        trust_pickle,
    )
    r = RunOptions(inputs, out, 8, 2, overwrite, skip_existing, max_pixels, null, quiet, as_json, debug)
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            _refuse_task(loaded, "gradflow", ("segmentation", "detection"))
            from hookviz.jobs import GradFlowJob
            from hookviz.layers import resolve_layers
            from hookviz.models import num_classes, parse_target

            n = num_classes(loaded)
            names = resolve_layers(loaded.model, layers, model_name=loaded.name) if layers else None
            lab = parse_target(label, loaded, n, "--label") if label is not None else None
            if label is not None and lab is None:
                raise typer.BadParameter("give a class index or name", param_hint="--label")
            return GradFlowJob(loaded, parse_target(target, loaded, n), lab, names)

        _run_job(make, m, r)


@app.command()
def dropblock(
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
    layer: Annotated[
        str | None,
        typer.Option(
            "--layer",
            "-l",
            help="module whose output gets DropBlock (default: the default CAM layer).",
            rich_help_panel=MAPS,
        ),
    ] = None,
    drop_prob: Annotated[
        float,
        typer.Option(
            "--drop-prob", min=0.0, max=0.99, help="expected dropped fraction.", rich_help_panel=MAPS
        ),
    ] = 0.1,
    block_size: Annotated[
        int, typer.Option("--block-size", min=1, help="side of the dropped squares.", rich_help_panel=MAPS)
    ] = 7,
    shared: Annotated[
        bool, typer.Option("--shared", help="one mask for all channels.", rich_help_panel=MAPS)
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of the mask.", rich_help_panel=MAPS)] = 0,
    max_channels: Annotated[
        int, typer.Option("--max-channels", min=1, help="channels shown.", rich_help_panel=MAPS)
    ] = 16,
    out: Out = Path("out"),
    overwrite: Overwrite = False,
    skip_existing: SkipExisting = False,
    quiet: Quiet = False,
    as_json: JsonOut = False,
    device: Device = "auto",
    max_pixels: MaxPixels = 80_000_000,
    null: Null = False,
    debug: Debug = False,
) -> None:
    """What DropBlock does to a layer: its feature maps before, the keep mask, and after (one PNG)."""
    m = ModelOptions(
        model,
        weights,
        device,
        input_size,
        resize,
        labels,
        weights_key,
        _rgb(mean, "--mean"),
        _rgb(std, "--std"),
        trust_pickle,
    )
    r = RunOptions(inputs, out, 8, 2, overwrite, skip_existing, max_pixels, null, quiet, as_json, debug)
    with _guard(debug):

        def make(loaded: Any, reporter: _Reporter | None) -> Any:
            from hookviz.jobs import DropBlockJob
            from hookviz.layers import default_cam_layer, is_pattern, map_layers
            from hookviz.models import probe

            calls = probe(loaded)
            chosen = layer or default_cam_layer(loaded.model, calls)
            if is_pattern(chosen):
                raise typer.BadParameter("takes one module name, not a pattern", param_hint="--layer")
            (name,) = map_layers(loaded.model, [chosen], calls, loaded.name)
            return DropBlockJob(loaded, name, drop_prob, block_size, shared, seed, max_channels)

        _run_job(make, m, r)


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
    trust_pickle: TrustPickle = False,
    mean: MeanOpt = None,
    std: StdOpt = None,
    debug: Debug = False,
) -> None:
    """Shapes, parameters and MACs per module, totals, memory; attention and functional ops included."""
    size = _parse_size(input_size) if input_size is not None else None
    if plot is not None:
        if plot.exists() and not overwrite:
            _fail(f"--plot {str(plot)!r}: the file exists; pass --overwrite to replace it", EXIT_USAGE)
        if not plot.parent.is_dir():
            _fail(
                f"--plot {str(plot)!r}: the folder {str(plot.parent)!r} does not exist; create it first",
                EXIT_USAGE,
            )
        if plot.suffix.lower() != ".png":
            _fail(f"--plot {str(plot)!r}: the plot is a PNG; give a path ending in .png", EXIT_USAGE)
    with _guard(debug):
        from hookviz.models import load_model
        from hookviz.summary import summarize

        loaded = load_model(model, weights, trust_pickle=trust_pickle)
        if size is None:
            size = [3, loaded.preprocess.crop_size, loaded.preprocess.crop_size]
            input_size = ",".join(map(str, size))
        try:
            result = summarize(loaded.model, size, batch_size=batch_size, depth=depth, name=loaded.name)
        except RuntimeError as exc:  # the model cannot take that shape (channels, too small a side)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _fail(
                f"--input-size {input_size}: {model} cannot run on an input of shape "
                f"({batch_size}, {', '.join(map(str, size))}) ({first}); give the C,H,W it expects, "
                "e.g. 3,224,224",
                EXIT_USAGE,
            )
        formats = {"markdown": result.to_markdown, "json": result.to_json, "csv": result.to_csv}
        text = str(result) if fmt == SummaryFormat.table else formats[str(fmt)]()
        typer.echo(text.rstrip("\n"))
        if plot is not None:
            from hookviz.files import atomic_write
            from hookviz.images import encode_png
            from hookviz.render import summary_plot

            atomic_write(plot, encode_png(summary_plot(result)))  # never half a PNG
            typer.echo(f"hookviz: wrote {plot}", err=True)


@app.command()
def report(
    out: Annotated[Path, typer.Argument(help="the --out folder of a run (it holds manifest.jsonl).")],
    title: Annotated[str | None, typer.Option("--title", help="the page's title.")] = None,
    debug: Debug = False,
) -> None:
    """Write OUT/index.html: one static page to browse, filter and sort a run's maps (opens from file://)."""
    with _guard(debug):
        from hookviz.report import build_report

        typer.echo(str(build_report(out, title=title, warn=_warn)))


@app.command()
def models(
    task: Annotated[
        Task | None,
        typer.Option("--task", help="only this task's models, one name per line (for scripts)."),
    ] = None,
) -> None:
    """List torchvision's models with their task (timm:NAME, hf:DIR, file.py:FN and FILE.pt work too)."""
    from hookviz.models import list_models

    if task is not None:
        for name in list_models(str(task)):
            typer.echo(name)
        return
    rows = [(name, t.value) for t in Task for name in list_models(t.value)]
    width = max(len(name) for name, _ in rows)
    for name, kind in rows:
        typer.echo(f"{name:<{width}}  {kind}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
