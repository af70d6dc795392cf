"""Building a ``gradcam`` job is library code: which job a task gets (classifier or segmenter, detector), the
default or automatic layer, and the notes to print, returned as data; the CLI only prints them.

Example:
    >>> built = make_cam_job(loaded, CamSettings(methods=("gradcam", "layercam"), target="top3"))
    >>> built.job.layers, built.notes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookviz.core.conventions import declared_kind, default_layers
from hookviz.core.hooks import ModuleCall
from hookviz.core.layers import (
    cam_layer,
    candidate_layers,
    channels,
    default_cam_layer,
    default_reason,
    is_pattern,
    map_layers,
    output_layers,
    resolve_layers,
    token_blocks,
)
from hookviz.core.targets import Labelled, Positive
from hookviz.errors import UsageError
from hookviz.evaluation import choose_layer
from hookviz.evaluation.families import parse_metrics
from hookviz.io.annotation import load as load_annotations
from hookviz.jobs.cam import CamJob
from hookviz.jobs.detection import DetectionJob
from hookviz.jobs.evaluate import EvaluateJob
from hookviz.jobs.features import FeatureMapJob
from hookviz.jobs.labelled import LabelledCamJob
from hookviz.jobs.sanity import SanityJob
from hookviz.jobs.several import SeveralCamJob
from hookviz.jobs.training import DropBlockJob, GradFlowJob
from hookviz.methods import MethodOptions, get, parse, passes
from hookviz.methods.attention import APPLY
from hookviz.models.classes import TargetSpec, parse_target, parse_targets
from hookviz.models.loaded import LoadedModel, num_classes, probe

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class CamSettings:
    """Everything ``hookviz gradcam`` takes beyond the model and the run, keyword-only.

    ``layers``: empty for the default tensor, ``("auto",)`` for ``--layer auto``; ``methods``: empty for the
    task's default (Grad-CAM; HiResCAM for a detector); ``target``: as ``--target`` (``top1``, ``top5``,
    an index, a name, a comma list).
    """

    layers: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    target: str = "top1"
    alpha: float = 0.5
    colormap: str = "jet"
    relu: bool = True
    save_raw: bool = False
    normalize: str = "image"
    vmax: float | None = None
    fuse: str | None = None
    sheet: bool | None = None
    scorecam_batch: int = 64
    metrics: bool = False
    eigen_smooth: bool = False
    aug_smooth: bool = False
    region: str = "class"
    #: ``--channels topK``: the class's map through each of the K channels that add most to its Grad-CAM.
    channel_terms: int = 0
    #: ``--layer auto`` ranks the candidates on this many of the first images.
    probe_images: int = 4
    #: Detectors: the boxes explained.
    score_threshold: float = 0.5
    #: ``--target positive``: the sigmoid a label must reach (a multi-label head).
    threshold: float = 0.5
    max_boxes: int = 10
    #: The method settings (``--seed``, ``--samples``, ...); ``compare``: Finer-CAM's classes as given
    #: (indices or names, a comma list), resolved with the model.
    options: MethodOptions = field(default_factory=MethodOptions)
    compare: str | None = None


def carried(settings: CamSettings, job_class: type) -> dict[str, Any]:
    """The settings a job of ``job_class`` takes as they are (its look, normalisation, smoothing...): every
    field of :class:`CamSettings` the job has by the same name, but those the builder decides."""
    decided = {"layers", "methods", "target", "options"}
    own = {f.name for f in dataclasses.fields(job_class)}
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name in own and f.name not in decided
    }


def method_options(loaded: LoadedModel, options: MethodOptions, compare: str | None = None) -> MethodOptions:
    """``options`` completed for ``loaded``: the input tensor of a black pixel (from its normalisation) and
    the ``--compare`` classes as indices.

    Raises:
        TargetError: an unknown class in ``compare``.
    """
    pre = loaded.preprocess
    floor = options.input_floor or tuple((0.0 - m) / s for m, s in zip(pre.mean, pre.std, strict=True))
    chosen = options.compare
    if compare:
        n = num_classes(loaded)
        found = [parse_target(part, loaded, n) for part in compare.split(",") if part.strip()]
        chosen = tuple(dict.fromkeys(i for i in found if i is not None))
    return dataclasses.replace(options, input_floor=floor, compare=chosen)


@dataclass(frozen=True)
class BuiltJob:
    """A job ready to run, and what to tell the user about how it was built (one line each)."""

    job: Any
    #: ``using layer ...``, the method a detector gets, Score-CAM's cost.
    notes: tuple[str, ...] = ()
    #: How ``--layer auto`` chose (its record); said even when quiet, as it is a result.
    auto: dict[str, Any] | None = None

    @property
    def slow(self) -> list[str]:
        """The job's methods slow enough for a progress bar of their own passes."""
        if not isinstance(self.job, (CamJob, DetectionJob)):
            return []
        return expensive(self.job.methods, self.job.options)


def _no_images(n: int) -> Tensor | None:
    return None


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class RunContext:
    """What building a job may ask of the run it is for."""

    #: ``first_images(n)``: the first ``n`` readable inputs of the whole run, preprocessed, as one batch.
    first_images: Callable[[int], Tensor | None] = _no_images
    #: ``agree(value)``: rank 0's value on every rank under torchrun (a choice made from data).
    agree: Callable[[Any], Any] = _as_is


#: A command's job for a loaded model and the run it is for: a job, or a :class:`BuiltJob` with notes.
JobFactory = Callable[[LoadedModel, RunContext], Any]


def made_by(build: Callable[..., Any], **settings: Any) -> JobFactory:
    """The job factory that calls ``build(loaded, **settings)`` (a builder that needs nothing of the run)."""

    def factory(loaded: LoadedModel, context: RunContext) -> Any:
        return build(loaded, **settings)

    return factory


def featuremap_job(
    loaded: LoadedModel,
    layers: Sequence[str] | None = None,
    *,
    stage: str = "output",
    max_channels: int = 64,
    colormap: str = "viridis",
) -> FeatureMapJob:
    """The ``featuremaps`` job: ``layers`` as names or globs (default: every Conv2d that runs)."""
    names = map_layers(loaded.model, list(layers) if layers else None, probe(loaded), loaded.name)
    return FeatureMapJob(
        loaded=loaded, layers=names, stage=stage, max_channels=max_channels, colormap=colormap
    )


def gradflow_job(
    loaded: LoadedModel,
    *,
    target: str = "top1",
    label: str | None = None,
    layers: Sequence[str] | None = None,
) -> GradFlowJob:
    """The ``gradflow`` job: the gradient of ``target``'s score, or the cross-entropy against ``label``, at
    ``layers`` (names or globs; default: every module with parameters).

    Raises:
        UsageError: ``label`` names no class; TargetError, LayerError: a bad target or layer.
    """
    n = num_classes(loaded)
    names = resolve_layers(loaded.model, list(layers), model_name=loaded.name) if layers else None
    lab = parse_target(label, loaded, n, "--label") if label is not None else None
    if label is not None and lab is None:
        raise UsageError(f"--label {label}: give a class index or name")
    return GradFlowJob(loaded=loaded, target=parse_target(target, loaded, n), label=lab, layers=names)


def dropblock_job(loaded: LoadedModel, layer: str | None = None, **fields: Any) -> DropBlockJob:
    """The ``dropblock`` job at ``layer`` (one module name; default: the CAM default), ``fields`` as
    :class:`DropBlockJob` takes them (drop_prob, block_size, shared, seed, max_channels).

    Raises:
        UsageError: a pattern for ``layer``; LayerError: a bad layer.
    """
    calls = probe(loaded)
    chosen = layer or default_cam_layer(loaded.model, calls)
    if is_pattern(chosen):
        raise UsageError(f"--layer {chosen}: takes one module name, not a pattern")
    (name,) = output_layers(loaded.model, [chosen], calls, loaded.name)
    return DropBlockJob(loaded=loaded, layer=name, **fields)


def classifier_job(
    loaded: LoadedModel,
    settings: CamSettings,
    calls: list[ModuleCall],
    targets: TargetSpec,
    *,
    first_images: Callable[[int], Tensor | None] | None = None,
    agree: Callable[[Any], Any] | None = None,
    job_class: type[CamJob] = CamJob,
    dense: bool = False,
) -> BuiltJob:
    """The ``gradcam`` job of a model scoring classes (a classifier; ``dense``: a segmenter, whose records
    say which pixels a class's score sums), its layers chosen, and the notes to print.

    Args:
        calls: the model's traced shapes (:func:`hookviz.models.loaded.probe`).
        targets: as :func:`hookviz.models.classes.parse_targets` gives them.
        first_images: ``first_images(n)``: the first ``n`` readable inputs as one batch (``--layer auto``).
        agree: under torchrun, rank 0's value on every rank (one ``--layer auto`` choice per job).
        job_class: :class:`CamJob`, or a subclass (a video model's).

    Raises:
        UsageError: options that do not apply, ``--layer auto`` without a readable image.
        LayerError: a bad layer.
    """
    for name in parse(settings.methods):
        if get(name).detection_only:
            raise UsageError(
                f"--method {name} explains a detector's boxes; for a {loaded.task_name} model use rise"
            )
    if isinstance(targets, Positive) and (dense or job_class is not CamJob):
        raise UsageError(
            f"--target positive is for a classifier's multi-label head, not a {loaded.task_name} model"
        )
    if isinstance(targets, Labelled):
        if job_class is not CamJob or loaded.several is not None:
            raise UsageError(
                f"--target label explains photos of a classifier or segmenter, not a {loaded.task_name} model"
            )
        job_class = LabelledCamJob
    if isinstance(targets, Positive) and declared_kind(loaded.model) != "sigmoid":
        raise UsageError(
            f"--target positive explains the labels of a multi-label head; {loaded.name} is read as a "
            "softmax over its classes (give --head sigmoid if its outputs are independent labels)"
        )
    attention = [name for name in parse(settings.methods) if get(name).family == "attention"]
    if attention and not token_blocks(loaded.model, calls):
        raise UsageError(
            f"--method {attention[0]}: {loaded.name} has no transformer encoder blocks; {APPLY}; "
            "use gradcam or another CAM"
        )
    notes: list[str] = []
    auto = None
    if settings.layers == ("auto",):
        if first_images is None or (x := first_images(settings.probe_images)) is None:
            raise UsageError("--layer auto needs at least one readable image among the inputs")
        auto = choose_layer(loaded.model, x, candidate_layers(loaded.model, calls), list(settings.methods))
        if agree is not None:
            auto = agree(auto)
        chosen = [auto["chosen"]]
    elif not settings.layers:
        chosen, reason = default_layer(loaded, calls)
        notes.append(f"using layer {chosen[0]} (the default for {loaded.name}: {reason}; --layer to change)")
    else:
        chosen = [
            cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(settings.layers)
        ]
    s = settings
    options = method_options(loaded, dataclasses.replace(s.options, batch=s.scorecam_batch), s.compare)
    if loaded.several is not None and job_class is CamJob:  # each layer drawn over the input it sees
        job_class = SeveralCamJob
    job = job_class(
        loaded=loaded, layers=chosen, methods=list(s.methods or ("gradcam",)), targets=targets,
        options=options, dense=dense, **carried(s, job_class),
    )  # fmt: skip
    job.auto_layer = auto
    per_layer = {name: channels(loaded.model, name, calls) for name in chosen}
    size = _input_hw(calls)
    notes += cost_notes(job.methods, per_layer, max(1, len(job._target_suffixes())), options, size)
    return BuiltJob(job=job, notes=tuple(notes), auto=auto)


#: A method running more extra forward passes per image than this gets a cost note and a progress bar.
EXPENSIVE = 16


def _input_hw(calls: Sequence[ModuleCall]) -> tuple[int, int]:
    shape = calls[0].input_shape if calls and calls[0].input_shape else None
    return (int(shape[-2]), int(shape[-1])) if shape and len(shape) == 4 else (224, 224)


def expensive(names: Sequence[str], options: MethodOptions | None = None) -> list[str]:
    """The methods among ``names`` that run more than :data:`EXPENSIVE` extra passes per image (at 512
    channels, 224 pixels)."""
    return [n for n in names if passes(n, 512, 1, options)[0] > EXPENSIVE]


def cost_notes(
    names: Sequence[str],
    channels: dict[str, int],
    targets: int = 1,
    options: MethodOptions | None = None,
    size: tuple[int, int] = (224, 224),
) -> list[str]:
    """What each expensive method costs per image, from the registry: its extra forward and backward passes
    for these layers (their channels), targets, settings and input size."""
    notes = []
    for name in names:
        spec = get(name)
        layers = list(channels) if spec.resolution == "layer" else list(channels)[:1]
        fwd = bwd = 0
        for layer in layers:
            f, b = passes(name, channels[layer], targets, options, size)
            fwd, bwd = fwd + f, bwd + b
        if fwd > EXPENSIVE:
            where = f" at {', '.join(layers)}" if spec.resolution == "layer" else ""
            back = f" and {bwd:,} backward" if bwd else ""
            notes.append(
                f"note: {spec.title} runs {fwd:,} forward{back} passes per image{where} ({spec.cost})"
            )
    return notes


def auto_line(auto: dict[str, Any]) -> str:
    """The line that says how ``--layer auto`` chose."""
    shown = ", ".join(f"{n} {v:+.3f}" for n, v in auto["scores"].items())
    signed = auto.get("signed")
    passed = f"; passed over signed {', '.join(signed)}" if signed else ""
    return (
        f"--layer auto chose {auto['chosen']} (insertion - deletion AUC of {auto['method']} "
        f"on {auto['images']} image(s): {shown}{passed})"
    )


def detection_job(
    loaded: LoadedModel, s: CamSettings, calls: list[ModuleCall], targets: TargetSpec
) -> BuiltJob:
    """``gradcam`` on a detector: a map per box; ``--target`` keeps only the named classes."""
    refused = {
        "--metrics": s.metrics,
        "--channels": bool(s.channel_terms),
        "--aug-smooth": s.aug_smooth,
        "--normalize": s.normalize != "image",
    }
    for flag, given in refused.items():
        if given:
            raise UsageError(f"{flag} is not available for detectors (each box's map is scaled on its own)")
    if isinstance(targets, (str, Positive, Labelled)):
        raise UsageError(f"--target {s.target}: a detector explains every box it finds; name classes to keep")
    if s.layers == ("auto",):
        raise UsageError("--layer auto is not available for detectors; give --layer or use the default")
    notes = []
    fuse, fused_only = s.fuse, False
    own, what = default_layers(loaded.model)  # another library's detector says (a YOLO's neck)
    if s.layers:
        chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(s.layers)]
    elif len(own) > 1:
        chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in own]
        fuse, fused_only = fuse or "mean", True
        what = what or "its default layers"
        notes.append(
            f"using the {fuse} of the maps at {', '.join(chosen)} ({what}; each scaled to [0, 1] first); "
            "--layer to see one"
        )
    else:
        chosen, reason = default_layer(loaded, calls)
        reason = reason if own else "its backbone's last stage"
        notes.append(f"using layer {chosen[0]} (the default for {loaded.name}: {reason}; --layer to change)")
    if fuse is not None and len(chosen) < 2:
        raise UsageError("--fuse combines the maps of several layers: give two or more --layer")
    if not s.methods:
        notes.append(
            "using HiResCAM for a detector (Grad-CAM averages a box's local gradient over the "
            "whole image, so its map spreads to similar objects; --method gradcam to see it)"
        )
    job = DetectionJob(
        loaded=loaded,
        layers=chosen,
        methods=list(s.methods or ("hirescam",)),
        classes=targets,
        score_threshold=s.score_threshold,
        max_boxes=s.max_boxes,
        alpha=s.alpha,
        colormap=s.colormap,
        relu=s.relu,
        save_raw=s.save_raw,
        eigen_smooth=s.eigen_smooth,
        options=dataclasses.replace(s.options, batch=min(s.scorecam_batch, 8)),
        fuse=fuse,
        fused_only=fused_only,
    )
    if "drise" in job.methods:
        notes.append(
            f"note: D-RISE runs {job.options.masks:,} detector passes per photo (--masks; the paper: 5000)"
        )
    return BuiltJob(job=job, notes=tuple(notes))


def default_layer(loaded: LoadedModel, calls: list[ModuleCall]) -> tuple[list[str], str]:
    """The default CAM layer and why: the one a model from another library names (``default_layers``: a
    Hugging Face segmenter's classifier input), else the one found from the traced shapes."""
    own, why = default_layers(loaded.model)
    if own:
        return [cam_layer(loaded.model, own[0], calls, loaded.name)], why
    chosen = default_cam_layer(loaded.model, calls)
    return [chosen], default_reason(calls, chosen)


def chosen_layers(loaded: LoadedModel, names: Sequence[str] | None, calls: list[ModuleCall]) -> list[str]:
    """The layers ``names`` (``--layer``, repeatable; checked), or the default CAM layer."""
    if not names:
        return default_layer(loaded, calls)[0]
    return [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(names)]


def evaluate_job(
    loaded: LoadedModel,
    *,
    layers: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    target: str = "top1",
    options: MethodOptions | None = None,
    compare: str | None = None,
    metric: Sequence[str] | None = None,
    boxes: Path | None = None,
    mask_dir: Path | None = None,
    mask_kind: str = "auto",
    **fields: Any,
) -> EvaluateJob:
    """The ``evaluate`` job: ``layers`` (default: the CAM default), one class per image (``target``: top1, a
    class, or ``label``: each input's own), the metric families ``metric`` as ``--metric`` names them
    (default: faithfulness, and localisation where ``boxes`` or ``mask_dir`` say where the objects are),
    ``fields`` as :class:`EvaluateJob` takes them (steps, metric_settings, seed...).

    Raises:
        UsageError: a ``topK`` target, an unknown family; LayerError, TargetError: a bad layer or class;
        AnnotationError: boxes or masks that cannot be read.
    """
    annotations = fields.pop("annotations", None)
    if boxes is not None or mask_dir is not None:
        annotations = load_annotations(boxes, mask_dir, mask_kind)
    if "metrics" not in fields:
        fields["metrics"] = parse_metrics(metric, annotated=annotations is not None)
    calls = probe(loaded)
    chosen = chosen_layers(loaded, layers, calls)
    targets = parse_targets(target, loaded, num_classes(loaded))
    if isinstance(targets, Labelled) and annotations is not None:
        raise UsageError("--target label with --boxes/--masks: the annotations name each image's classes; "
                         "leave --target out")  # fmt: skip
    if isinstance(targets, (str, Positive)):
        raise UsageError(f"--target {target}: evaluate explains one class per image: top1 or a class")
    return EvaluateJob(
        loaded=loaded,
        layers=chosen,
        methods=[str(m) for m in (methods or ["gradcam"])],
        targets=targets,
        options=method_options(loaded, options or MethodOptions(), compare),
        annotations=annotations,
        **fields,
    )


def sanity_job(
    loaded: LoadedModel,
    *,
    layer: str | None = None,
    methods: Sequence[str] | None = None,
    options: MethodOptions | None = None,
    compare: str | None = None,
    **fields: Any,
) -> SanityJob:
    """The ``sanity`` job at ``layer`` (default: the CAM default), ``fields`` as :class:`SanityJob` takes them
    (seed, order, granularity, smooth, noise)."""
    name = chosen_layers(loaded, [layer] if layer else None, probe(loaded))[0]
    return SanityJob(
        loaded=loaded,
        layer=name,
        methods=[str(m) for m in (methods or ["gradcam"])],
        options=method_options(loaded, options or MethodOptions(), compare),
        **fields,
    )
