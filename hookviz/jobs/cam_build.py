"""Building a ``gradcam`` job of a model scoring classes (a classifier, a segmenter, a video or volume
model, a model of several inputs): the job class its target and inputs need, the layers (given, the default,
or ``--layer auto``'s choice), the method settings completed, and the notes to print, returned as data.

Example:
    >>> built = classifier_job(loaded, CamSettings(methods=("gradcam", "layercam")), probe(loaded), Top(3))
    >>> built.job.layers, built.notes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hookviz.core.conventions import declared_kind
from hookviz.core.hooks import ModuleCall
from hookviz.core.layers import candidate_layers, token_blocks
from hookviz.core.sites import Site, sites_of
from hookviz.core.targets import Labelled, Positive, Target
from hookviz.errors import UsageError
from hookviz.evaluation import choose_layer
from hookviz.jobs.build import (
    BuiltJob,
    RunContext,
    chosen_sites,
    cost_notes,
    default_layer,
    expensive,
    input_hw,
    method_options,
)
from hookviz.jobs.cam import CamJob
from hookviz.jobs.labelled import LabelledCamJob
from hookviz.jobs.settings import CamSettings
from hookviz.jobs.several import SeveralCamJob
from hookviz.methods import get
from hookviz.methods import parse as parse_methods
from hookviz.methods.attention import APPLY
from hookviz.models.loaded import LoadedModel

if TYPE_CHECKING:
    pass


def classifier_job(
    loaded: LoadedModel,
    settings: CamSettings,
    calls: list[ModuleCall],
    targets: Target,
    context: RunContext | None = None,
    *,
    job_class: type[CamJob] = CamJob,
    dense: bool = False,
) -> BuiltJob:
    """The ``gradcam`` job of a model scoring classes (a classifier; ``dense``: a segmenter, whose records
    say which pixels a class's score sums), its layers chosen, and the notes to print.

    Args:
        calls: the model's traced shapes (:func:`hookviz.models.loaded.probe`).
        targets: ``settings.target`` parsed (:func:`hookviz.models.classes.parse_targets`).
        context: what the run gives ``--layer auto``: its first readable inputs, and rank 0's choice under
            torchrun (None: no input, one process).
        job_class: :class:`CamJob`, or a subclass (a video model's).

    Raises:
        UsageError: options that do not apply, ``--layer auto`` without a readable image.
        LayerError: a bad layer.
    """
    job_class = _refused(loaded, settings, calls, targets, job_class, dense)
    notes: list[str] = []
    auto = None
    chosen: Sequence[str | Site]
    if settings.layers == ("auto",):
        context = context or RunContext()
        if (x := context.first_images(settings.probe_images)) is None:
            raise UsageError("--layer auto needs at least one readable image among the inputs")
        auto = choose_layer(loaded.model, x, candidate_layers(loaded.model, calls), list(settings.methods))
        auto = context.agree(auto)
        chosen = [auto["chosen"]]
    elif not settings.layers:
        chosen, reason = default_layer(loaded, calls)
        notes.append(f"using layer {chosen[0]} (the default for {loaded.name}: {reason}; --layer to change)")
    else:
        chosen = chosen_sites(loaded, settings.layers, calls)
    sites = sites_of(loaded.model, chosen, calls)  # each chosen layer resolved once, as the hooks take it
    options = method_options(loaded, settings.options)
    if loaded.several is not None and job_class is CamJob:  # each layer drawn over the input it sees
        job_class = SeveralCamJob
    params = dataclasses.replace(settings, layers=tuple(s.name for s in sites), options=options)
    job = job_class(loaded=loaded, params=params, targets=targets, dense=dense, auto_layer=auto, sites=sites)
    per_layer = {s.name: s.channels for s in sites}
    size = input_hw(calls)
    notes += cost_notes(job.methods, per_layer, max(1, len(job._target_suffixes())), options, size)
    return BuiltJob(job=job, notes=tuple(notes), auto=auto, slow=expensive(job.methods, options))


def _refused(
    loaded: LoadedModel,
    settings: CamSettings,
    calls: list[ModuleCall],
    targets: Target,
    job_class: type[CamJob],
    dense: bool,
) -> type[CamJob]:
    """The job class for ``targets`` (``--target label``: :class:`LabelledCamJob`), or a usage error for
    settings that do not apply to ``loaded``."""
    for name in parse_methods(settings.methods):
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
    attention = [name for name in parse_methods(settings.methods) if get(name).family == "attention"]
    if attention and not token_blocks(loaded.model, calls):
        raise UsageError(
            f"--method {attention[0]}: {loaded.name} has no transformer encoder blocks; {APPLY}; "
            "use gradcam or another CAM"
        )
    return job_class
