"""The explorer's methods panel: each registered method, and whether it applies to the model, answered
from what the registry declares of it (its family, needs, resolution, whether it explains a detector's boxes)
and what the model offers (its task, whether it is a deployed graph, its transformer blocks), in the words
``hookviz gradcam`` refuses it with, without building a job per method."""

from __future__ import annotations

import functools
from typing import Any

from hookviz import methods
from hookviz.core.hooks import ModuleCall
from hookviz.core.layers import token_blocks
from hookviz.engine.detection import detection_methods
from hookviz.errors import UsageError
from hookviz.jobs.video import VideoCamJob, video_methods
from hookviz.jobs.volume import VolumeCamJob, volume_methods
from hookviz.methods.attention import APPLY
from hookviz.models.loaded import LoadedModel
from hookviz.models.onnx import refuse_unavailable
from hookviz.tasks import task_of


def method_list(loaded: LoadedModel, calls: list[ModuleCall]) -> list[dict[str, Any]]:
    """Each registered method: its name, title, family and cost, whether ``--method all`` holds it, and
    whether it applies to ``loaded`` (``why``: the line ``hookviz gradcam`` refuses it with)."""
    cheap = set(methods.parse(["all"]))
    why = refusals(loaded, calls)
    listed = []
    for name in methods.names():
        m = methods.get(name)
        listed.append({"name": name, "title": m.title, "family": m.family, "cost": m.cost,
                       "cheap": name in cheap, "applies": name not in why,
                       "why": why.get(name, "")})  # fmt: skip
    return listed


def refusals(loaded: LoadedModel, calls: list[ModuleCall]) -> dict[str, str]:
    """The registered methods that do not apply to ``loaded``, each with the line ``make_cam_job`` refuses
    it with (checked in its order: a deployed graph's limits, a detector's methods, attention's blocks, the
    methods of a video's or a volume's layers)."""
    task = task_of(loaded)
    boxes = task.name == "detection"
    every = {n: methods.get(n) for n in methods.names()}
    families = {n: m.family for n, m in every.items() if (m.detection if boxes else not m.detection_only)}
    layered = video_methods() if issubclass(task.job_class, VideoCamJob) else None
    voxels = volume_methods() if issubclass(task.job_class, VolumeCamJob) else None
    blocks = functools.cache(lambda: bool(token_blocks(loaded.model, calls)))
    found: dict[str, str] = {}
    for name, m in every.items():
        try:
            refuse_unavailable(loaded.model, [name], families)
        except UsageError as exc:
            found[name] = str(exc)
            continue
        if boxes:
            if not m.detection:
                found[name] = (
                    f"--method {name} is not available for detectors (a masked or guided pass per box would "
                    f"have to re-find the box); use {', '.join(detection_methods())}"
                )
            continue
        if m.detection_only:
            found[name] = (
                f"--method {name} explains a detector's boxes; for a {loaded.task_name} model use rise"
            )
        elif m.family == "attention" and not blocks():
            found[name] = (
                f"--method {name}: {loaded.name} has no transformer encoder blocks; {APPLY}; "
                "use gradcam or another CAM"
            )
        elif layered is not None and name not in layered:
            found[name] = (
                f"--method {name} does not apply to a video model (it masks or differentiates the "
                f"input's pixels); use one of {', '.join(layered)}"
            )
        elif voxels is not None and name not in voxels:
            found[name] = (
                f"--method {name} does not apply to a volume model (it masks or differentiates the "
                f"input's voxels); use one of {', '.join(voxels)}"
            )
    return found
