"""Building a ``gradcam`` job is library code: which job a task gets (classifier or segmenter, detector), the
default or automatic layer, and the notes to print, returned as data; the CLI only prints them.

Example:
    >>> built = make_cam_job(loaded, CamSettings(methods=("gradcam", "layercam"), target="top3"))
    >>> built.job.layers, built.notes
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookviz.errors import UsageError
from hookviz.hooks import ModuleCall
from hookviz.jobs.cam import CamJob
from hookviz.jobs.detection import DetectionJob
from hookviz.models import LoadedModel

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
    #: ``--layer auto`` ranks the candidates on this many of the first images.
    probe_images: int = 4
    #: Detectors: the boxes explained.
    score_threshold: float = 0.5
    max_boxes: int = 10


@dataclass(frozen=True)
class BuiltJob:
    """A job ready to run, and what to tell the user about how it was built (one line each)."""

    job: CamJob | DetectionJob
    #: ``using layer ...``, the method a detector gets, Score-CAM's cost.
    notes: tuple[str, ...] = ()
    #: How ``--layer auto`` chose (its record); said even when quiet, as it is a result.
    auto: dict[str, Any] | None = None


def make_cam_job(
    loaded: LoadedModel,
    settings: CamSettings,
    *,
    calls: list[ModuleCall] | None = None,
    first_images: Callable[[int], Tensor | None] | None = None,
    agree: Callable[[Any], Any] | None = None,
) -> BuiltJob:
    """The ``gradcam`` job for ``loaded``'s task, with its layers chosen and the notes to print.

    Args:
        calls: the model's traced shapes (:func:`hookviz.models.probe`), if already at hand.
        first_images: ``first_images(n)``: the first ``n`` readable inputs as one batch (``--layer auto``).
        agree: under torchrun, rank 0's value on every rank (one ``--layer auto`` choice per job).

    Raises:
        UsageError: options that do not apply to the task, ``--layer auto`` without a readable image.
        LayerError, TargetError: a bad layer or target.
    """
    from hookviz.layers import cam_layer, channels, default_cam_layer, default_reason
    from hookviz.models import num_classes, parse_targets, probe

    calls = calls if calls is not None else probe(loaded)
    targets = parse_targets(settings.target, loaded, num_classes(loaded))
    if loaded.task == "detection":
        return _detection(loaded, settings, calls, targets)
    notes: list[str] = []
    auto = None
    if settings.layers == ("auto",):
        if first_images is None or (x := first_images(settings.probe_images)) is None:
            raise UsageError("--layer auto needs at least one readable image among the inputs")
        from hookviz.evaluation import choose_layer
        from hookviz.layers import candidate_layers

        auto = choose_layer(loaded.model, x, candidate_layers(loaded.model, calls), list(settings.methods))
        if agree is not None:
            auto = agree(auto)
        chosen = [auto["chosen"]]
    elif not settings.layers:
        chosen = [default_cam_layer(loaded.model, calls)]
        notes.append(
            f"using layer {chosen[0]} (the default for {loaded.name}: {default_reason(calls, chosen[0])}; "
            "--layer to change)"
        )
    else:
        chosen = [
            cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(settings.layers)
        ]
    s = settings
    job = CamJob(
        loaded=loaded,
        layers=chosen,
        methods=list(s.methods or ("gradcam",)),
        targets=targets,
        alpha=s.alpha,
        colormap=s.colormap,
        relu=s.relu,
        save_raw=s.save_raw,
        normalize=s.normalize,
        vmax=s.vmax,
        fuse=s.fuse,
        sheet=s.sheet,
        scorecam_batch=s.scorecam_batch,
        metrics=s.metrics,
        eigen_smooth=s.eigen_smooth,
        aug_smooth=s.aug_smooth,
        region=s.region,
    )
    job.auto_layer = auto
    notes += cost_notes(job.methods, sum(channels(loaded.model, name, calls) for name in chosen), chosen)
    return BuiltJob(job=job, notes=tuple(notes), auto=auto)


def cost_notes(names: Sequence[str], channels: int, layers: Sequence[str]) -> list[str]:
    """What the expensive methods cost per image, from the registry: a method that needs masked forward passes
    runs one per channel of the CAM tensors."""
    from hookviz.methods import get

    notes = []
    for name in names:
        spec = get(name)
        if "masked_passes" in spec.needs:
            notes.append(
                f"note: {spec.title} runs {channels:,} masked forward passes per image "
                f"(one per channel of {', '.join(layers)}); it is the slow method"
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


def _detection(
    loaded: LoadedModel, s: CamSettings, calls: list[ModuleCall], targets: str | list[int] | None
) -> BuiltJob:
    """``gradcam`` on a detector: a map per box; ``--target`` keeps only the named classes."""
    from hookviz.layers import cam_layer, default_cam_layer

    refused = {
        "--fuse": s.fuse is not None,
        "--metrics": s.metrics,
        "--aug-smooth": s.aug_smooth,
        "--normalize": s.normalize != "image",
    }
    for flag, given in refused.items():
        if given:
            raise UsageError(f"{flag} is not available for detectors (each box's map is scaled on its own)")
    if isinstance(targets, str):
        raise UsageError(f"--target {targets}: a detector explains every box it finds; name classes to keep")
    if s.layers == ("auto",):
        raise UsageError("--layer auto is not available for detectors; give --layer or use the default")
    notes = []
    if s.layers:
        chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in dict.fromkeys(s.layers)]
    else:
        chosen = [default_cam_layer(loaded.model, calls)]
        notes.append(
            f"using layer {chosen[0]} (the default for {loaded.name}: its backbone's last stage; "
            "--layer to change)"
        )
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
    )
    return BuiltJob(job=job, notes=tuple(notes))


__all__ = ["BuiltJob", "CamSettings", "auto_line", "cost_notes", "make_cam_job"]
