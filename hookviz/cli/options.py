"""The option groups, each declared once: a frozen dataclass whose fields carry their option (from
:mod:`hookviz.cli.flags`) and default. A command names the groups it takes as parameters (``model:
ModelOptions``); :func:`grouped` splices each group's fields into the signature Typer reads, in place, and
hands the command typed objects. ``Annotated[RunOptions, omit("report")]`` leaves fields out of a command
(they keep their defaults).

Example:
    >>> @grouped
    ... def hello(name: str, run: Annotated[RunOptions, omit("report")]) -> None: ...
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from typer.models import ParameterInfo

from hookviz.cli.app import guarded
from hookviz.cli.flags import (
    Alpha,
    AugSmooth,
    Baseline,
    BatchSize,
    Cells,
    ClipLen,
    ClipsOpt,
    ColormapOpt,
    Compare,
    Debug,
    Device,
    DiscardRatio,
    EigenSmooth,
    Embedding,
    FrameStride,
    FuseOpt,
    HeadFusion,
    HeadOpt,
    IgSteps,
    InputsColumn,
    InputSize,
    InputsTable,
    JsonOut,
    Labels,
    LogOpt,
    MapsStore,
    MaskedBatch,
    Masks,
    MaxBoxes,
    MaxMemory,
    MaxPixels,
    MeanOpt,
    MetricsOpt,
    Model,
    Negate,
    Noise,
    NoPictures,
    NoRelu,
    NormalizeOpt,
    Null,
    Out,
    OutputOpt,
    Overwrite,
    Probe,
    Prompt,
    PromptsFile,
    Quiet,
    RecordsOpt,
    RegionOpt,
    ReportOpt,
    ResizeOpt,
    Samples,
    SaveRaw,
    ScoreThreshold,
    Seed,
    SheetOpt,
    SimilarTo,
    SkipExisting,
    StdOpt,
    Stride,
    TaskOpt,
    Threshold,
    TopChannels,
    TrustPickle,
    Vmax,
    Weights,
    WeightsKey,
    Window,
    Workers,
)
from hookviz.errors import UsageError
from hookviz.jobs.settings import CamSettings
from hookviz.methods import MethodOptions

__all__ = [
    "CamLook",
    "CamMaps",
    "MethodFlags",
    "ModelOptions",
    "PlainModel",
    "Prompts",
    "RunOptions",
    "Sampling",
    "grouped",
    "omit",
    "told",
]

#: The library's defaults, which the groups below take as theirs (each stated once, in the library).
CAM = CamSettings()
METHOD = MethodOptions()

#: The data-set options (a table in, Parquet and Zarr out): commands that do not run the pipeline omit them.
DATA = ("inputs_table", "inputs_column", "records", "maps", "no_pictures", "log")

F = TypeVar("F", bound=Callable[..., Any])


#: The command running (its function's name, which is its name on the command line), for the runner to
#: refuse where the model's task does not take it.
RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("hookviz_command", default=None)

#: The option groups (:func:`group` adds one).
GROUPS: set[type] = set()


def group(cls: type) -> type:
    """Mark a frozen dataclass as an option group (its annotated fields are options)."""
    GROUPS.add(cls)
    return cls


@dataclass(frozen=True)
class told:
    """New help for some of a group's options in one command: ``told(out="output folder: ...")``."""

    helps: tuple[tuple[str, str], ...]

    def __init__(self, **helps: str) -> None:
        object.__setattr__(self, "helps", tuple(helps.items()))


@dataclass(frozen=True)
class omit:
    """The fields of a group a command leaves out (they keep their defaults)."""

    names: tuple[str, ...]

    def __init__(self, *names: str) -> None:
        object.__setattr__(self, "names", names)


@group
@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """How to get the model: the options every per-image command shares, and what the run sets (the device,
    the inputs' kind and names, a video's sampling)."""

    model: Model = "resnet18"
    weights: Weights = "DEFAULT"
    weights_key: WeightsKey = None
    labels: Labels = None
    input_size: InputSize = None
    resize: ResizeOpt = None
    #: Per channel, or per input of several (pairs of a name and its values), as ``--mean`` parses them.
    mean: MeanOpt = None
    std: StdOpt = None
    trust_pickle: TrustPickle = False
    #: How a classifier's outputs are read (``--head``), and ``--negate`` for a regression.
    head: HeadOpt = "auto"
    #: ``--output``: which tensor of a model returning several holds the class scores.
    output: OutputOpt = None
    #: ``--task``: what the output is, where the model and the inputs do not tell.
    task: TaskOpt = None
    negate: Negate = False
    device: str = "auto"
    #: The input kind every input is of (``volume``), where it decides the task (a 3-D CNN).
    volumes: bool = False
    #: The names of a model's several inputs (``--input NAME=PATH``), in order.
    inputs: tuple[str, ...] = ()
    #: A video model's sampling (None: its weights'): frames per clip, every Nth frame, clips per video.
    clip_len: int | None = None
    frame_stride: int | None = None
    clips: str | None = None


#: The model options of the commands that read a model's classes as they are (no ``--head``, ``--task``,
#: ``--negate``): featuremaps, channels, tcav, gradflow, dropblock.
PlainModel = Annotated[ModelOptions, omit("head", "task", "negate", "output")]


@group
@dataclass(frozen=True, kw_only=True)
class Sampling:
    """A video model's clip sampling (``--clip-len``, ``--frame-stride``, ``--clips``)."""

    clip_len: ClipLen = None
    frame_stride: FrameStride = None
    clips: ClipsOpt = None


@group
@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to run over the inputs and where results go."""

    out: Out = Path("out")
    overwrite: Overwrite = False
    skip_existing: SkipExisting = False
    quiet: Quiet = False
    as_json: JsonOut = False
    batch_size: BatchSize = 8
    workers: Workers = 2
    device: Device = "auto"
    max_pixels: MaxPixels = 80_000_000
    #: Bytes a batch may hold (None: half of what is available).
    max_memory: MaxMemory = None
    report: ReportOpt = False
    null: Null = False
    debug: Debug = False
    #: The inputs as given (files, folders, globs, ``-``; ``NAME=PATH`` specs for a model of several).
    inputs: list[str] = dataclasses.field(default_factory=list)
    #: Data where it lives (:mod:`hookviz.io.stores`, :mod:`hookviz.io.sinks`): a table of inputs, its path
    #: column, the records as Parquet and the raw maps as Zarr (``parquet``/``zarr``: under ``--out``).
    inputs_table: InputsTable = None
    inputs_column: InputsColumn = None
    records: RecordsOpt = None
    maps: MapsStore = None
    no_pictures: NoPictures = False
    #: An experiment tracker the run is logged to (:mod:`hookviz.io.trackers`): ``mlflow[:URI]``, ``wandb``.
    log: LogOpt = None
    #: A line per input on stdout (``evaluate`` prints a table at the end instead; its bar stays).
    lines: bool = True


@group
@dataclass(frozen=True, kw_only=True)
class MethodFlags:
    """The methods' settings (``--seed``, ``--samples``, ``--rise-masks``, ...), Finer-CAM's ``--compare``."""

    masked_batch: MaskedBatch = METHOD.batch
    seed: Seed = METHOD.seed
    samples: Samples = METHOD.samples
    noise: Noise = METHOD.noise
    ig_steps: IgSteps = METHOD.steps
    baseline: Baseline = METHOD.baseline
    window: Window = METHOD.window
    stride: Stride = METHOD.stride
    masks: Masks = METHOD.masks
    cells: Cells = METHOD.cells
    head_fusion: HeadFusion = METHOD.head_fusion
    discard_ratio: DiscardRatio = METHOD.discard
    #: Finer-CAM's classes as given (indices or names, a comma list), resolved with the model.
    compare: Compare = None

    def options(self) -> MethodOptions:
        """The :class:`hookviz.methods.MethodOptions` these give (checked: a bad one is a usage error)."""
        return MethodOptions(
            seed=self.seed, samples=self.samples, noise=self.noise, steps=self.ig_steps,
            baseline=self.baseline.strip().lower(), window=self.window, stride=self.stride, masks=self.masks,
            cells=self.cells, batch=self.masked_batch, head_fusion=self.head_fusion.strip().lower(),
            discard=self.discard_ratio,
            compare=tuple(c for c in (self.compare or "").split(",") if c.strip()),
        )  # fmt: skip


@group
@dataclass(frozen=True, kw_only=True)
class Prompts:
    """What replaces the classes: text prompts, or the similarity to a photo."""

    prompt: Prompt = None
    prompts_file: PromptsFile = None
    similar_to: SimilarTo = None
    embedding: Embedding = None

    def apply(self, loaded: Any) -> Any:
        """``loaded`` explaining them (its task allowing)."""
        from hookviz import tasks  # loads torch: only once a command runs

        return tasks.with_options(loaded, self.prompt, self.prompts_file, self.similar_to, self.embedding)


@group
@dataclass(frozen=True, kw_only=True)
class CamMaps:
    """How ``gradcam`` makes its maps beyond the layers, methods and targets."""

    normalize: NormalizeOpt = CAM.normalize
    vmax: Vmax = CAM.vmax
    fuse: FuseOpt = CAM.fuse
    sheet: SheetOpt = CAM.sheet
    probe_images: Probe = CAM.probe_images
    eigen_smooth: EigenSmooth = CAM.eigen_smooth
    aug_smooth: AugSmooth = CAM.aug_smooth
    metrics: MetricsOpt = CAM.metrics
    #: ``--channels topK``, as K (None: none, the library's 0).
    channels: TopChannels = CAM.channel_terms or None
    region: RegionOpt = CAM.region
    score_threshold: ScoreThreshold = CAM.score_threshold
    threshold: Threshold = CAM.threshold
    max_boxes: MaxBoxes = CAM.max_boxes


@group
@dataclass(frozen=True, kw_only=True)
class CamLook:
    """How ``gradcam``'s overlays look, and the raw maps."""

    alpha: Alpha = CAM.alpha
    colormap: ColormapOpt = CAM.colormap
    no_relu: NoRelu = not CAM.relu
    save_raw: SaveRaw = CAM.save_raw


def cam_settings(
    layers: list[str] | None,
    methods: list[str] | None,
    target: str,
    maps: CamMaps,
    look: CamLook,
    method: MethodFlags,
) -> CamSettings:
    """The :class:`hookviz.jobs.settings.CamSettings` of ``gradcam``'s options."""
    return CamSettings(
        layers=tuple(layers or ()), methods=tuple(methods or ()), target=target, alpha=look.alpha,
        colormap=str(look.colormap), relu=not look.no_relu, save_raw=look.save_raw,
        normalize=str(maps.normalize), vmax=maps.vmax, fuse=str(maps.fuse) if maps.fuse is not None else None,
        sheet=maps.sheet, metrics=maps.metrics, eigen_smooth=maps.eigen_smooth, aug_smooth=maps.aug_smooth,
        region=str(maps.region), probe_images=maps.probe_images, score_threshold=maps.score_threshold,
        max_boxes=maps.max_boxes, threshold=maps.threshold, channel_terms=maps.channels or 0,
        options=method.options(),
    )  # fmt: skip


def _group_of(hint: Any) -> tuple[type | None, tuple[str, ...], dict[str, str]]:
    """The option group a parameter's annotation names (None for a plain parameter), what it omits, and the
    help it tells anew."""
    left: tuple[str, ...] = ()
    helps: dict[str, str] = {}
    if typing.get_origin(hint) is Annotated:
        hint, *extras = typing.get_args(hint)
        left = tuple(name for extra in extras if isinstance(extra, omit) for name in extra.names)
        helps = {name: text for extra in extras if isinstance(extra, told) for name, text in extra.helps}
    if hint in GROUPS:
        return hint, left, helps
    return None, (), {}


def _options_of(cls: type, left: tuple[str, ...], helps: dict[str, str]) -> list[inspect.Parameter]:
    """The group's fields that are options (annotated with one), as keyword parameters in their order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    unknown = (set(left) | set(helps)) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"omit/told({', '.join(sorted(unknown))}): not fields of {cls.__name__}")
    found = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        is_option = typing.get_origin(hint) is Annotated and any(
            isinstance(a, ParameterInfo) for a in typing.get_args(hint)[1:]
        )
        if is_option and f.name in helps:
            base, *extras = typing.get_args(hint)
            info = copy.copy(next(a for a in extras if isinstance(a, ParameterInfo)))
            info.help = helps[f.name]
            hint = Annotated[base, info]
        if is_option and f.name not in left:
            default: Any = f.default
            if default is dataclasses.MISSING:  # a required option
                factory: Any = f.default_factory
                default = inspect.Parameter.empty if factory is dataclasses.MISSING else factory()
            kind = inspect.Parameter.KEYWORD_ONLY
            found.append(inspect.Parameter(f.name, kind, default=default, annotation=hint))
    return found


#: The seeds every ``--seed`` takes: what numpy's ``RandomState`` (the reference methods' draws) and torch
#: both accept.
SEEDS = (0, 2**32 - 1)


def check_seed(seed: Any) -> None:
    """Refuse a ``--seed`` outside :data:`SEEDS`, for every command (where the random streams are seeded it
    would be an internal error).

    Raises:
        UsageError: an integer seed out of range.
    """
    if isinstance(seed, int) and not SEEDS[0] <= seed <= SEEDS[1]:
        raise UsageError(f"--seed {seed}: a whole number from {SEEDS[0]} to {SEEDS[1]}")


def grouped(command: F) -> F:
    """``command`` as Typer sees it: each option group parameter replaced, in place, by the group's options;
    called, it gets the group objects back, and its errors become one line and an exit code (tracebacks with
    ``--debug``)."""
    hints = typing.get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    plan: list[tuple[str, type | None, list[str]]] = []
    for p in inspect.signature(command).parameters.values():
        cls, left, helps = _group_of(hints[p.name])
        if cls is None:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name]))
            plan.append((p.name, None, [p.name]))
            continue
        fields = _options_of(cls, left, helps)
        params += fields
        plan.append((p.name, cls, [f.name for f in fields]))
    names = [p.name for p in params]
    twice = {n for n in names if names.count(n) > 1}
    if twice:
        raise TypeError(f"{command.__name__}: options given twice: {', '.join(sorted(twice))}")

    @functools.wraps(command)
    def run(**given: Any) -> Any:
        running = RUNNING.set(command.__name__)
        try:
            with guarded(bool(given.get("debug"))):  # a library error: one line and its exit code
                check_seed(given.get("seed"))
                call = {
                    name: given[name] if cls is None else cls(**{f: given[f] for f in fields})
                    for name, cls, fields in plan
                }
                return command(**call)
        finally:
            RUNNING.reset(running)

    del run.__wrapped__  # Typer reads the signature below, not the command's
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return typing.cast(F, run)
