"""What building any job may use: the job ready to run with its notes (:class:`BuiltJob`), what building may
ask of the run (:class:`RunContext`), a command's job factory, the method settings completed for a model, the
default CAM layer, and what an expensive method costs. Each job's builder sits beside its job
(:func:`hookviz.jobs.cam_build.classifier_job`, :func:`hookviz.jobs.detection.detection_job`,
:func:`hookviz.jobs.features.featuremap_job`, ...); notes are returned as data, and the CLI prints them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hookviz.core.conventions import default_layers
from hookviz.core.hooks import ModuleCall
from hookviz.core.layers import cam_layer, default_cam_layer, default_reason
from hookviz.core.sites import Site, cam_sites, sites_of
from hookviz.errors import UsageError
from hookviz.jobs.settings import CamSettings
from hookviz.methods import MethodOptions, get, passes
from hookviz.models.classes import parse_target
from hookviz.models.loaded import LoadedModel, num_classes

if TYPE_CHECKING:
    from torch import Tensor

#: ``CamSettings`` lives in :mod:`hookviz.jobs.settings`; importable from here as before.
__all__ = ["BuiltJob", "CamSettings", "JobFactory", "RunContext", "auto_line", "cost_notes", "made_by"]


def method_options(loaded: LoadedModel, options: MethodOptions) -> MethodOptions:
    """``options`` completed for ``loaded``: the input tensor of a black pixel (from its normalisation) and
    the ``compare`` classes (indices or names) as indices.

    Raises:
        TargetError: an unknown class in ``compare``.
    """
    pre = loaded.preprocess
    floor = options.input_floor or tuple((0.0 - m) / s for m, s in zip(pre.mean, pre.std, strict=True))
    chosen = options.compare
    if any(isinstance(c, str) for c in chosen):
        n = num_classes(loaded)
        found = [parse_target(c, loaded, n) for c in chosen if str(c).strip()]
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
    #: The job's methods slow enough for a progress bar of their own passes (:func:`expensive`).
    slow: list[str] = field(default_factory=list)


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


#: A method running more extra forward passes per image than this gets a cost note and a progress bar.
EXPENSIVE = 16


def input_hw(calls: Sequence[ModuleCall]) -> tuple[int, int]:
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


def default_layer(loaded: LoadedModel, calls: list[ModuleCall]) -> tuple[list[str], str]:
    """The default CAM layer and why: the one a model from another library names (``default_layers``: a
    Hugging Face segmenter's classifier input), else the one found from the traced shapes."""
    own, why = default_layers(loaded.model)
    if own:
        return [cam_layer(loaded.model, own[0], calls, loaded.name)], why
    chosen = default_cam_layer(loaded.model, calls)
    return [chosen], default_reason(calls, chosen)


def chosen_layers(loaded: LoadedModel, names: Sequence[str] | None, calls: list[ModuleCall]) -> list[str]:
    """The layers ``names`` (``--layer``: names or globs, repeatable; checked, each once), or the default
    CAM layer."""
    if not names:
        return default_layer(loaded, calls)[0]
    return [s.name for s in chosen_sites(loaded, names, calls)]


def chosen_sites(loaded: LoadedModel, names: Sequence[str] | None, calls: list[ModuleCall]) -> list[Site]:
    """:func:`chosen_layers` as sites (:mod:`hookviz.core.sites`), resolved and laid out once."""
    if not names:
        return sites_of(loaded.model, default_layer(loaded, calls)[0], calls)
    return cam_sites(loaded.model, names, calls, loaded.name)


def one_layer(loaded: LoadedModel, name: str | None, calls: list[ModuleCall]) -> str:
    """The one layer ``name`` (a module name, or a glob matching one), or the default CAM layer.

    Raises:
        UsageError: a glob matching several layers; LayerError: a bad layer.
    """
    found = chosen_layers(loaded, [name] if name else None, calls)
    if len(found) > 1:
        shown = ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
        raise UsageError(f"--layer {name}: takes one layer, and the pattern matches {len(found)} ({shown})")
    return found[0]
